"""Evaluation: `python -m eval task=<truthfulqa | mt_bench | sampling_sweep> ckpt=<checkpoint> [...]`.

    python -m eval task=truthfulqa ckpt=outputs/runs/x eval.limit=100 logger=none
    python -m eval task=mt_bench ckpt=outputs/runs/x judge=none eval.max_new_tokens=256
    python -m eval task=mt_bench ckpt=... judge=openai judge.base_url=http://127.0.0.1:8000/v1 judge.model=gpt-4o
    python -m eval task=sampling_sweep ckpt=... eval.num_samples=64

`ckpt` is a checkpoint file, a run directory (its newest checkpoint) or an HF Mixtral directory
(`python -m moe.hf export`). Configs: configs/eval.yaml, configs/task/*.yaml (the `eval.*` keys),
configs/judge/*.yaml (`judge.*`), configs/logger/*.yaml (`logger.*`, as in training). Every run
writes `<run dir>/results.json` (scores, breakdowns, standard errors, the subset, the checkpoint
and the resolved config) and, with logger=wandb, a W&B run (summary + tables).

Modules: truthfulqa (MC1/MC2, lm-evaluation-harness protocol), loglik (batched log-likelihoods),
mt_bench (generation in FastChat's answer format), judge (single-answer grading through an
OpenAI-compatible endpoint), sampling_sweep (entropy / repetition vs top-p), generation (the
engine behind a submit/poll interface, plus a no-engine fallback), config, common.
"""
