"""The moe_lab model_args: routing, quantization and engine options reach their owners; an unknown
name or a bad value is one ConfigError line (exit 2 through `python -m eval.harness_cli`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from eval.harness.args import parse_backend_args
from moe.errors import ConfigError
from tests.eval.conftest import REPO


def test_routing_quantization_and_engine_options_are_sorted_out():
    a = parse_backend_args({"pretrained": "x", "batch_size": "16", "router_top_k": 1, "router_drop_experts": "1;5",
                            "router_renormalize": False, "quantization": "int8", "quant_group_size": 64,
                            "speculative": '{"method": "ngram", "num_tokens": 3}', "block_size": 8, "device": "cpu",
                            "max_batch_size": None})
    assert a.batch_size == 16 and a.pretrained == "x"
    assert a.routing == {"top_k": 1, "drop_experts": [1, 5], "renormalize": False}
    assert a.quantization == {"scheme": "int8", "group_size": 64}
    assert a.engine == {"speculative": {"method": "ngram", "num_tokens": 3}, "block_size": 8, "device": "cpu"}
    assert parse_backend_args({"pretrained": "x", "batch_size": "auto"}).batch_size == 32


@pytest.mark.parametrize("args, message", [
    ({"pretrained": "x", "router_topk": 2}, r"unknown moe_lab model_args \['router_topk'\]"),
    ({"pretrained": "x", "router_top_k": 0}, r"router_top_k=0 must be a positive int"),
    ({"pretrained": "x", "router_drop_experts": "a;b"}, r"router_drop_experts='a;b' must be expert ids"),
    ({"pretrained": "x", "block_size": -1}, r"block_size=-1 must be a positive int"),
    ({"pretrained": "x", "speculative": "{nope"}, r"speculative='\{nope' is not a JSON object"),
])
def test_bad_model_args_are_one_config_error(args, message):
    with pytest.raises(ConfigError, match=message):
        parse_backend_args(args)


@pytest.mark.slow  # the harness's CLI indexes all its tasks first (~15 s)
def test_the_harness_cli_wrapper_answers_an_unknown_model_arg_with_one_line(harness_hf):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "eval.harness_cli", "run", "--model", "moe_lab", "--model_args",
                           f"pretrained={harness_hf},bogus=1", "--tasks", "moe_lab_mc", "--include_path",
                           str(REPO / "tests" / "eval" / "lm_eval_tasks")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: unknown moe_lab model_args ['bogus']")
