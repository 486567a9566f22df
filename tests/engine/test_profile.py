"""The engine's `profile` option and the server's --profile-steps: N model steps under
torch.profiler, a Chrome trace with the model's named ranges and a summary of the top operators."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import pytest

from moe.engine import LLM, SamplingParams
from moe.engine.config import EngineConfig
from moe.errors import ConfigError
from moe.serve.__main__ import build_parser, profile_option
from tests.conftest import REPO

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def trace_names(path) -> set[str]:
    return {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}


def test_profiling_engine_steps_writes_a_trace_and_summary(model, byte_tok, tmp_path):
    llm = LLM.from_model(model, byte_tok, profile={"steps": 2, "dir": str(tmp_path / "prof")})
    llm.generate(["the quick brown fox", "experts route"], GREEDY)  # 6 model steps: the first skipped, 2 and 3 kept
    files = sorted(p.name for p in (tmp_path / "prof").iterdir())
    assert files == ["engine_steps2-3.memory.json", "engine_steps2-3.trace.json", "summary.json"]
    names = trace_names(tmp_path / "prof" / "engine_steps2-3.trace.json")
    assert {"forward", "attention", "routing", "dispatch", "expert_gemm"} <= names
    window, = json.loads((tmp_path / "prof" / "summary.json").read_text())["windows"]
    assert window["steps"] == [2, 3]
    assert window["stages"]["forward"]["calls"] == 2 and window["stages"]["attention"]["calls"] == 2 * 2  # 2 layers
    assert window["top_ops"] and window["top_ops"][0]["self_cpu_ms"] >= window["top_ops"][-1]["self_cpu_ms"]
    assert llm.profiler.done  # the window is written: the rest runs unprofiled
    llm.generate(["more"], GREEDY)
    assert len(list((tmp_path / "prof").glob("*.trace.json"))) == 1


def test_finish_profile_writes_a_window_the_engine_stopped_inside(model, byte_tok, tmp_path):
    llm = LLM.from_model(model, byte_tok, profile={"steps": 100, "dir": str(tmp_path), "skip": 0})
    llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))  # 3 model steps
    assert not list(tmp_path.glob("*.trace.json"))
    llm.finish_profile()
    assert [p.name for p in tmp_path.glob("*.trace.json")] == ["engine_steps1-3.trace.json"]
    llm.finish_profile()  # twice is harmless


@pytest.mark.parametrize("profile, message", [
    ({"steps": 0}, "profile.steps=0 must be an int >= 1"),
    ({"steps": 2, "skip": -1}, "profile.skip=-1 must be an int >= 0"),
    ({"dir": "x"}, "profile needs 'steps'"),
    ({"steps": 2, "every": 3}, r"unknown profile option\(s\) \['every'\]"),
    (5, "profile=5 must be a dict"),
])
def test_bad_profile_options_are_config_errors(profile, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(profile=profile)


def test_the_server_flags_make_the_profile_option():
    parse = build_parser().parse_args
    assert profile_option(parse(["run"])) is None
    assert profile_option(parse(["run", "--profile-steps", "3", "--profile-dir", "d"])) == {"steps": 3, "dir": "d"}
    assert profile_option(parse(["run", "--profile-steps", "3"])) == {"steps": 3}
    with pytest.raises(ConfigError, match="--profile-dir needs --profile-steps"):
        profile_option(parse(["run", "--profile-dir", "d"]))
    with pytest.raises(ConfigError, match="--profile-steps 0 must be >= 1"):
        profile_option(parse(["run", "--profile-steps", "0"]))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_server_profiles_its_steps_and_writes_them_at_shutdown(tmp_path, tok):
    from tests.serve_fixtures import make_checkpoint, serving_url

    make_checkpoint(tmp_path / "run", tok)
    out = tmp_path / "prof"
    proc = subprocess.Popen([sys.executable, "-m", "moe.serve", str(tmp_path / "run"), "--port", "0", "--threads", "1",
                             "--log-level", "warning", "--profile-steps", "50", "--profile-dir", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = serving_url(proc)
        r = httpx.post(url + "/v1/completions", json={"model": "run-step5", "prompt": "the lazy dog", "max_tokens": 4,
                                                      "temperature": 0, "ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    # 4 model steps (a prefill, 3 decodes), the first skipped; the shutdown wrote the window of steps 2-4
    traces = [p.name for p in out.glob("*.trace.json")]
    assert traces == ["engine_steps2-4.trace.json"]
    assert {"forward", "attention", "routing", "expert_gemm"} <= trace_names(out / traces[0])
    assert json.loads((out / "summary.json").read_text())["windows"][0]["top_ops"]
