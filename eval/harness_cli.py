"""`python -m eval.harness_cli ...`: the harness's own command line with the `moe_lab` model registered.

    python -m eval.harness_cli run --model moe_lab --model_args pretrained=outputs/runs/x,batch_size=16 \
        --include_path tests/eval/lm_eval_tasks --tasks moe_lab_mc --limit 10

lm-evaluation-harness 0.4.13 finds models only in its registry (`lm_eval.models.MODEL_MAPPING` plus
whatever was imported with `@register_model`): it reads no plugin entry points, and
`--include_path` loads task YAMLs only. So this wrapper imports `eval.harness.model` (which
registers `moe_lab`) and hands the arguments to `lm_eval.__main__.cli_evaluate` unchanged: every
option of `lm_eval` works as documented there. The back-end's bad input (an unknown model_arg, a
bad value, a missing checkpoint) is one line on stderr and exit 2, as in every command here.
"""

from __future__ import annotations

import sys

from lm_eval.__main__ import cli_evaluate

import eval.harness.model  # noqa: F401  (registers the `moe_lab` model with the harness)
from moe import cli
from moe.errors import UserError


def main() -> None:
    try:
        cli_evaluate()
    except UserError as e:
        cli.fail(e)


if __name__ == "__main__":
    sys.exit(main())
