"""`task=perplexity`: token-level and byte-level perplexity of a text, with a sliding window.

The text is a local file (`eval.data_path`: a .txt file is one document; .jsonl / .json /
.parquet / .csv rows are read with `datasets`, column `eval.text_field`) or any `datasets` split
(`eval.hub_name`, `eval.hub_config`, `eval.hub_split`); documents (the first `eval.limit`) are
joined with "\\n\\n", as HF's perplexity guide joins wikitext.

Protocol: HF transformers' "perplexity of fixed-length models" loop. The whole text is encoded
once (the tokenizer's plain encode) after one start token (BOS, else EOS: the document boundary,
as lm-evaluation-harness's rolling log-likelihood starts), so every text token is scored. Windows
of `max_length` tokens start every `stride` tokens; a window scores only the tokens the previous
windows did not, with everything before them in the window as context (`stride < max_length`, so
every scored token has at least `max_length - stride` tokens of context after the first window).
    token perplexity = exp(sum NLL / tokens scored)
    byte perplexity  = exp(sum NLL / UTF-8 bytes of the text), bits per byte = sum NLL / (bytes ln 2)
(byte-level numbers compare across tokenizers; token-level ones do not).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from eval.common import SHARED_DATA, EvalError, data_path_or_default, resolve_path
from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig, positive
from moe.errors import ConfigError
from moe.report import markdown_table

log = logging.getLogger("moe.eval")

DEFAULT_TEXT = SHARED_DATA / "corpus" / "tinystories_valid_head.txt"


@dataclass
class PerplexityConfig(SubsetConfig):
    task: str = "perplexity"
    data_path: Optional[str] = None  # null = ../shared/data/corpus/tinystories_valid_head.txt (unless hub_name)
    text_field: str = "text"  # the column of .jsonl / .json / .parquet / .csv rows and of hub splits
    hub_name: Optional[str] = None  # a `datasets` name, e.g. Salesforce/wikitext (needs a network or a cache)
    hub_config: Optional[str] = None  # e.g. wikitext-2-raw-v1
    hub_split: str = "test"
    max_length: Optional[int] = None  # window length; null = the model's max_seq_len
    stride: Optional[int] = None  # tokens between window starts; null = max_length // 2
    max_tokens: Optional[int] = None  # score only the first N tokens of the text (quick runs)
    batch_size: int = 8  # windows per forward


def text_path(cfg: PerplexityConfig) -> Path:
    """The local text file (`eval.data_path`, else the shared TinyStories validation head)."""
    return data_path_or_default(
        cfg.data_path or None, DEFAULT_TEXT, "eval.data_path", "file",
        "give eval.data_path=<text file> (.txt, .jsonl, .json, .parquet, .csv) or a hub dataset "
        "(eval.hub_name=<name>, e.g. eval.hub_name=roneneldan/TinyStories eval.hub_split=validation)")


def load_text(cfg: PerplexityConfig) -> tuple[str, dict]:
    """The text (documents joined with a blank line) and where it came from."""
    if cfg.hub_name:
        import datasets  # lazy: heavy, and only a hub split needs it

        try:
            ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=cfg.hub_split)
        except Exception as e:  # noqa: BLE001 - datasets raises many kinds (network, missing config, ...)
            raise EvalError(f"eval.hub_name={cfg.hub_name!r}: {type(e).__name__}: {e}") from None
        docs, source = ds[cfg.text_field], f"hub:{cfg.hub_name}/{cfg.hub_config or ''}:{cfg.hub_split}"
    else:
        path = text_path(cfg)
        docs, source = _read_file(path, cfg.text_field), str(path)
    docs = [str(d) for d in docs][: cfg.limit]
    if not docs or not any(docs):
        raise EvalError(f"no text in {source}")
    return "\n\n".join(docs), {"source": source, "documents": len(docs), "text_field": cfg.text_field}


def _read_file(path: Path, text_field: str) -> list[str]:
    if path.suffix == ".txt":
        return [path.read_text(encoding="utf-8")]
    builders = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
    if path.suffix not in builders:
        raise EvalError(f"eval.data_path={str(path)!r}: read .txt, {sorted(builders)} files")
    import datasets  # lazy, as above

    ds = datasets.load_dataset(builders[path.suffix], data_files=str(path), split="train")
    if text_field not in ds.column_names:
        raise EvalError(f"eval.text_field={text_field!r} is not a column of {str(path)!r}: {ds.column_names}")
    return ds[text_field]


def windows(n_tokens: int, max_length: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position) of each window over `n_tokens` tokens (HF's loop:
    a window scores the tokens after the previous window's end)."""
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + max_length, n_tokens)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n_tokens:
            break
    return out


@torch.no_grad()
def sliding_nll(model, ids: list[int], max_length: int, stride: int, batch_size: int = 8,
                device=None) -> tuple[float, int, int]:
    """(sum of the NLL of ids[1:] in nats, tokens scored, windows), scored window by window."""
    device = device or next(model.parameters()).device
    spans = windows(len(ids), max_length, stride)
    total, scored = 0.0, 0
    i = 0
    while i < len(spans):  # batch consecutive windows of the same length
        length = spans[i][1] - spans[i][0]
        batch = [spans[i]]
        while i + len(batch) < len(spans) and len(batch) < batch_size and \
                spans[i + len(batch)][1] - spans[i + len(batch)][0] == length:
            batch.append(spans[i + len(batch)])
        x = torch.tensor([ids[b:e] for b, e, _ in batch], device=device)
        targets = torch.full_like(x, -100)
        for row, (b, e, first) in enumerate(batch):
            # position j predicts token b + j + 1; score the tokens from `first` on
            targets[row, first - b - 1: e - b - 1] = x[row, first - b:]
        n = int((targets != -100).sum())
        out = model(x, targets=targets, return_logits=False)
        total += float(out.lm_loss) * n
        scored += n
        i += len(batch)
    return total, scored, len(spans)


def perplexity(model, tokenizer, text: str, max_length: int, stride: int, batch_size: int = 8,
               max_tokens: Optional[int] = None, device=None) -> dict:
    """Token- and byte-level perplexity of `text` (see the module docstring)."""
    start = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if start is None:
        raise EvalError("the tokenizer has neither a BOS nor an EOS token to start the text with")
    body = tokenizer.encode(text)
    if max_tokens is not None and len(body) > max_tokens:
        body = body[:max_tokens]
        text = tokenizer.decode(body, skip_special_tokens=False)
    if not body:
        raise EvalError("the text encodes to no tokens")
    nll, n_tokens, n_windows = sliding_nll(model, [start, *body], max_length, stride, batch_size, device)
    n_bytes = len(text.encode("utf-8"))
    return {"token_perplexity": math.exp(nll / n_tokens), "nll_per_token": nll / n_tokens,
            "byte_perplexity": math.exp(nll / n_bytes), "bits_per_byte": nll / (n_bytes * math.log(2)),
            "nll_sum": nll, "tokens": n_tokens, "bytes": n_bytes, "windows": n_windows,
            "max_length": max_length, "stride": stride, "start_token": start}


def window_settings(cfg: PerplexityConfig, model) -> tuple[int, int]:
    max_length = cfg.max_length or model.cfg.max_seq_len
    stride = cfg.stride or max(1, max_length // 2)
    if stride >= max_length:
        raise ConfigError(f"eval.stride={stride} must be < the window length {max_length} (eval.max_length), so "
                        "every token after the first window is scored with context")
    return max_length, stride


def validate_perplexity(cfg: PerplexityConfig) -> None:
    positive("eval.max_length", cfg.max_length, allow_none=True)
    positive("eval.stride", cfg.stride, allow_none=True)
    positive("eval.max_tokens", cfg.max_tokens, allow_none=True)
    positive("eval.batch_size", cfg.batch_size)
    if cfg.max_length is not None and cfg.max_length < 2:
        raise ConfigError(f"eval.max_length={cfg.max_length} must be >= 2")


@EVAL_TASKS.register("perplexity")
class Perplexity(EvalTask):
    Config = PerplexityConfig

    def validate(self, cfg: PerplexityConfig) -> None:
        super().validate(cfg)
        validate_perplexity(cfg)

    def check_inputs(self, run_cfg) -> None:
        if not run_cfg.eval.hub_name:
            text_path(run_cfg.eval)

    def run(self, ctx: EvalContext) -> dict:
        t0 = time.perf_counter()
        cfg: PerplexityConfig = ctx.cfg.eval
        if ctx.tokenizer is None:
            raise EvalError("the checkpoint has no tokenizer; perplexity of a text needs one")
        text, data = load_text(cfg)
        max_length, stride = window_settings(cfg, ctx.model)
        scores = perplexity(ctx.model, ctx.tokenizer, text, max_length, stride, cfg.batch_size, cfg.max_tokens,
                            ctx.device)
        elapsed = time.perf_counter() - t0
        log.info("perplexity of %s (%d tokens, %d windows of %d, stride %d, %.1fs):\n%s", data["source"],
                 scores["tokens"], scores["windows"], max_length, stride, elapsed,
                 markdown_table(["token ppl", "byte ppl", "bits/byte"],
                                [[scores["token_perplexity"], scores["byte_perplexity"], scores["bits_per_byte"]]]))
        ctx.logger.summary({f"perplexity/{k}": v for k, v in scores.items()})
        return {"task": "perplexity", "scores": scores, "data": data, "routing": _routing(ctx.model),
                "checkpoint": ctx.checkpoint, "config": ctx.config, "timing": {"seconds": elapsed}}


def _routing(model) -> dict:
    r = model.cfg.router
    return {"top_k": r.top_k, "drop_experts": list(r.drop_experts), "renormalize": r.renormalize,
            "active_params": model.num_params(active=True), "params": model.num_params()}
