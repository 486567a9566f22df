"""`python -m benchmarks.serving --sweep ...` (sweep.py and the sweep loop of cli.py): the sweep
settings and their server arguments, the CLI's errors, and a tiny sweep (two settings x two
levels) against in-process servers writing the frontier files."""

from __future__ import annotations

import contextlib
import json

import pytest

from benchmarks import serving as bench
from tests.serve_fixtures import API_KEY, MODEL_NAME, ServerThread

pytestmark = pytest.mark.timeout(180)


def test_sweep_settings_and_server_arguments():
    settings = bench.parse_sweeps(["max_num_seqs=32,64", "max-num-batched-tokens=512,2048", "no_prefix_caching=true"])
    assert settings == [{"max_num_seqs": a, "max_num_batched_tokens": b, "no_prefix_caching": "true"}
                        for a in ("32", "64") for b in ("512", "2048")]
    assert bench.server_args("--max-num-seqs 256 --threads 1 --no-prefix-caching", settings[1]) == \
        "--threads 1 --max-num-seqs 32 --max-num-batched-tokens 2048 --no-prefix-caching"
    assert bench.server_args("--block-size=32 --seed 3", {"block_size": "16", "no_prefix_caching": "false"}) == \
        "--seed 3 --block-size 16"
    for bad, message in (["max_num_seqs"], "expected NAME=V1,V2"), (["port=1,2"], "'port' is not a server option"), \
            (["max_num_seqs=8,x"], "'x' is not a valid int"), (["no_prefix_caching=maybe"], "true or false"), \
            (["block_size=16", "block-size=32"], "swept twice"):
        with pytest.raises(bench.SweepError, match=message):
            bench.parse_sweeps(bad)


def test_sweep_cli_errors(tmp_path, capsys):
    assert bench.main(["--sweep", "max_num_seqs=8", "--out-dir", str(tmp_path)]) == 2
    assert "--sweep needs --launch" in capsys.readouterr().err
    assert bench.main(["--sweep", "nope=1", "--launch", "x", "--out-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: --sweep 'nope=1'")


@pytest.mark.slow
def test_tiny_sweep_two_settings_two_levels(tiny_model, tok, tmp_path):
    """The real loop (launch, warm-up, levels, frontier files) with in-process servers standing
    in for `python -m moe.serve` launches (the same app, without a process start per setting)."""
    from moe.engine import LLM
    from moe.serve import create_app

    launched = []

    @contextlib.contextmanager
    def launch(args, setting, log_path):
        opts = {k: int(v) for k, v in setting.items()}
        launched.append(opts)
        llm = LLM.from_model(tiny_model, tok, seed=0, collect_routing_stats=False, **opts)
        with ServerThread(create_app(llm, MODEL_NAME, api_key=API_KEY)) as s:
            yield s.url + "/v1"

    args = bench.build_parser().parse_args([
        "--launch", "unused", "--sweep", "max_num_seqs=2,8", "--concurrency", "1,4", "--num-prompts", "4",
        "--max-tokens", "4", "--ignore-eos", "--warmup", "1", "--api-key", API_KEY, "--out-dir", str(tmp_path),
        "--level-timeout", "60"])
    args.endpoint = "chat"
    runs = bench.run_sweep(args, bench.parse_sweeps(args.sweep), launch=launch)
    assert launched == [{"max_num_seqs": 2}, {"max_num_seqs": 8}]
    assert [r["server_args"] for r in runs] == ["--max-num-seqs 2", "--max-num-seqs 8"]
    for r in runs:
        assert [lv["concurrency"] for lv in r["levels"]] == [1, 4]
        assert all(lv["completed"] == 4 and lv["total_output_tokens"] == 16 for lv in r["levels"])
    report = bench.write_sweep(args, runs, tmp_path, "t")
    pts = report["frontier"]
    assert len(pts) == 4 and any(p["pareto_ttft"] for p in pts) and any(p["pareto_itl"] for p in pts)
    for name in ("ttft", "itl"):  # the marks are the Pareto set of the measured numbers
        assert [p[f"pareto_{name}"] for p in pts] == bench.pareto(
            [(p["output_throughput"], p[f"p99_{name}_ms"]) for p in pts])
    md = (tmp_path / "t-frontier.md").read_text()
    assert "## Throughput-latency frontier" in md and "## max_num_seqs=8" in md
    assert json.loads((tmp_path / "t-frontier.json").read_text())["frontier"] == pts
    assert (tmp_path / "t-frontier.png").stat().st_size > 5000
