"""lm-evaluation-harness tasks on the loaded checkpoint, through the `moe_lab` back-end.

    python -m eval task=lm_eval ckpt=outputs/runs/x eval.tasks=[truthfulqa_mc1_local,truthfulqa_mc2_local]
    python -m eval task=lm_eval ckpt=... eval.tasks=[arc_easy] eval.limit=100 eval.num_fewshot=5 router.top_k=1
    python -m eval task=lm_eval ckpt=... eval.include_path=[my_tasks] eval.tasks=[my_task] quant=int8

The checkpoint is loaded as for every task (`router.*` and `quant=` apply); the harness runs on
`eval.harness.model.MoeLabLM` over it (docs/guides/lm_eval.md). `eval.engine` holds engine
options for generation tasks (speculative, block_size, kv_cache_dtype, ...). results.json holds
the harness's results (per task and group, with standard errors), the configs of the tasks, the
back-end's counts and timing; `<run dir>/samples_<task>.jsonl` the per-document samples.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from eval.common import write_jsonl
from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig, positive
from moe.errors import ConfigError
from moe.report import markdown_table

log = logging.getLogger("moe.eval")


@dataclass
class LmEvalConfig(SubsetConfig):
    task: str = "lm_eval"
    tasks: list = field(default_factory=list)  # harness task / group names, e.g. [truthfulqa_mc1_local, arc_easy]
    include_path: list = field(default_factory=list)  # directories of task YAMLs (eval/harness/tasks/ always)
    include_defaults: bool = True  # index the harness's own tasks (false: only the include paths; faster)
    num_fewshot: Optional[int] = None  # null = each task's own
    apply_chat_template: bool = False  # render prompts with the tokenizer's chat template
    fewshot_as_multiturn: Optional[bool] = None  # null = apply_chat_template
    batch_size: int = 32  # log-likelihood rows per forward
    max_length: Optional[int] = None  # null = the model's max_seq_len
    max_gen_toks: int = 256  # generate_until's default when a task sets none
    engine: dict = field(default_factory=dict)  # engine options for generation (moe.engine.config.EngineConfig)
    log_samples: bool = True  # write samples_<task>.jsonl


@EVAL_TASKS.register("lm_eval")
class LmEval(EvalTask):
    Config = LmEvalConfig

    def validate(self, cfg: LmEvalConfig) -> None:
        super().validate(cfg)
        if cfg.categories or cfg.question_ids or cfg.shuffle:
            raise ConfigError("eval.categories / eval.question_ids / eval.shuffle do not apply to task=lm_eval; "
                              "the harness selects documents (eval.limit)")
        for name in ("tasks", "include_path"):
            if not isinstance(getattr(cfg, name), list):
                raise ConfigError(f"eval.{name}={getattr(cfg, name)!r} must be a list, e.g. eval.{name}=[a,b]")
        if not cfg.tasks:
            raise ConfigError("eval.tasks is empty; name harness tasks, e.g. eval.tasks=[truthfulqa_mc1_local]")
        if cfg.num_fewshot is not None and (not isinstance(cfg.num_fewshot, int) or cfg.num_fewshot < 0):
            raise ConfigError(f"eval.num_fewshot={cfg.num_fewshot!r} must be an int >= 0 or null")
        positive("eval.batch_size", cfg.batch_size)
        positive("eval.max_length", cfg.max_length, allow_none=True)
        positive("eval.max_gen_toks", cfg.max_gen_toks)
        placed = sorted(set(cfg.engine) & {"device", "dtype"})
        if placed:
            raise ConfigError(f"eval.engine.{placed[0]}: the model is loaded by python -m eval; set `{placed[0]}=` "
                              "at the top level instead")
        self.backend_args(cfg)  # an unknown engine option: a ConfigError before the model loads

    @staticmethod
    def backend_args(cfg: LmEvalConfig):
        from eval.harness.args import parse_backend_args  # lazy: the engine's options, only for this task

        return parse_backend_args({"batch_size": cfg.batch_size, "max_length": cfg.max_length,
                                   "max_gen_toks": cfg.max_gen_toks, **dict(cfg.engine)})

    def run(self, ctx: EvalContext) -> dict:
        # lazy: the harness (and its task index) loads only when this task runs
        from eval.harness.model import MoeLabLM
        from eval.harness.run import evaluate, task_manager

        t0 = time.perf_counter()
        ecfg: LmEvalConfig = ctx.cfg.eval
        args = self.backend_args(ecfg)
        args.pretrained = ctx.checkpoint.get("path")
        manager = task_manager(ecfg.include_path, ecfg.include_defaults)
        lm = MoeLabLM.from_loaded(ctx.model, ctx.tokenizer, args)
        out = evaluate(lm, [str(t) for t in ecfg.tasks], manager, limit=ecfg.limit, num_fewshot=ecfg.num_fewshot,
                       apply_chat_template=ecfg.apply_chat_template, fewshot_as_multiturn=ecfg.fewshot_as_multiturn,
                       seed=ecfg.seed, log_samples=ecfg.log_samples)
        elapsed = time.perf_counter() - t0
        scores = _scores(out["results"])
        for name, rows in (out.get("samples") or {}).items():
            write_jsonl(ctx.run_dir / f"samples_{name}.jsonl", [_jsonable(r) for r in rows])
        table = [[t, m, v, scores.get(f"{t}/{m}_stderr")] for t, metrics in _by_task(scores).items()
                 for m, v in metrics.items()]
        log.info("lm_eval (%.1fs):\n%s", elapsed, markdown_table(["task", "metric", "value", "stderr"], table))
        ctx.logger.summary({f"lm_eval/{k}": v for k, v in scores.items()} | {"lm_eval/seconds": elapsed})
        ctx.logger.table("lm_eval/results", ["task", "metric", "value", "stderr"], table)
        return {"task": "lm_eval", "scores": scores, "results": _jsonable(out["results"]),
                "groups": _jsonable(out.get("groups", {})), "n_samples": _jsonable(out.get("n-samples", {})),
                "task_configs": _jsonable(out.get("configs", {})), "versions": _jsonable(out.get("versions", {})),
                "harness": {"version": _harness_version(), "limit": ecfg.limit, "num_fewshot": ecfg.num_fewshot,
                            "apply_chat_template": ecfg.apply_chat_template},
                "backend": {"model": "moe_lab", "stats": lm.stats, **_jsonable(lm.get_model_info())},
                "checkpoint": ctx.checkpoint, "config": ctx.config, "timing": {"seconds": elapsed}}


def _scores(results: dict) -> dict:
    """{"<task>/<metric>": value} of the harness's results (`acc,none` -> `acc`; "N/A" dropped)."""
    out = {}
    for task, metrics in results.items():
        for key, value in metrics.items():
            if "," not in key or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            metric, filt = key.split(",", 1)
            out[f"{task}/{metric}" + ("" if filt == "none" else f"[{filt}]")] = float(value)
    return out


def _by_task(scores: dict) -> dict:
    tasks: dict = {}
    for key, v in scores.items():
        task, metric = key.split("/", 1)
        if not metric.endswith("_stderr"):
            tasks.setdefault(task, {})[metric] = v
    return tasks


def _jsonable(obj: Any) -> Any:
    """The harness's dicts as JSON (tuples, numpy numbers, callables in task configs become text)."""
    return json.loads(json.dumps(obj, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _harness_version() -> str:
    from importlib.metadata import version  # lazy: only for the record

    return version("lm_eval")
