"""`generate_until` on the engine, with the harness's `hf` semantics, and the chat template.

The `hf` back-end (lm_eval/models/huggingface.py, 0.4.13): the context is encoded as `tok_encode`
does and left-truncated to `max_length - max_gen_toks`; greedy unless the request samples; it
stops at the model's end tokens (the HF export's `generation_config.json`: eos and `<|end|>`),
at a stop string or after `max_gen_toks`; the new tokens are decoded without special tokens and
cut at the first stop string (`postprocess_generated_text`, the EOS text included in `until`).
Here the same requests run as one batch through `LLM.generate` (continuous batching, the
engine's prefix cache, speculative decoding if configured): the engine stops on the same strings
and ids, and its tokens are decoded and cut the same way, so greedy generations are identical.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from moe.data.tokenizer import CHAT_TEMPLATE
from moe.engine import SamplingParams

END_OF_TURN = "<|end|>"  # moe-lab's end of a chat turn: an end token of its HF export (generation_config.json)


class HarnessEncoder:
    """`tok_encode` as the harness's hf back-end calls a transformers tokenizer (`add_bos_token`
    unset): `tokenizer.encode(text)` with the tokenizer's own special-token default. A moe-lab
    tokenizer adds nothing; a foreign one (`moe.hf.io.HFTokenizer`) keeps e.g. a Llama BOS."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.hf = getattr(tokenizer, "tok", None)  # the transformers tokenizer of an HFTokenizer

    def encode(self, text: str) -> list[int]:
        if self.hf is not None and hasattr(self.hf, "encode"):
            return list(self.hf.encode(text))
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def stop_token_ids(tokenizer, pretrained: Optional[str]) -> list[int]:
    """The ids greedy generation stops at, as HF's `generate` on the same model: an HF
    directory's `generation_config.json` eos ids, else (a moe-lab checkpoint, exported with
    them) the tokenizer's eos and `<|end|>`."""
    ids: list[int] = []
    config = Path(str(pretrained)) / "generation_config.json" if pretrained else None
    if config is not None and config.is_file():
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token_id")
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    else:
        end = (getattr(tokenizer, "special_ids", None) or {}).get(END_OF_TURN)
        ids = [i for i in (getattr(tokenizer, "eos_id", None), end) if i is not None]
    return sorted(set(ids))


def sampling_params(gen_kwargs: dict, eos_text: str, stop_ids: list[int], default_max_gen_toks: int,
                    seed: Optional[int]) -> tuple[SamplingParams, int, list[str]]:
    """The engine's SamplingParams of one request's generation kwargs (normalised as `hf` does),
    its max_gen_toks, and its stop strings (`until` plus the EOS text, as `hf`)."""
    # lazy: the harness is imported only where the back-end runs
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

    kw = normalize_gen_kwargs(dict(gen_kwargs), default_max_gen_toks)
    until = handle_stop_sequences(kw.pop("until", None), eos=eos_text)
    max_gen_toks = int(kw.pop("max_gen_toks"))
    do_sample = bool(kw.pop("do_sample", False))
    temperature = float(kw.pop("temperature", 0.0))
    extra = {k: kw.pop(k) for k in ("top_p", "top_k", "repetition_penalty", "seed") if k in kw}
    if kw:
        raise ValueError(f"generation kwargs {sorted(kw)} are not supported by the moe_lab back-end; supported: "
                         "until, max_gen_toks, do_sample, temperature, top_p, top_k, repetition_penalty, seed")
    extra.setdefault("seed", seed)
    params = SamplingParams(temperature=temperature if do_sample else 0.0, max_tokens=max_gen_toks,
                            stop=[s for s in until if s] or None, stop_token_ids=stop_ids or None, **extra)
    return params, max_gen_toks, until


def render_chat(tokenizer, chat_history: list[dict], add_generation_prompt: bool) -> str:
    """The harness's `apply_chat_template`: the conversation rendered as text; without a
    generation prompt the last (assistant) message is left open, as transformers'
    `continue_final_message=True` does."""
    hf = getattr(tokenizer, "tok", None)
    if hf is not None:
        return hf.apply_chat_template(list(chat_history), tokenize=False, add_generation_prompt=add_generation_prompt,
                                      continue_final_message=not add_generation_prompt)
    text = tokenizer.apply_chat_template(list(chat_history), add_generation_prompt=add_generation_prompt)
    if not add_generation_prompt and chat_history:
        final = str(chat_history[-1]["content"]).strip()
        text = text[:text.rindex(final) + len(final)]  # what continue_final_message keeps
    return text


def chat_template_of(tokenizer) -> Optional[str]:
    hf = getattr(tokenizer, "tok", None)
    if hf is not None:
        return getattr(hf, "chat_template", None)
    return CHAT_TEMPLATE  # the moe-lab tokenizer's one template


def describe(value: Any) -> str:
    return str(value).replace("/", "__")
