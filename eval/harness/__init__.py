"""lm-evaluation-harness on this project's engine: the `moe_lab` model (`eval.harness.model.MoeLabLM`,
registered with the harness's model registry when `eval.harness.model` is imported).

Modules: args (model_args, checked), prefix_scoring (log-likelihoods with shared prefixes run once),
generation (generate_until's sampling parameters, stop ids, chat templates), model (the `LM`),
run (task lookup with one-line errors and `simple_evaluate`, for `python -m eval task=lm_eval`),
tasks/ (harness task YAMLs over this repository's local data: TruthfulQA MC1/MC2).
The harness's own CLI with `--model moe_lab`: `python -m eval.harness_cli` (docs/guides/lm_eval.md).
"""
