"""Evaluation: `python -m eval task=<name> ckpt=<checkpoint> [router.top_k=... router.drop_experts=[...]] [...]`,
name = truthfulqa | mt_bench | sampling_sweep | perplexity | routing_ablation | expert_analysis |
structured.

    python -m eval task=truthfulqa ckpt=outputs/runs/x eval.limit=100 logger=none
    python -m eval task=mt_bench ckpt=outputs/runs/x judge=none eval.max_new_tokens=256
    python -m eval task=mt_bench ckpt=... judge=openai judge.base_url=http://127.0.0.1:8000/v1 judge.model=gpt-4o
    python -m eval task=mt_bench eval.answer_file=answers.jsonl judge=openai ...   (judging only: no ckpt)
    python -m eval task=sampling_sweep ckpt=... eval.num_samples=64
    python -m eval task=perplexity ckpt=~/models/OLMoE-1B-7B-0924 eval.max_length=2048 eval.max_tokens=50000
    python -m eval task=routing_ablation ckpt=... eval.top_ks=[1,2,4] eval.drop_experts=[[],[0]] eval.truthfulqa=true
    python -m eval task=expert_analysis ckpt=outputs/runs/x eval.max_tokens=8192 eval.compare=outputs/runs/y
    python -m eval task=structured ckpt=... eval.modes=[unconstrained,constrained]

`ckpt` is a checkpoint file, a run directory (its newest checkpoint) or an HF directory of a
supported family (mixtral, olmoe, qwen2_moe, qwen3_moe: `python -m moe.hf export`, or downloaded).
`router.top_k`, `router.drop_experts`, `router.renormalize` reroute the loaded model first. Configs: configs/eval.yaml, configs/task/*.yaml (the `eval.*` keys),
configs/judge/*.yaml (`judge.*`), configs/logger/*.yaml (`logger.*`, as in training). Every run
writes `<run dir>/results.json` (scores, breakdowns, standard errors, the subset, the checkpoint
and the resolved config) and, with logger=wandb, a W&B run (summary + tables).

Tasks are registered classes (`eval.tasks.EVAL_TASKS`, like the routers). To add one, `foo`:
  1. eval/tasks/foo.py: a dataclass `FooConfig(SubsetConfig)` with `task: str = "foo"` and its
     own fields, and `@EVAL_TASKS.register("foo") class Foo(EvalTask)` with `Config = FooConfig`,
     `validate(cfg)` (call super; ConfigError naming `eval.<field>`), `needs_model(cfg)` if it can
     run without a checkpoint, `judged = True` if judge=<name> applies, and `run(ctx) -> dict`
     (ctx: eval.tasks.EvalContext; the returned dict is written to results.json);
  2. configs/task/foo.yaml: `# @package eval` and every field of FooConfig with its default.
Nothing else: eval/tasks/__init__.py imports every module of the package, `python -m eval`
looks `task=foo` up in the registry, merges `eval.*` onto FooConfig, loads the model when
`needs_model` says so and calls `run`. tests/eval/tasks/test_base.py checks that
every task has its yaml with exactly its config's fields and defaults.

Modules: tasks/ (base: the registry, EvalTask, EvalContext, SubsetConfig; truthfulqa: MC1/MC2,
lm-evaluation-harness protocol; mt_bench: generation in FastChat's answer format and judging;
sampling_sweep: entropy / repetition vs top-p; perplexity: token / byte perplexity with a sliding
window; routing_ablation: perplexity and TruthfulQA vs active parameters over routings;
expert_analysis: what the experts learned;
structured: JSON-schema instructions with and without grammar-constrained decoding, data in
eval/data/structured.jsonl), analysis/ (expert_analysis's statistics, routing pass,
plots and report), loglik (batched log-likelihoods), judge (single-answer grading through an
OpenAI-compatible endpoint), generation (requests through the engine's own API, follow-ups joining
the running batch), config (the run config), common.
"""
