"""`task=quant_sweep`: how much each weight-quantization scheme costs one checkpoint.

    python -m eval task=quant_sweep ckpt=runs/x quant.schemes=[none,int8,fp8,int4,awq] \\
        quant.calib_path=calib.txt eval.truthfulqa=true

For every scheme of `quant.schemes` (`none` = the full-precision model, always measured first as
the reference) the checkpoint is loaded quantized (`moe.load_model(..., quantization=)`, AWQ
calibrated on `quant.calib_path`, which must not be the perplexity text), then measured:
perplexity of the text exactly as `task=perplexity` does, and its Δ to `none`; with
`eval.truthfulqa=true`, TruthfulQA MC1/MC2 and their Δ with the standard error of the paired
per-question difference; weight bytes (quantized codes + scales + zero points, and the
full-precision rest); and the engine: KV bytes per token (`eval.kv_cache_dtype`) and generation
tokens/s (wall clock and CPU time, one warm-up run then one timed run, the same for every scheme).

Outputs: results.json (a row per scheme), quant_sweep.md (the table), quant_sweep.png, W&B.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from eval.common import EvalError
from eval.figures import pyplot, save_figure
from eval.tasks import truthfulqa
from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, one_of, positive
from eval.tasks.perplexity import (PerplexityConfig, load_text, perplexity, text_path, validate_perplexity,
                                   window_settings)
from moe.engine import LLM, SamplingParams
from moe.errors import ConfigError
from moe.loading import load_model
from moe.quant import NONE, weight_bytes
from moe.report import markdown_table

log = logging.getLogger("moe.eval")


@dataclass
class QuantSweepConfig(PerplexityConfig):
    task: str = "quant_sweep"
    truthfulqa: bool = False  # also TruthfulQA MC1/MC2 for every scheme
    truthfulqa_limit: Optional[int] = None  # the first N questions (null = all 817)
    truthfulqa_data_path: Optional[str] = None  # null = ../shared/data/truthfulqa/v0
    truthfulqa_batch_size: int = 32
    kv_cache_dtype: str = "auto"  # the engine's KV cache for the throughput run: auto | fp8_e4m3
    engine_prompts: int = 8  # prompts of the throughput run (cut from the perplexity text)
    engine_prompt_tokens: int = 32
    engine_max_tokens: int = 32  # generated per prompt (greedy, eos ignored)


def paired_delta(rows: list[dict], ref_rows: list[dict], key: str) -> tuple[float, Optional[float]]:
    """Mean of the per-question differences and its standard error (n - 1 in the variance)."""
    d = [r[key] - b[key] for r, b in zip(rows, ref_rows)]
    n = len(d)
    mean = sum(d) / n
    if n < 2:
        return mean, None
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean, math.sqrt(var / n)


def engine_throughput(model, tok, prompt_ids: list[list[int]], max_tokens: int, kv_cache_dtype: str) -> dict:
    # on a copy: the engine may move or cast the model in place
    llm = LLM.from_model(copy.deepcopy(model), tok, kv_cache_dtype=kv_cache_dtype, collect_routing_stats=False,
                         max_num_seqs=len(prompt_ids), num_blocks=len(prompt_ids) * (
                             -(-(max(map(len, prompt_ids)) + max_tokens) // 16)) + 1)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompt_ids[:1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    w0, c0 = time.perf_counter(), time.process_time()
    outs = llm.generate(prompt_ids, params)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    n = sum(len(o.token_ids) for o in outs)
    stats = llm.stats()
    return {"engine_tokens": n, "engine_wall_s": wall, "engine_cpu_s": cpu, "engine_tokens_per_s": n / wall,
            "engine_tokens_per_cpu_s": n / cpu if cpu > 0 else None, "kv_cache_dtype": kv_cache_dtype,
            "kv_bytes_per_token": stats["kv_bytes_per_token"]}


def plot(rows: list[dict], path: Path, with_tqa: bool) -> Path:
    plt = pyplot()

    names = [r["scheme"] for r in rows]
    n = 3 if with_tqa else 2
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 3.8), squeeze=False)
    ax = axes[0][0]
    ax.bar(names, [r["token_perplexity"] for r in rows], color="tab:blue")
    lo = min(r["token_perplexity"] for r in rows)
    ax.set_ylim(lo * 0.98, max(r["token_perplexity"] for r in rows) * 1.01)
    ax.set_xlabel("scheme")
    ax.set_ylabel("perplexity (per token)")
    ax.set_title("perplexity by scheme", fontsize=10)
    ax = axes[0][1]
    ax.bar(names, [r["weight_bytes"] / 2**20 for r in rows], color="tab:green")
    ax.set_xlabel("scheme")
    ax.set_ylabel("weight memory (MiB)")
    ax.set_title("weights in memory", fontsize=10)
    if with_tqa:
        ax = axes[0][2]
        x = range(len(rows))
        ax.errorbar([i - 0.1 for i in x], [r["mc1"] for r in rows], yerr=[r["mc1_stderr"] or 0 for r in rows],
                    fmt="o", label="MC1", capsize=3)
        ax.errorbar([i + 0.1 for i in x], [r["mc2"] for r in rows], yerr=[r["mc2_stderr"] or 0 for r in rows],
                    fmt="s", label="MC2", capsize=3)
        ax.set_xticks(list(x), names)
        ax.set_xlabel("scheme")
        ax.set_ylabel("TruthfulQA accuracy (± s.e.)")
        ax.set_title("TruthfulQA by scheme", fontsize=10)
        ax.legend(fontsize=8)
    for a in axes[0]:
        a.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)


def sweep_specs(run_cfg) -> dict:
    """{scheme: QuantSpec} of the sweep, `none` first, every option and file checked (before any
    checkpoint is loaded: `python -m eval` calls this through `check_inputs`)."""
    cfg, q = run_cfg.eval, run_cfg.quant
    if q.scheme != NONE:
        raise ConfigError("task=quant_sweep loads every scheme itself: leave quant=none and list them in "
                          "quant.schemes=[none,int8,fp8,int4,awq]")
    schemes = [NONE] + [str(s) for s in q.schemes if str(s) != NONE]
    if len(schemes) < 2:
        raise ConfigError("quant.schemes lists no scheme to compare: e.g. quant.schemes=[none,int8,fp8,int4,awq]")
    specs = {s: q.spec(s) for s in schemes}  # an unknown scheme or a bad option: moe.quant's own ConfigError
    text = None if cfg.hub_name else text_path(cfg)
    if any(sp.enabled and sp.build().searches_scales for sp in specs.values()):  # AWQ calibrates after the load: check its file now
        if q.calib_path is None or not Path(q.calib_path).expanduser().is_file():
            raise ConfigError(f"quant.calib_path={q.calib_path!r}: quant.schemes has awq, which needs a calibration "
                              "text file (not the evaluation text)")
        if text is not None and Path(q.calib_path).expanduser().resolve() == text.resolve():
            raise ConfigError(f"quant.calib_path={q.calib_path!r} is the perplexity text: AWQ would be calibrated "
                              "on the test set; use other text")
    return specs


@EVAL_TASKS.register("quant_sweep")
class QuantSweep(EvalTask):
    Config = QuantSweepConfig

    def validate(self, cfg: QuantSweepConfig) -> None:
        super().validate(cfg)
        validate_perplexity(cfg)
        positive("eval.truthfulqa_limit", cfg.truthfulqa_limit, allow_none=True)
        for name in ("truthfulqa_batch_size", "engine_prompts", "engine_prompt_tokens", "engine_max_tokens"):
            positive(f"eval.{name}", getattr(cfg, name))
        one_of("eval.kv_cache_dtype", cfg.kv_cache_dtype, ["auto", "fp8_e4m3"])

    def check_inputs(self, run_cfg) -> None:
        sweep_specs(run_cfg)
        truthfulqa.check_added_questions(run_cfg.eval)

    def run(self, ctx: EvalContext) -> dict:
        t0 = time.perf_counter()
        cfg: QuantSweepConfig = ctx.cfg.eval
        specs = sweep_specs(ctx.cfg)
        schemes = list(specs)
        model, tok = ctx.model, ctx.tokenizer
        if tok is None:
            raise EvalError("the checkpoint has no tokenizer; perplexity of a text needs one")
        text, data = load_text(cfg)
        max_length, stride = window_settings(cfg, model)
        ids = tok.encode(text)
        L = cfg.engine_prompt_tokens
        prompts = [ids[i * L:(i + 1) * L] for i in range(cfg.engine_prompts) if len(ids) >= (i + 1) * L]
        if not prompts:
            raise EvalError(f"the text has fewer than eval.engine_prompt_tokens={L} tokens")
        tqa_cfg = docs = None
        if cfg.truthfulqa:
            tqa_cfg = truthfulqa.TruthfulQAConfig(limit=cfg.truthfulqa_limit, data_path=cfg.truthfulqa_data_path,
                                                  batch_size=cfg.truthfulqa_batch_size)
            docs = truthfulqa.select(truthfulqa.load_docs(tqa_cfg)[0], tqa_cfg)
        rows, ref, ref_q = [], None, None
        for s in schemes:
            t_load = time.perf_counter()
            if s != NONE:  # a fresh load per scheme: quantizing never touches the reference model
                model = load_model(ctx.cfg.ckpt, device=ctx.device, dtype=ctx.cfg.dtype, quantization=specs[s])[0]
            row = {"scheme": s, "quantize_s": time.perf_counter() - t_load if s != NONE else 0.0}
            row["weight_bytes"] = weight_bytes(model)["total"]
            p = perplexity(model, tok, text, max_length, stride, cfg.batch_size, cfg.max_tokens, ctx.device)
            row.update({k: p[k] for k in ("token_perplexity", "byte_perplexity", "bits_per_byte", "tokens")})
            if docs is not None:
                res = truthfulqa.evaluate(model, tok, docs, tqa_cfg, device=ctx.device)
                row.update({k: res["scores"][k] for k in ("mc1", "mc1_stderr", "mc2", "mc2_stderr")})
                if ref_q is None:
                    ref_q = res["rows"]
                for k in ("mc1", "mc2"):
                    row[f"d_{k}"], row[f"d_{k}_stderr"] = paired_delta(res["rows"], ref_q, k)
            row.update(engine_throughput(model, tok, prompts, cfg.engine_max_tokens, cfg.kv_cache_dtype))
            ref = ref or row
            row["d_token_perplexity"] = row["token_perplexity"] - ref["token_perplexity"]
            row["weight_bytes_ratio"] = row["weight_bytes"] / ref["weight_bytes"]
            log.info("quant_sweep %s: %s", s, {k: v for k, v in row.items() if k != "scheme"})
            rows.append(row)
            del model
        columns = ["scheme", "token_perplexity", "d_token_perplexity", "weight_bytes", "weight_bytes_ratio",
                   "kv_bytes_per_token", "engine_tokens_per_s", "engine_tokens_per_cpu_s"]
        if docs is not None:
            columns += ["mc1", "mc1_stderr", "d_mc1", "d_mc1_stderr", "mc2", "mc2_stderr", "d_mc2", "d_mc2_stderr"]
        table = markdown_table(columns, [[r.get(c) for c in columns] for r in rows])
        (ctx.run_dir / "quant_sweep.md").write_text(table + "\n")
        png = plot(rows, ctx.run_dir / "quant_sweep.png", docs is not None)
        log.info("quant sweep (%d schemes):\n%s", len(rows), table)
        ctx.logger.table("quant_sweep/schemes", columns, [[r.get(c) for c in columns] for r in rows])
        ctx.logger.image("quant_sweep/plot", png)
        return {"task": "quant_sweep", "rows": rows, "specs": {s: sp.as_dict() for s, sp in specs.items()},
                "data": data, "windows": {"max_length": max_length, "stride": stride},
                "engine": {"prompts": len(prompts), "prompt_tokens": L, "max_tokens": cfg.engine_max_tokens,
                           "repeats": "one warm-up, one timed run per scheme"},
                "truthfulqa": None if docs is None else {"n": len(docs), "limit": cfg.truthfulqa_limit},
                "files": {"table": "quant_sweep.md", "plot": png.name}, "checkpoint": ctx.checkpoint,
                "config": ctx.config, "timing": {"seconds": time.perf_counter() - t0}}
