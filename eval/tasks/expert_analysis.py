"""Expert-specialisation analysis: what the experts of a trained MoE learned (OLMoE-paper style).

    python -m eval task=expert_analysis ckpt=<run dir | checkpoint | HF dir> [eval.<option>=...]

One eval-mode pass over up to `eval.max_tokens` tokens of each named domain records every MoE
layer's router choices (eval/analysis/collect.py); from that one record come
  1. domain specialisation: per layer, the fraction of each domain's tokens routed to each
     expert against the uniform k/E, and a specialisation score per expert;
  2. vocabulary specialisation: per expert, the tokens it receives most often relative to their
     frequency, and the fraction of its inputs explained by its top-N token ids;
  3. co-activation (top-k > 1): how often experts i and j are chosen together, per layer;
and, on a fixed probe set (the first `eval.probe_tokens` tokens of each domain),
  4. router saturation: the top-k overlap of every checkpoint the run directory keeps (the last
     `train.keep_last`) with the analysed one, per layer, over training steps;
  5. routing agreement with `eval.compare` (another checkpoint), or with this model at
     `eval.compare_top_k` experts per token or in `eval.compare_dtype`;
  6. expert usage under generation: the engine's routing record (`LLM.stats()`) while it
     generates from prompts of each domain, against a teacher-forced forward of the same tokens.
The statistics are plain functions of routing tensors (eval/analysis/stats.py). Outputs in the
run directory: results.json, the PNGs, report.md; with logger=wandb the same figures, a table and
the summary scores. Options are `eval.*` like every task's (the issue's `analysis.*`).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from eval.analysis import plots, summary
from eval.analysis.collect import (DEFAULT_DOMAINS, PYSTDLIB, RoutingRecord, Window, collect_routing,
                                   domain_tokens, windows_of)
from eval.analysis.report import write_report
from eval.common import EvalError
from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig, positive
from moe.checkpoint import list_checkpoints
from moe.dtypes import dtype_name, resolve_dtype
from moe.engine import LLM, SamplingParams
from moe.errors import CheckpointError, ConfigError
from moe.loading import describe_checkpoint, load_model
from moe.routing.probe import moe_routers

log = logging.getLogger("moe.eval")


@dataclass
class ExpertAnalysisConfig(SubsetConfig):
    task: str = "expert_analysis"
    # {name: "pystdlib" | path of a UTF-8 text file}; null = code: pystdlib, stories and plays:
    # the shared TinyStories (validation head) and Shakespeare files (eval.common.SHARED_DATA).
    domains: Optional[dict] = None
    max_tokens: int = 16384  # per domain: the bound on the analysis's cost
    seq_len: Optional[int] = None  # window length; null = min(the model's max_seq_len, 256)
    batch_size: int = 16  # windows per forward
    top_tokens: int = 8  # tokens listed per expert
    top_n: int = 10  # "fraction of an expert's inputs explained by its top-N token ids"
    min_token_count: int = 5  # rarer tokens are not ranked (one sighting would score share 1.0)
    probe_tokens: int = 2048  # per domain: the fixed probe set of the saturation and agreement sections
    saturation: bool = True
    compare: Optional[str] = None  # another checkpoint / run dir / HF dir
    compare_top_k: Optional[int] = None  # experts per token of the compared model (null: its own)
    compare_dtype: Optional[str] = None  # dtype of the compared model (null: the run's dtype)
    generate: bool = True
    gen_prompts: int = 4  # prompts per domain
    gen_prompt_tokens: int = 32
    gen_new_tokens: int = 32
    temperature: float = 1.0  # 0 = greedy
    max_num_seqs: int = 64


@EVAL_TASKS.register("expert_analysis")
class ExpertAnalysis(EvalTask):
    Config = ExpertAnalysisConfig

    def validate(self, cfg: ExpertAnalysisConfig) -> None:
        super().validate(cfg)
        for name, default in (("limit", None), ("categories", []), ("question_ids", []), ("shuffle", False)):
            if getattr(cfg, name) != default:
                raise ConfigError(f"eval.{name} does not apply to task=expert_analysis (it reads text, not "
                                  "questions); bound its cost with eval.max_tokens")
        for name in ("max_tokens", "batch_size", "top_tokens", "top_n", "min_token_count", "probe_tokens",
                     "gen_prompts", "gen_prompt_tokens", "gen_new_tokens", "max_num_seqs"):
            _positive_int(name, getattr(cfg, name))
        for name in ("seq_len", "compare_top_k"):
            if getattr(cfg, name) is not None:
                _positive_int(name, getattr(cfg, name))
        if isinstance(cfg.temperature, bool) or not isinstance(cfg.temperature, (int, float)) or cfg.temperature < 0:
            raise ConfigError(f"eval.temperature={cfg.temperature!r} must be >= 0 (0 = greedy)")
        resolve_dtype(cfg.compare_dtype, field="eval.compare_dtype")
        if cfg.domains is not None:
            if not isinstance(cfg.domains, dict) or not cfg.domains:
                raise ConfigError(f"eval.domains={cfg.domains!r} must be a mapping name: source, e.g. "
                                  "eval.domains={code:pystdlib,plays:path/to/file.txt}, or null for the defaults")
            for name, source in cfg.domains.items():
                if not isinstance(source, str) or (source != PYSTDLIB and not Path(source).expanduser().is_file()):
                    raise ConfigError(f"eval.domains.{name}={source!r} must be '{PYSTDLIB}' or an existing text file")

    def run(self, ctx: EvalContext) -> dict:
        e: ExpertAnalysisConfig = ctx.cfg.eval
        model, tokenizer = ctx.model, ctx.tokenizer
        if tokenizer is None:
            raise EvalError("the analysis reads text, but the checkpoint has no tokenizer")
        t_start = time.perf_counter()
        sources = dict(e.domains) if e.domains else dict(DEFAULT_DOMAINS)
        names = list(sources)
        seq_len = e.seq_len or min(model.cfg.max_seq_len, 256)
        if seq_len > model.cfg.max_seq_len:
            raise EvalError(f"eval.seq_len={seq_len} exceeds the model's max_seq_len={model.cfg.max_seq_len}")
        tokens = {}
        for name in names:
            if sources[name] != PYSTDLIB and not Path(sources[name]).expanduser().is_file():
                raise EvalError(f"eval.domains.{name}={sources[name]!r} is not a file (the defaults read "
                                "../shared/data, or MOE_LAB_DATA; or give eval.domains)")
            tokens[name] = domain_tokens(sources[name], tokenizer, e.max_tokens)
            if not tokens[name]:
                raise EvalError(f"eval.domains.{name}={sources[name]!r} holds no text")
        windows = [Window(d, w) for d, name in enumerate(names) for w in windows_of(tokens[name], seq_len)]
        t0 = time.perf_counter()
        record = collect_routing(model, windows, e.batch_size, desc="routing")
        collect_s = time.perf_counter() - t0
        probe = [Window(d, w) for d, name in enumerate(names)
                 for w in windows_of(tokens[name][:e.probe_tokens], seq_len)]
        compares = e.compare is not None or e.compare_top_k is not None or e.compare_dtype is not None
        reference = collect_routing(model, probe, e.batch_size, desc="probe routing") if e.saturation or compares \
            else None
        results = {
            "task": "expert_analysis", "checkpoint": ctx.checkpoint, "config": ctx.config,
            "model": {"n_layers": model.cfg.n_layers, "moe_layers": record.layers, "n_experts": record.n_experts,
                      "top_k": record.top_k, "router": model.cfg.router.name},
            "domain_sources": sources, "seq_len": seq_len, "tokens_analysed": record.n_tokens,
            "domain_specialization": summary.domain_section(record, names),
            "vocabulary": summary.vocabulary_section(record, tokenizer, e.top_tokens, e.top_n, e.min_token_count),
            "coactivation": summary.coactivation_section(record),
            "saturation": saturation(ctx, probe, reference) if e.saturation else {"skipped": "eval.saturation=false"},
            "agreement": agreement(ctx, probe, reference) if compares else None,
            "generation": generation(ctx, names, tokens, seq_len, record) if e.generate
            else {"skipped": "eval.generate=false"},
        }
        results["plots"] = plots.plot_all(results, ctx.run_dir)
        results["timing"] = {"collect_seconds": collect_s, "total_seconds": time.perf_counter() - t_start}
        results["report"] = str(write_report(results, ctx.run_dir / "report.md"))
        log_to_wandb(ctx.logger, results)
        log.info("expert analysis: %d tokens, report %s", record.n_tokens, results["report"])
        return results


def _positive_int(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"eval.{name}={v!r} must be an int > 0")
    positive(f"eval.{name}", v)


def _step_of(path: Path) -> Optional[int]:
    m = re.search(r"step_(\d+)", Path(path).name)
    return int(m.group(1)) if m else None


def saturation(ctx: EvalContext, probe: list[Window], reference: RoutingRecord) -> dict:
    """Section 4: each checkpoint of the run (up to the analysed one) against the analysed one."""
    info = ctx.checkpoint
    if info.get("kind") != "moe-lab":
        return {"skipped": f"a {info.get('kind')} checkpoint has no run directory of training checkpoints"}
    run_dir, ref_step, ref_path = Path(info["run_dir"]), info["step"], Path(info["path"]).resolve()
    ckpts = [(_step_of(p), p) for p in list_checkpoints(run_dir)]
    ckpts = [(s, p) for s, p in ckpts if s is not None and (ref_step is None or s <= ref_step)]
    if len(ckpts) < 2:
        return {"skipped": f"{run_dir / 'checkpoints'} keeps {len(ckpts)} checkpoint(s) up to this one (a run keeps "
                           "its last train.keep_last; train with a larger keep_last to see saturation)"}
    points = []
    for step, path in tqdm(ckpts, desc="saturation", unit="ckpt", leave=False):
        if path.resolve() == ref_path:
            rec = reference
        else:
            other, _, _ = load_model(path, device=ctx.device, dtype=ctx.cfg.dtype)
            rec = collect_routing(other, probe, ctx.cfg.eval.batch_size, progress=False)
            del other
        per_layer = summary.overlap_by_layer(rec, reference)
        points.append({"step": step, "path": str(path), "overlap": [L["overlap"] for L in per_layer],
                       "exact": [L["exact"] for L in per_layer],
                       "mean_overlap": summary.mean_of([L["overlap"] for L in per_layer])})
    return {"reference_step": ref_step, "reference": str(ref_path), "run_dir": str(run_dir),
            "probe_tokens": reference.n_tokens, "layers": reference.layers, "checkpoints": points}


def agreement(ctx: EvalContext, probe: list[Window], reference: RoutingRecord) -> dict:
    """Section 5: the routing of another checkpoint (or this one at another top-k / dtype)."""
    e: ExpertAnalysisConfig = ctx.cfg.eval
    path = e.compare if e.compare is not None else ctx.cfg.ckpt
    dtype = e.compare_dtype or ctx.cfg.dtype
    try:
        other, other_tok, _ = load_model(path, device=ctx.device, dtype=dtype)
        other_info = describe_checkpoint(path)
    except CheckpointError as err:
        raise CheckpointError(f"eval.compare={path!r}: {err}") from None
    sample = ctx.tokenizer.decode(probe[0].token_ids)
    if other_tok is not None and other_tok.encode(sample) != ctx.tokenizer.encode(sample):
        raise EvalError(f"eval.compare={path!r} has another tokenizer: the same text is not the same tokens")
    routers = moe_routers(other)
    if not routers or routers[0].n_experts != reference.n_experts:
        raise EvalError(f"eval.compare={path!r} has {routers[0].n_experts if routers else 0} experts per layer, "
                        f"this model {reference.n_experts}: their expert ids cannot be compared")
    if e.compare_top_k is not None:
        if e.compare_top_k > reference.n_experts:
            raise ConfigError(f"eval.compare_top_k={e.compare_top_k} exceeds the {reference.n_experts} experts")
        for r in routers:
            r.top_k = e.compare_top_k
    rec = collect_routing(other, probe, e.batch_size, desc="compare routing")
    if e.compare_top_k is not None and rec.experts_LNK.shape[-1] != e.compare_top_k:
        raise EvalError(f"eval.compare_top_k={e.compare_top_k}: the {other.cfg.router.name} router does not route "
                        "to a changed number of experts")
    try:
        layers = summary.overlap_by_layer(rec, reference)
    except ValueError as err:
        raise EvalError(f"eval.compare={path!r}: {err}") from None
    return {"other": {"path": other_info["path"], "kind": other_info["kind"], "step": other_info.get("step"),
                      "top_k": int(rec.experts_LNK.shape[-1]), "dtype": dtype_name(next(other.parameters()).dtype)},
            "probe_tokens": reference.n_tokens, "layers": layers,
            "mean_overlap": summary.mean_of([L["overlap"] for L in layers])}


def generation(ctx: EvalContext, names: list[str], tokens: dict, seq_len: int, real: RoutingRecord) -> dict:
    """Section 6: the engine's routing record while it generates from each domain's prompts,
    against one teacher-forced forward over the same tokens."""
    e: ExpertAnalysisConfig = ctx.cfg.eval
    model = ctx.model
    if e.gen_prompt_tokens + e.gen_new_tokens > model.cfg.max_seq_len:
        raise EvalError(f"eval.gen_prompt_tokens + eval.gen_new_tokens = {e.gen_prompt_tokens + e.gen_new_tokens} "
                        f"exceeds the model's max_seq_len={model.cfg.max_seq_len}")
    prompts = {name: [w[:e.gen_prompt_tokens] for w in windows_of(tokens[name], seq_len)
                      if len(w) >= e.gen_prompt_tokens][:e.gen_prompts] for name in names}
    short = [name for name in names if not prompts[name]]
    if short:
        return {"skipped": f"domain(s) {short} have fewer than eval.gen_prompt_tokens={e.gen_prompt_tokens} tokens"}
    # No prefix caching: the engine must run (and so route) every prompt token, as the forward does.
    llm = LLM.from_model(model, ctx.tokenizer, enable_prefix_caching=False, max_num_seqs=e.max_num_seqs,
                         max_model_len=e.gen_prompt_tokens + e.gen_new_tokens, seed=e.seed, collect_routing_stats=True)
    engine_loads, forced, samples = [], [], {}
    engine = {"tokens_routed": 0, "prompt_tokens_computed": 0, "generation_tokens": 0, "preemptions": 0}
    for d, name in enumerate(tqdm(names, desc="generation", unit="domain", leave=False)):
        llm.reset_stats()
        params = [SamplingParams(max_tokens=e.gen_new_tokens, temperature=float(e.temperature), ignore_eos=True,
                                 seed=e.seed * 1_000_003 + d * 10_007 + i) for i in range(len(prompts[name]))]
        outs = llm.generate(prompts[name], params)
        failed = [o.error for o in outs if o.finish_reason == "error" or not o.token_ids]
        if failed:
            raise EvalError(f"generation failed for domain {name!r}: {failed[0] or 'no tokens'}")
        st = llm.stats()
        if "moe/expert_load" not in st:
            raise EvalError("the engine recorded no routing (collect_routing_stats)")
        engine_loads.append(st["moe/expert_load"])
        engine["prompt_tokens_computed"] += st["prompt_tokens_computed"]
        engine["generation_tokens"] += st["generation_tokens"]
        engine["preemptions"] += st["num_preemptions"]
        # The engine routes every prompt token and every generated token but the last (never fed back).
        forced += [Window(d, list(o.prompt_token_ids) + list(o.token_ids[:-1]), split=len(o.prompt_token_ids))
                   for o in outs]
        samples[name] = ctx.tokenizer.decode(outs[0].token_ids)
    engine["tokens_routed"] = engine["prompt_tokens_computed"] + engine["generation_tokens"] - len(forced)
    if engine["preemptions"]:
        log.warning("expert analysis: %d preemptions in generation (recomputed tokens count twice in the engine's "
                    "record)", engine["preemptions"])
    record = collect_routing(model, forced, e.batch_size, desc="routing (generated)")
    section = summary.generation_section(names, engine_loads, record, real)
    return {"prompts_per_domain": e.gen_prompts, "prompt_tokens": e.gen_prompt_tokens, "new_tokens": e.gen_new_tokens,
            "temperature": e.temperature, "engine": engine, "teacher_forced_tokens": record.n_tokens,
            "samples": samples, **section}


def log_to_wandb(logger, results: dict) -> None:
    """The figures, the per-layer specialisation table and the headline numbers (no-ops with logger=none)."""
    for name, path in results["plots"].items():
        logger.image(f"expert_analysis/{name}", Path(path))
    dom = results["domain_specialization"]
    logger.table("expert_analysis/specialization", ["layer", "expert", "score", "domain"],
                 [[L["layer"], ex, s, L["top_domain"][ex]] for L in dom["layers"] for ex, s in
                  enumerate(L["specialization"])])
    values = {f"expert_analysis/layer{L['layer']}/mean_specialization": L["mean_specialization"] for L in dom["layers"]}
    if results["agreement"]:
        values["expert_analysis/agreement_mean_overlap"] = results["agreement"]["mean_overlap"]
    if "skipped" not in results["generation"]:
        values["expert_analysis/generation_max_tv_engine_vs_forward"] = results["generation"][
            "max_tv_engine_vs_teacher_forced"]
    logger.summary(values)
