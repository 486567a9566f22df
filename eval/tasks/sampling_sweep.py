"""Generation diagnostics: how top-p shapes what the model writes.

For each top-p (default 0.3, 0.5, 0.7, 0.9, 0.99) at temperature 1: `num_samples` samples of
exactly `max_new_tokens` tokens (EOS ignored), unconditional (the prompt is <|eos|>, the
document boundary the model was trained on) or from `eval.prompts` in turn, each with its own
seed. Then, per top-p:
  * entropy_bits: mean over generated tokens of the entropy (bits) of the model's full
    next-token distribution at that position (softmax(logits / temperature));
  * sampled_entropy_bits: the same for the distribution actually sampled from (after the
    top-p cut, renormalised; the engine's rule: keep the tokens whose more-likely mass < p);
  * repetition_3gram: mean over samples of the fraction of a sample's token 3-grams that
    repeat an earlier 3-gram of the same sample (1 - distinct / total).
The distributions come from one teacher-forced forward over prompt + sample.
Outputs: results.json, sampling_sweep.png, samples.jsonl, and W&B (summary, table, image).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from eval.common import EvalError, mean, stderr, write_jsonl
from eval.figures import pyplot, save_figure
from eval.generation import run_requests
from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig, positive
from moe.engine import LLM, SamplingParams
from moe.errors import ConfigError
from moe.report import markdown_table

log = logging.getLogger("moe.eval")


@dataclass
class SamplingSweepConfig(SubsetConfig):
    task: str = "sampling_sweep"
    top_ps: list = field(default_factory=lambda: [0.3, 0.5, 0.7, 0.9, 0.99])
    temperature: float = 1.0
    num_samples: int = 32  # per top-p
    max_new_tokens: int = 64
    prompts: list = field(default_factory=list)  # [] = unconditional (start after <|eos|>, a document boundary)
    max_num_seqs: int = 64


def repetition_rate(tokens: Sequence[int], n: int = 3) -> float:
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def top_p_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask [.., V] of the tokens top-p keeps (mass of strictly more likely tokens < p)."""
    if top_p >= 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sp, order = probs.sort(dim=-1, descending=True)
    before = sp.cumsum(-1) - sp
    keep_sorted = before < top_p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def entropy_bits(probs: torch.Tensor) -> torch.Tensor:
    p = probs.double()
    return -(p * torch.where(p > 0, p.log2(), torch.zeros_like(p))).sum(-1)


@torch.no_grad()
def token_entropies(model, samples: Sequence[tuple[Sequence[int], Sequence[int]]], temperature: float,
                    top_p: float, batch_size: int = 32) -> list[tuple[list[float], list[float]]]:
    """For each (prompt, generated) sample, per generated token: (entropy of the full
    distribution, entropy of the top-p one), in bits. Teacher-forced, right-padded batches
    (causal attention: padding on the right changes nothing before it)."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        seqs = [list(p) + list(g)[:-1] for p, g in chunk]
        batch = torch.zeros(len(seqs), max(len(x) for x in seqs), dtype=torch.long)
        for i, x in enumerate(seqs):
            batch[i, :len(x)] = torch.tensor(x)
        logits = model(batch.to(device)).logits
        for i, (p, g) in enumerate(chunk):
            probs = torch.softmax(logits[i, len(p) - 1:len(p) - 1 + len(g)].float() / temperature, dim=-1)
            kept = probs * top_p_mask(probs, top_p)
            kept = kept / kept.sum(-1, keepdim=True)
            out.append((entropy_bits(probs).tolist(), entropy_bits(kept).tolist()))
    return out


def plot(rows: list[dict], path: Path) -> Path:
    plt = pyplot()

    ps = [r["top_p"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    axes[0].errorbar(ps, [r["entropy_bits"] for r in rows], yerr=[r["entropy_bits_stderr"] or 0 for r in rows],
                     marker="o", label="model distribution")
    axes[0].errorbar(ps, [r["sampled_entropy_bits"] for r in rows],
                     yerr=[r["sampled_entropy_bits_stderr"] or 0 for r in rows], marker="s", label="after top-p")
    axes[0].set_xlabel("top-p")
    axes[0].set_ylabel("mean per-token entropy (bits)")
    axes[0].legend(fontsize=8)
    axes[1].errorbar(ps, [r["repetition_3gram"] for r in rows], yerr=[r["repetition_3gram_stderr"] or 0 for r in rows],
                     marker="o", color="tab:red")
    axes[1].set_xlabel("top-p")
    axes[1].set_ylabel("3-gram repetition rate")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"sampling sweep (temperature {rows[0]['temperature']}, {rows[0]['num_samples']} samples x "
                 f"{rows[0]['max_new_tokens']} tokens)", fontsize=10)
    return save_figure(fig, path)


@EVAL_TASKS.register("sampling_sweep")
class SamplingSweep(EvalTask):
    Config = SamplingSweepConfig

    def validate(self, cfg: SamplingSweepConfig) -> None:
        super().validate(cfg)
        positive("eval.num_samples", cfg.num_samples)
        positive("eval.max_new_tokens", cfg.max_new_tokens)
        positive("eval.temperature", cfg.temperature)
        positive("eval.max_num_seqs", cfg.max_num_seqs)
        if not cfg.top_ps or not all(isinstance(p, (int, float)) and 0 < p <= 1 for p in cfg.top_ps):
            raise ConfigError(f"eval.top_ps={cfg.top_ps!r} must be a non-empty list of numbers in (0, 1]")

    def run(self, ctx: EvalContext) -> dict:
        e: SamplingSweepConfig = ctx.cfg.eval
        model, tokenizer, run_dir, logger = ctx.model, ctx.tokenizer, ctx.run_dir, ctx.logger
        if e.prompts:
            if tokenizer is None:
                raise EvalError("eval.prompts needs a tokenizer; the checkpoint has none")
            prompts = [tokenizer.encode(str(p)) for p in e.prompts]
        else:
            eos = getattr(tokenizer, "eos_id", None) if tokenizer is not None else None
            if eos is None:
                raise EvalError("an unconditional sweep starts after <|eos|>, but the tokenizer has no eos token; "
                                "give eval.prompts")
            prompts = [[eos]]
        if any(not p for p in prompts):
            raise EvalError("eval.prompts has a prompt that encodes to no tokens")
        max_model_len = max(len(p) for p in prompts) + e.max_new_tokens + 1
        llm = LLM.from_model(model, tokenizer, max_model_len=max(max_model_len, model.cfg.max_seq_len),
                             max_num_seqs=e.max_num_seqs, seed=e.seed)
        requests = []
        for pi, top_p in enumerate(e.top_ps):
            for i in range(e.num_samples):
                params = SamplingParams(max_tokens=e.max_new_tokens, temperature=e.temperature, top_p=float(top_p),
                                        seed=e.seed * 1_000_003 + pi * 100_003 + i, ignore_eos=True)
                requests.append(((pi, i), prompts[i % len(prompts)], params))
        t0 = time.perf_counter()
        outs = run_requests(llm, requests)
        gen_s = time.perf_counter() - t0
        rows, samples = [], []
        for pi, top_p in enumerate(e.top_ps):
            ent, ent_s, reps, lens = [], [], [], []
            for i in range(e.num_samples):
                o = outs[(pi, i)]
                if o.finish_reason == "error" or not o.token_ids:
                    raise EvalError(f"generation failed for top_p={top_p} sample {i}: {o.error or 'no tokens'}")
            entropies = token_entropies(model, [(outs[(pi, i)].prompt_token_ids, outs[(pi, i)].token_ids)
                                               for i in range(e.num_samples)], e.temperature, float(top_p))
            for i, (full, kept) in enumerate(entropies):
                o = outs[(pi, i)]
                ent += full
                ent_s += kept
                reps.append(repetition_rate(o.token_ids))
                lens.append(len(o.token_ids))
                samples.append({"top_p": top_p, "sample": i, "token_ids": o.token_ids,
                                "text": tokenizer.decode(o.token_ids) if tokenizer is not None else None,
                                "repetition_3gram": reps[-1], "mean_entropy_bits": mean(full)})
            rows.append({"top_p": float(top_p), "temperature": e.temperature, "num_samples": e.num_samples,
                         "max_new_tokens": e.max_new_tokens, "mean_length": mean(lens),
                         "entropy_bits": mean(ent), "entropy_bits_stderr": stderr(ent),
                         "sampled_entropy_bits": mean(ent_s), "sampled_entropy_bits_stderr": stderr(ent_s),
                         "repetition_3gram": mean(reps), "repetition_3gram_stderr": stderr(reps)})
        png = plot(rows, run_dir / "sampling_sweep.png")
        columns = ["top_p", "entropy_bits", "sampled_entropy_bits", "repetition_3gram", "mean_length"]
        table = [[r[c] for c in columns] for r in rows]
        log.info("sampling sweep (temperature %s, %d samples x %d tokens, %.1fs generation):\n%s", e.temperature,
                 e.num_samples, e.max_new_tokens, gen_s, markdown_table(columns, table))
        n_tokens = sum(len(o.token_ids) for o in outs.values())
        results = {"task": "sampling_sweep", "rows": rows, "plot": str(png), "checkpoint": ctx.checkpoint,
                   "config": ctx.config, "prompts": list(e.prompts) or ["<|eos|> (unconditional)"],
                   "timing": {"generation_seconds": gen_s, "generator": "engine",
                              "tokens_per_s": n_tokens / gen_s if gen_s > 0 else None}}
        write_jsonl(run_dir / "samples.jsonl", samples)
        logger.table("sampling_sweep/table", columns, table)
        logger.image("sampling_sweep/plot", png)
        logger.summary({f"sampling_sweep/top_p={r['top_p']}/{k}": r[k] for r in rows
                        for k in ("entropy_bits", "sampled_entropy_bits", "repetition_3gram")})
        if any(not math.isfinite(r["entropy_bits"]) for r in rows):
            log.warning("sampling sweep: non-finite entropies")
        return results
