"""The engine's feature-interaction matrix (issue: features that work together).

Options split in two kinds:
- **what is computed** (rows, `SETTINGS`): weight quantization (each scheme), the FP8 KV cache,
  routing overrides, the request options repetition penalty, guided decoding, stop strings
  and logprobs, and the model's architecture (Multi-head Latent Attention; sliding-window
  layers with attention sinks). A row's reference is the engine with that setting alone.
  Every model has one MTP module (`mtp_depth=1`: it only drafts, the served forward is the
  same), so the `speculative mtp` column runs on every row.
- **how it is computed** (columns, `EXECUTIONS`): speculative decoding (each method), prefix
  caching, chunked prefill, preemption, `compile=True`, n > 1 (the server submits n copies of
  the request), expert offloading (`expert_cache=`, a fast tier too small for a forward's
  experts, so it misses), and the pairs users run. None of them may change a greedy output.
  (`tensor_parallel_size` is not a column: a cell would spawn processes; its refusals are
  checked at config time in tests/engine/test_parallel_refusals.py.)

A cell works when the engine with the row's setting and the column's execution gives, for the
same greedy requests, the same tokens, text, finish reasons (and logprobs within 1e-4) as the
row's reference; it is refused when the engine or the request is refused at creation with one
message naming both options. Anything else (an error mid-generation, a different output) fails
`tests/engine/test_feature_matrix.py`. `python -m tests.engine.feature_matrix` runs every cell
and writes docs/design/feature_matrix.md's table and docs/results/feature_matrix/matrix.json.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from moe.config import ModelConfig
from moe.engine import LLM, SamplingParams
from moe.errors import ConfigError, RequestError
from moe.model import Transformer
from moe.routing.routers import router_config
from tests.conftest import with_variants

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "design" / "feature_matrix.md"
RECORD = REPO / "docs" / "results" / "feature_matrix" / "matrix.json"
PROMPTS = ["the quick brown fox jumps over the lazy dog. the quick brown", "experts route tokens; the router",
           "the quick brown fox jumps over the lazy dog. the lazy"]
MAX_TOKENS = 12
CALIB_TEXT = "the quick brown fox jumps over the lazy dog. experts route tokens; the router picks the top k. " * 20


@dataclasses.dataclass(frozen=True)
class Setting:
    """A row: engine options (`llm`), request options (`request`), and model-level options;
    `words`: how a refusal names it (a row of several options: any of them)."""
    name: str
    llm: dict = dataclasses.field(default_factory=dict)
    request: dict = dataclasses.field(default_factory=dict)
    quantization: object = None
    routing: Optional[dict] = None
    model: dict = dataclasses.field(default_factory=dict)  # a different architecture: ModelConfig fields
    words: tuple = ()


@dataclasses.dataclass(frozen=True)
class Execution:
    """A column: engine options that must not change a greedy output; `copies` > 1 submits each
    request that many times (the server's n); `min_stats` are engine counters that must have
    moved (so the option was really exercised); `words`: how a refusal names it (any of them)."""
    name: str
    llm: dict = dataclasses.field(default_factory=dict)
    request: dict = dataclasses.field(default_factory=dict)
    copies: int = 1
    min_stats: tuple = ()
    slow: bool = False
    words: tuple = ()


MODEL = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=64, max_seq_len=256,
             mtp_depth=1)  # tests/engine/conftest.py's build_model, with one MTP module
MLA = dict(attention_kind="mla", n_kv_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
           qk_rope_head_dim=8, v_head_dim=16)
# the last layer sliding: the MTP block is numbered as the last layer, so it drafts with the window
# and the sinks too; the prompts are longer than the window
WINDOW_SINKS = dict(layer_types=["full", "sliding"], sliding_window=5, attention_sinks=True)


def settings(calib_path: str) -> list[Setting]:
    return [
        Setting("plain"),
        Setting("int8", quantization="int8", words=("quantization",)),
        Setting("int4", quantization={"scheme": "int4", "group_size": 32}, words=("quantization",)),
        Setting("awq", quantization={"scheme": "awq", "group_size": 32, "calib_path": calib_path, "calib_tokens": 256},
                words=("quantization",)),
        Setting("fp8", quantization="fp8", words=("quantization",)),
        Setting("fp8_weight", quantization="fp8_weight", words=("quantization",)),
        Setting("mxfp4", quantization="mxfp4", words=("quantization",)),  # experts only, as GPT-OSS
        Setting("kv_fp8", llm={"kv_cache_dtype": "fp8_e4m3"}, words=("kv_cache_dtype",)),
        Setting("routing top_k=1", routing={"top_k": 1}, words=("top_k",)),
        Setting("repetition_penalty", request={"repetition_penalty": 1.1}),  # mild: n-gram proposals still happen
        Setting("guided", request={"guided": {"regex": r"(the |fox |dog |quick |lazy ){2,8}"}, "max_tokens": 40}),
        Setting("stop strings", request={"stop": ["the ", " o"]}),
        Setting("logprobs", request={"logprobs": 3}),
        Setting("int4 + kv_fp8", llm={"kv_cache_dtype": "fp8_e4m3"}, quantization={"scheme": "int4", "group_size": 32},
                words=("kv_cache_dtype", "quantization")),
        Setting("guided + repetition_penalty", request={"guided": {"choice": ["the lazy dog", "quick fox", "the router"]},
                                                        "repetition_penalty": 1.3}),
        Setting("guided + stop + logprobs", request={"guided": {"regex": r"[a-z ]{4,20}\."}, "stop": ["x"],
                                                     "logprobs": 2}),
        Setting("MLA model", model=MLA, words=("mla",)),
        Setting("window + sinks model", model=WINDOW_SINKS, words=("sliding",)),
        # the latent KV cache (one compressed vector and one rope key per token) stored in FP8
        Setting("MLA + kv_fp8", llm={"kv_cache_dtype": "fp8_e4m3"}, model=MLA, words=("kv_cache_dtype", "mla")),
        Setting("MLA + mxfp4", quantization="mxfp4", model=MLA, words=("quantization", "mla")),
    ]


NGRAM = {"method": "ngram", "num_tokens": 3, "prompt_lookup_min": 1}
SELF = {"method": "self", "top_k": 1, "num_tokens": 3}
MTP = {"method": "mtp", "num_tokens": 2}
CHUNKED = {"max_num_batched_tokens": 8}
# (16-token steps: a hybrid model's window group holds a whole one-step prompt's blocks too, so with one-step
# prefills its third prompt waited for room instead of being admitted and then preempted)
PREEMPT = {"block_size": 4, "num_blocks": 24, "max_num_seqs": 4, "max_num_batched_tokens": 16}
# 2 slots per MoE layer of the 4 experts, the router's top_k: every forward that routes to a third
# expert misses; lookahead also prefetches from the next layer's predicted experts
EXPERT_CACHE = {"experts_per_layer": 2, "policy": "lookahead"}


def executions(draft_model) -> list[Execution]:
    draft = {"method": "draft", "model": draft_model, "num_tokens": 3}
    return [
        Execution("speculative ngram", {"speculative": NGRAM}, min_stats=("spec_proposed",)),
        Execution("speculative draft", {"speculative": draft}, min_stats=("spec_proposed",)),
        Execution("speculative self", {"speculative": SELF}, min_stats=("spec_proposed",), words=("self",)),
        Execution("speculative mtp", {"speculative": MTP}, min_stats=("spec_proposed",), words=("mtp",)),
        Execution("prefix caching", {"enable_prefix_caching": True}, min_stats=("prefix_cache_hits",)),
        Execution("chunked prefill", CHUNKED),
        Execution("preemption", PREEMPT, min_stats=("num_preemptions",)),
        Execution("n=2", {}, copies=2),
        Execution("compile", {"compile": True}, slow=True, words=("compile",)),
        Execution("expert_cache", {"expert_cache": EXPERT_CACHE}, min_stats=("offload/misses",),
                  words=("expert_cache",)),
        Execution("ngram + chunked", {"speculative": NGRAM, **CHUNKED}, min_stats=("spec_proposed",)),
        Execution("draft + preemption", {"speculative": draft, **PREEMPT}, min_stats=("spec_proposed",)),
        Execution("self + prefix caching", {"speculative": SELF, "enable_prefix_caching": True},
                  min_stats=("spec_proposed", "prefix_cache_hits"), words=("self",)),
        Execution("prefix + chunked + preemption", {"enable_prefix_caching": True, **PREEMPT, **CHUNKED},
                  min_stats=("prefix_cache_hits",)),
        # the drafting pass routes with top_k=1 through the same offloaded experts (and feeds the
        # lookahead's predictions); MTP drafts after the served forward, preemption recomputes
        Execution("expert_cache + self + prefix caching",
                  {"expert_cache": EXPERT_CACHE, "speculative": SELF, "enable_prefix_caching": True},
                  min_stats=("offload/misses", "spec_proposed", "prefix_cache_hits"), words=("expert_cache", "self")),
        Execution("expert_cache + mtp + preemption",
                  {"expert_cache": {**EXPERT_CACHE, "policy": "lru"}, "speculative": MTP, **PREEMPT},
                  min_stats=("offload/misses", "spec_proposed", "num_preemptions"), words=("expert_cache", "mtp")),
    ]


BASE = {"collect_routing_stats": False, "enable_prefix_caching": False, "seed": 0}


def make_model(vocab_size: int, seed: int = 1, **fields) -> Transformer:
    """The matrix's model: tests/engine/conftest.py's tiny MoE with one MTP module, `fields` changing
    its architecture; attention sinks drawn away from their zero start (so they matter)."""
    torch.manual_seed(seed)
    model = Transformer(with_variants(ModelConfig(vocab_size=vocab_size, **{**MODEL, **fields}), router_config(top_k=2)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_()
    return model.eval()


def prepare(model, tokenizer, setting: Setting):
    """The row's model: a copy (or its own architecture), quantized and rerouted (once per row:
    quantization is the slow part)."""
    model = make_model(tokenizer.vocab_size, **setting.model) if setting.model else copy.deepcopy(model)
    return LLM.from_model(model, tokenizer, routing=setting.routing, quantization=setting.quantization,
                          **BASE).model


def build(prepared, tokenizer, setting: Setting, extra: dict) -> LLM:
    """An engine over a copy of the row's prepared model (an engine may change its model: rotary
    tables, the drafting pass's routing)."""
    return LLM.from_model(copy.deepcopy(prepared), tokenizer, **{**BASE, **setting.llm, **extra})


def generate(llm: LLM, setting: Setting, execution: Optional[Execution]) -> list:
    request = {"temperature": 0, "max_tokens": MAX_TOKENS, **setting.request, **(execution.request if execution else {})}
    copies = execution.copies if execution else 1
    prompts = [p for p in PROMPTS for _ in range(copies)]
    outs = llm.generate(prompts, SamplingParams(**request))
    if execution and "prefix_cache_hits" in execution.min_stats:
        outs = llm.generate(prompts, SamplingParams(**request))  # the second pass reads the cached prefixes
    return outs


def same(a, b) -> Optional[str]:
    """None when outputs `a` equal `b` (tokens, text, finish reason, logprobs within 1e-4)."""
    if (a.token_ids, a.text, a.finish_reason) != (b.token_ids, b.text, b.finish_reason):
        return f"output differs: {a.text!r} ({a.finish_reason}) vs {b.text!r} ({b.finish_reason})"
    if (a.logprobs is None) != (b.logprobs is None):
        return "logprobs present in one output only"
    for x, y in zip(a.logprobs or [], b.logprobs or []):
        if x.keys() != y.keys() or any(abs(x[t] - y[t]) > 1e-4 for t in x):
            return "logprobs differ"
    return None


def run_cell(prepared, tokenizer, setting: Setting, execution: Execution, reference: list) -> tuple[str, str]:
    """('works' | 'refused' | 'FAILS', detail). A refusal must name both options."""
    try:
        llm = build(prepared, tokenizer, setting, execution.llm)
        outs = generate(llm, setting, execution)
    except (ConfigError, RequestError) as e:
        words = setting.words + execution.words
        # a row or column of several options is named by the one that conflicts
        if not any(w in str(e) for w in setting.words) or not any(w in str(e) for w in execution.words):
            return "FAILS", f"refused without naming both options {words}: {e}"
        return "refused", str(e)
    except Exception as e:  # anything else is a failure of the cell (the test shows it)
        return "FAILS", f"{type(e).__name__}: {e}"
    stats = llm.stats()
    if any(o.finish_reason == "error" for o in outs):
        return "FAILS", next(o.error for o in outs if o.finish_reason == "error")
    ref = [r for r in reference for _ in range(execution.copies)]
    for o, r in zip(outs, ref):
        why = same(o, r)
        if why is not None:
            return "FAILS", why
    missing = [k for k in execution.min_stats if not stats.get(k)]
    if missing:
        return "FAILS", f"the option was not exercised: {missing} stayed 0"
    return "works", ""


def reference_outputs(prepared, tokenizer, setting: Setting) -> list:
    return generate(build(prepared, tokenizer, setting, {}), setting, None)


def table(results: dict, rows: list[str], cols: list[str]) -> str:
    head = "| setting \\ execution | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n"
    mark = {"works": "works", "refused": "refused", "FAILS": "**FAILS**"}
    body = "".join("| " + r + " | " + " | ".join(mark[results[(r, c)][0]] for c in cols) + " |\n" for r in rows)
    return head + body


def main() -> int:  # python -m tests.engine.feature_matrix: run every cell, write the table and the record
    import tempfile

    from moe.data import Tokenizer

    text = ("the quick brown fox jumps over the lazy dog. héllo wörld, naïve café — ✓ 日本語 テスト "
            "experts route tokens; the router picks the top k. ") * 3
    tok = Tokenizer.train([text] * 10, vocab_size=300)  # the tests' bpe_tok fixture
    torch.set_num_threads(1)
    model, draft = make_model(tok.vocab_size, seed=1), make_model(tok.vocab_size, seed=7)
    t0, load_before = time.time(), os.getloadavg()  # the machine is shared: its load goes with the time
    with tempfile.TemporaryDirectory() as d:
        calib = Path(d) / "calib.txt"
        calib.write_text(CALIB_TEXT)
        rows, cols = settings(str(calib)), executions(draft)
        results, times = {}, {}
        for s in rows:
            prepared = prepare(model, tok, s)
            ref = reference_outputs(prepared, tok, s)
            for e in cols:
                w0, c0 = time.perf_counter(), time.process_time()  # per cell: wall and this process's CPU
                results[(s.name, e.name)] = run_cell(prepared, tok, s, e, ref)
                times[(s.name, e.name)] = (time.perf_counter() - w0, time.process_time() - c0)
                print(f"{s.name:28s} x {e.name:28s} {results[(s.name, e.name)][0]} "
                      f"{times[(s.name, e.name)][0]:.1f}s", file=sys.stderr)
    rendered = table(results, [s.name for s in rows], [e.name for e in cols])
    write_doc(rendered)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps({
        "command": "python -m tests.engine.feature_matrix", "commit": commit, "seconds": round(time.time() - t0, 1),
        "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads(), "cores": os.cpu_count(),
                    "torch": torch.__version__,
                    "load_avg_1_5_15min": {"before": load_before, "after": os.getloadavg()}},
        "cells": [{"setting": r, "execution": c, "outcome": o, "detail": d, "seconds": round(times[(r, c)][0], 2),
                   "cpu_seconds": round(times[(r, c)][1], 2)} for (r, c), (o, d) in results.items()],
    }, indent=1, ensure_ascii=False) + "\n")
    return 1 if any(o == "FAILS" for o, _ in results.values()) else 0


BEGIN, END = "<!-- matrix: begin (python -m tests.engine.feature_matrix) -->\n", "<!-- matrix: end -->\n"


def doc_table() -> str:
    s = DOC.read_text()
    return s[s.index(BEGIN) + len(BEGIN):s.index(END)]


def write_doc(rendered: str) -> None:
    s = DOC.read_text()
    DOC.write_text(s[:s.index(BEGIN) + len(BEGIN)] + rendered + s[s.index(END):])


if __name__ == "__main__":
    sys.exit(main())
