"""`task=routing_ablation`: perplexity (and, when asked, TruthfulQA MC1/MC2) of one loaded model
routed several ways, without retraining, against the parameters each token uses.

The settings are every combination of `eval.top_ks` (experts per token; [] = the model's own),
`eval.drop_experts` (lists of experts removed from every router; [[]] = none) and
`eval.renormalize` ([] = the model's own; e.g. [true, false]). For each, the model is rerouted in
place (`Transformer.set_routing`), its active parameters counted (`num_params(active=True)`: the
top_k routed experts per MoE layer, shared and dense parts whole) and the text's perplexity
measured exactly as `task=perplexity` does (same text, windows and stride for every setting).
The model's own routing is restored afterwards.

Outputs: results.json (a row per setting), ablation.md (the table) and ablation.png (perplexity,
and MC1/MC2, against active parameters; each point labelled with its setting).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from eval.common import EvalError
from eval.figures import pyplot, save_figure
from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, positive
from eval.tasks.perplexity import (PerplexityConfig, load_text, perplexity, text_path, validate_perplexity,
                                   window_settings)
from eval.tasks import truthfulqa
from moe.config import validate_model
from moe.errors import ConfigError
from moe.report import markdown_table

log = logging.getLogger("moe.eval")


@dataclass
class RoutingAblationConfig(PerplexityConfig):
    task: str = "routing_ablation"
    top_ks: list = field(default_factory=list)  # [] = the model's own top_k
    drop_experts: list = field(default_factory=lambda: [[]])  # one list of expert ids per setting; [] = none
    renormalize: list = field(default_factory=list)  # [] = the model's own; e.g. [true, false]
    truthfulqa: bool = False  # also TruthfulQA MC1/MC2 for every setting
    truthfulqa_limit: Optional[int] = None  # the first N questions (null = all 817)
    truthfulqa_data_path: Optional[str] = None  # null = ../shared/data/truthfulqa/v0
    truthfulqa_batch_size: int = 32


def settings(cfg: RoutingAblationConfig, model) -> list[dict]:
    """Every (top_k, drop_experts, renormalize) of the sweep, each checked against the model."""
    r = model.cfg.router
    out = []
    for k, drop, renorm in itertools.product(cfg.top_ks or [r.top_k], cfg.drop_experts or [[]],
                                             cfg.renormalize or [r.renormalize]):
        s = {"top_k": int(k), "drop_experts": [int(e) for e in drop], "renormalize": bool(renorm)}
        try:
            validate_model(dataclasses.replace(model.cfg, router=dataclasses.replace(r, **s)))
        except ConfigError as e:
            raise ConfigError(f"routing_ablation setting {s}: {e}") from None
        out.append(s)
    return out


def label(s: dict) -> str:
    drop = ",".join(map(str, s["drop_experts"])) or "-"
    return f"k={s['top_k']} drop=[{drop}]" + ("" if s["renormalize"] else " raw")


def plot(rows: list[dict], path: Path, with_tqa: bool) -> Path:
    plt = pyplot()

    x = [r["active_params"] / 1e6 for r in rows]
    fig, axes = plt.subplots(1, 2 if with_tqa else 1, figsize=(10 if with_tqa else 5.5, 3.8), squeeze=False)
    ax = axes[0][0]
    ax.scatter(x, [r["token_perplexity"] for r in rows], color="tab:blue")
    for xi, r in zip(x, rows):
        ax.annotate(label(r), (xi, r["token_perplexity"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("active parameters per token (M)")
    ax.set_ylabel("perplexity (per token)")
    ax.set_title("perplexity vs active parameters", fontsize=10)
    if with_tqa:
        ax = axes[0][1]
        ax.scatter(x, [r["mc1"] for r in rows], marker="o", label="MC1")
        ax.scatter(x, [r["mc2"] for r in rows], marker="s", label="MC2")
        ax.set_xlabel("active parameters per token (M)")
        ax.set_ylabel("TruthfulQA accuracy")
        ax.set_title("TruthfulQA vs active parameters", fontsize=10)
        ax.legend(fontsize=8)
    for a in axes[0]:
        a.grid(alpha=0.3)
    return save_figure(fig, path)


@EVAL_TASKS.register("routing_ablation")
class RoutingAblation(EvalTask):
    Config = RoutingAblationConfig

    def validate(self, cfg: RoutingAblationConfig) -> None:
        super().validate(cfg)
        validate_perplexity(cfg)
        for k in cfg.top_ks:
            positive("eval.top_ks[]", k)
        if not all(isinstance(d, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in d)
                   for d in cfg.drop_experts):
            raise ConfigError(f"eval.drop_experts={cfg.drop_experts!r} must be a list of lists of expert ids, "
                              "e.g. [[],[0],[0,1]]")
        if not all(isinstance(b, bool) for b in cfg.renormalize):
            raise ConfigError(f"eval.renormalize={cfg.renormalize!r} must be a list of true/false")
        positive("eval.truthfulqa_limit", cfg.truthfulqa_limit, allow_none=True)
        positive("eval.truthfulqa_batch_size", cfg.truthfulqa_batch_size)

    def check_inputs(self, run_cfg) -> None:
        if not run_cfg.eval.hub_name:
            text_path(run_cfg.eval)
        truthfulqa.check_added_questions(run_cfg.eval)

    def run(self, ctx: EvalContext) -> dict:
        t0 = time.perf_counter()
        cfg: RoutingAblationConfig = ctx.cfg.eval
        model, tok = ctx.model, ctx.tokenizer
        if tok is None:
            raise EvalError("the checkpoint has no tokenizer; perplexity of a text needs one")
        sweep = settings(cfg, model)
        text, data = load_text(cfg)
        max_length, stride = window_settings(cfg, model)
        tqa_cfg = docs = None
        if cfg.truthfulqa:
            tqa_cfg = truthfulqa.TruthfulQAConfig(limit=cfg.truthfulqa_limit, data_path=cfg.truthfulqa_data_path,
                                                  batch_size=cfg.truthfulqa_batch_size)
            docs = truthfulqa.select(truthfulqa.load_docs(tqa_cfg)[0], tqa_cfg)
        r = model.cfg.router
        own = {"top_k": r.top_k, "drop_experts": list(r.drop_experts), "renormalize": r.renormalize}
        rows = []
        try:
            for s in sweep:
                model.set_routing(**s)
                row = {**s, "active_params": model.num_params(active=True)}
                p = perplexity(model, tok, text, max_length, stride, cfg.batch_size, cfg.max_tokens, ctx.device)
                row.update({k: p[k] for k in ("token_perplexity", "byte_perplexity", "bits_per_byte", "tokens")})
                if docs is not None:
                    row.update(truthfulqa.evaluate(model, tok, docs, tqa_cfg, device=ctx.device)["scores"])
                log.info("routing_ablation %s: %s", label(s), {k: v for k, v in row.items() if k not in s})
                rows.append(row)
        finally:
            model.set_routing(**own)
        columns = ["top_k", "drop_experts", "renormalize", "active_params", "token_perplexity", "byte_perplexity",
                   "bits_per_byte"] + (["mc1", "mc2"] if docs is not None else [])
        table = markdown_table(columns, [[r[c] for c in columns] for r in rows])
        (ctx.run_dir / "ablation.md").write_text(table + "\n")
        png = plot(rows, ctx.run_dir / "ablation.png", docs is not None)
        log.info("routing ablation (%d settings):\n%s", len(rows), table)
        ctx.logger.table("routing_ablation/settings", columns, [[r[c] for c in columns] for r in rows])
        ctx.logger.image("routing_ablation/plot", png)
        return {"task": "routing_ablation", "rows": rows, "model_routing": own, "data": data,
                "windows": {"max_length": max_length, "stride": stride},
                "truthfulqa": None if docs is None else {"n": len(docs), "limit": cfg.truthfulqa_limit},
                "files": {"table": "ablation.md", "plot": png.name}, "checkpoint": ctx.checkpoint,
                "config": ctx.config, "timing": {"seconds": time.perf_counter() - t0}}
