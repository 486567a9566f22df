"""`moe_lab`: an lm-evaluation-harness model (an `lm_eval.api.model.TemplateLM`) on this project's engine.

    lm = MoeLabLM(pretrained="outputs/runs/x", batch_size=16, router_top_k=1, quantization="int8")
    lm = MoeLabLM.from_loaded(model, tokenizer, parse_backend_args({...}))   # python -m eval's path

Requests are encoded as the `hf` back-end encodes them (`TemplateLM._encode_pair`, the same
prefix token for an empty context and for rolling windows), so every number is the one `hf`
computes on the model's HF export:

  * `loglikelihood` / `loglikelihood_rolling`: `eval.harness.prefix_scoring` (batched forwards,
    each distinct prefix, e.g. a question shared by its choices, run once and its K/V reused);
  * `generate_until`: all requests as one batch through `LLM.generate` (`eval.harness.generation`);
    the engine (its KV cache) is built on the first generation request only;
  * `apply_chat_template` / `chat_template` / `tokenizer_name`: for `--apply_chat_template`.

Routing overrides and quantization change the loaded model itself, so they apply to every request
type; engine options (speculative, kv_cache_dtype, block_size, ...) apply to generation.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from eval.harness.args import BackendArgs, parse_backend_args
from eval.harness.generation import (HarnessEncoder, chat_template_of, describe, render_chat, sampling_params,
                                     stop_token_ids)
from eval.harness.prefix_scoring import score_requests
from moe.engine import LLM
from moe.errors import ConfigError
from moe.loading import load_model
from moe.perf import device_defaults, resolve_device

log = logging.getLogger("moe.eval")


def _device_of(name: Any) -> torch.device:
    """The harness passes its `--device` (default cuda:0) to every back-end; like `hf`, a CUDA
    device on a machine without CUDA means "auto"."""
    if name is not None and str(name).startswith("cuda") and not torch.cuda.is_available():
        log.warning("moe_lab: device=%s but CUDA is not available here; running on the CPU", name)
        name = "auto"
    return resolve_device(str(name) if name is not None else "auto", field="model_args device")


@register_model("moe_lab")
class MoeLabLM(TemplateLM):
    def __init__(self, **model_args: Any):
        super().__init__()
        args = parse_backend_args(model_args)
        if args.pretrained is None:
            raise ConfigError("model_args pretrained=<checkpoint file | run dir | HF directory> is required")
        device = _device_of(args.engine.pop("device", None))
        dtype = device_defaults(device, args.engine.pop("dtype", None) or "auto", args.engine.get("tf32", True),
                                what="moe_lab", field="model_args dtype")
        t0 = time.perf_counter()
        model, tokenizer, _ = load_model(args.pretrained, device=device, dtype=dtype, routing=args.routing or None,
                                         quantization=args.quantization)
        log.info("moe_lab: loaded %s in %.1fs", args.pretrained, time.perf_counter() - t0)
        self._setup(model, tokenizer, args)

    @classmethod
    def from_loaded(cls, model, tokenizer, args: BackendArgs) -> "MoeLabLM":
        """The back-end over a model already loaded (routed and quantized) by the caller."""
        self = cls.__new__(cls)
        TemplateLM.__init__(self)
        args.engine.pop("device", None)
        args.engine.pop("dtype", None)
        self._setup(model, tokenizer, args)
        return self

    def _setup(self, model, tokenizer, args: BackendArgs) -> None:
        if tokenizer is None:
            raise ConfigError(f"{args.pretrained!r} has no tokenizer; the harness's tasks are text")
        self.model, self.tokenizer, self.args = model, tokenizer, args
        self.encoder = HarnessEncoder(tokenizer)
        self._device = next(model.parameters()).device
        self.max_length = args.max_length or model.cfg.max_seq_len
        if self.max_length > model.cfg.max_context:
            raise ConfigError(f"model_args max_length={self.max_length} is past the model's context "
                              f"{model.cfg.max_context} (model.max_seq_len, model.rope_scaling)")
        self.stop_ids = stop_token_ids(tokenizer, args.pretrained)
        self._engine: Optional[LLM] = None
        self.stats: dict[str, Any] = {}

    # ------------------------------------------------------------------ the harness's tokenisation
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        """As `hf`: BOS when the tokenizer has one, else EOS (the context of an empty context)."""
        bos = getattr(self.tokenizer, "bos_id", None)
        return bos if bos is not None else self.tokenizer.eos_id

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> list[int]:
        if add_special_tokens is False and self.encoder.hf is not None:
            return list(self.encoder.hf.encode(string, add_special_tokens=False))
        return self.encoder.encode(string)

    # ------------------------------------------------------------------ scoring
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        t0 = time.perf_counter()
        results, stats = score_requests(self.model, pairs, self.max_length, batch_size=self.args.batch_size,
                                        device=self._device, pad_id=self.tokenizer.pad_id or 0)
        stats["seconds"] = time.perf_counter() - t0
        log.info("moe_lab: %d log-likelihood requests in %.1fs (%d distinct prefixes; prefix tokens %d instead of %d)",
                 stats["requests"], stats["seconds"], stats["prefix_groups"], stats["prefix_tokens"],
                 stats["prefix_tokens_unshared"])
        self._add_stats("loglikelihood", stats)
        for (key, _, _), answer in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The harness's rolling windows (`get_rolling_token_windows`, context_len=1, the prefix
        token first), all documents' windows scored together, summed per document."""
        windows, owner = [], []
        for n, (string,) in enumerate(req.args for req in requests):
            tokens = self.tok_encode(string)
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(n)
        scores = self._loglikelihood_tokens(windows) if windows else []
        totals = [0.0] * len(requests)
        for n, (lp, _) in zip(owner, scores):
            totals[n] += lp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------------ generation
    @property
    def engine(self) -> LLM:
        if self._engine is None:
            self._engine = LLM.from_model(self.model, self.tokenizer, **self.args.engine)
        return self._engine

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        eos_text = self.encoder.decode([self.eot_token_id], skip_special_tokens=False)
        prompts, params, untils = [], [], []
        for context, gen_kwargs in (req.args for req in requests):
            p, max_gen_toks, until = sampling_params(gen_kwargs, eos_text, self.stop_ids, self.args.max_gen_toks,
                                                     self.args.engine.get("seed"))
            room = self.max_length - max_gen_toks
            if room <= 0:
                raise ConfigError(f"max_gen_toks={max_gen_toks} leaves no room for a prompt in max_length={self.max_length}")
            prompts.append(self.tok_encode(context)[-room:])
            params.append(p)
            untils.append(until)
        t0 = time.perf_counter()
        outputs = self.engine.generate(prompts, params) if prompts else []
        self._add_stats("generate_until", {"requests": len(prompts), "seconds": time.perf_counter() - t0,
                                           "generated_tokens": sum(len(o.token_ids) for o in outputs)})
        texts = []
        for req, out, until in zip(requests, outputs, untils):
            if out.error:
                raise RuntimeError(f"moe_lab: generation failed: {out.error}")
            text = postprocess_generated_text(self.encoder.decode(out.token_ids), stop=until, think_end_token=None)
            self.cache_hook.add_partial("generate_until", req.args, text)
            texts.append(text)
        return texts

    # ------------------------------------------------------------------ chat templates
    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return render_chat(self.tokenizer, chat_history, add_generation_prompt)

    @property
    def tokenizer_name(self) -> str:
        return "moe_lab__" + describe(self.args.pretrained or "in-memory")

    def chat_template(self, chat_template: bool | str = False) -> Optional[str]:
        if chat_template is False or chat_template is None:
            return None
        return chat_template_of(self.tokenizer)

    # ------------------------------------------------------------------ what ran
    def _add_stats(self, kind: str, stats: dict) -> None:
        total = self.stats.setdefault(kind, {})
        for k, v in stats.items():
            total[k] = total.get(k, 0) + v

    def get_model_info(self) -> dict:
        return {"model_num_parameters": self.model.num_params(), "model_dtype": str(next(self.model.parameters()).dtype),
                "pretrained": self.args.pretrained, "routing": self.args.routing, "quantization": self.args.quantization,
                "engine": {k: str(v) for k, v in self.args.engine.items()}}
