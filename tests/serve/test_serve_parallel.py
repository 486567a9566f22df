"""`python -m moe.serve <checkpoint> --tensor-parallel-size 2 --expert-parallel`: the server fronting
a two-rank engine (real processes, gloo). One server process for the module (a launch costs three
interpreter start-ups); the last test kills its rank 1 mid-stream, so it stays last."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.conftest import REPO
from tests.serve_fixtures import make_checkpoint, read_metrics, serving_url, wait_for

pytestmark = pytest.mark.timeout(180)
NAME = "tp-run-step5"
PROMPT = "the lazy dog"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tok):
    run = tmp_path_factory.mktemp("serve-tp") / "tp-run"
    make_checkpoint(run, tok, n_layers=2, max_seq_len=512)
    return run


@pytest.fixture(scope="module")
def served(run_dir):
    """(proc, url) of the two-rank server; its stderr goes to a file the last test reads."""
    err_path = run_dir.parent / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "moe.serve", str(run_dir), "--port", "0", "--threads", "1",
                                 "--tensor-parallel-size", "2", "--expert-parallel", "--num-blocks", "64",
                                 "--log-level", "warning"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        yield proc, serving_url(proc), err_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def client(served):
    with openai.OpenAI(base_url=served[1] + "/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture
def http(served):
    with httpx.Client(base_url=served[1], timeout=60) as c:
        yield c


def rank_series(metrics: dict, name: str) -> dict[int, float]:
    prefix = f'moe_serve_{name}{{rank="'
    return {int(k[len(prefix):].split('"')[0]): v for k, v in metrics.items() if k.startswith(prefix)}


def test_greedy_streamed_and_whole_equal_the_single_process_engine(run_dir, client):
    from moe.engine import LLM, SamplingParams

    ref = LLM(str(run_dir), device="cpu").generate([PROMPT], SamplingParams(temperature=0, max_tokens=12,
                                                                             ignore_eos=True))[0]
    kw = dict(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    assert whole.choices[0].text == ref.text and whole.usage.completion_tokens == 12
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert streamed == ref.text


def test_metrics_have_a_series_per_rank(client, http):
    client.completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0)
    m = read_metrics(http)
    pids = {k.split('pid="')[1].split('"')[0] for k in m if k.startswith("moe_serve_rank_info{")}
    assert len(pids) == 2 and str(os.getpid()) not in pids, pids  # two processes, not this one
    steps = rank_series(m, "rank_steps_total")
    assert sorted(steps) == [0, 1] and steps[0] == steps[1] == m["moe_serve_engine_steps_total"] > 0
    assert rank_series(m, "rank_kv_blocks_total") == {0: 64, 1: 64}
    kv = rank_series(m, "rank_kv_cache_bytes")
    assert kv[0] == kv[1] > 0  # each rank caches its half of the kv heads
    assert all(v > 0 for v in rank_series(m, "rank_comm_seconds_total").values())
    assert all(v > 2**20 for v in rank_series(m, "rank_max_rss_bytes").values())


def rank1_pid(http) -> int:
    (key,) = [k for k in read_metrics(http) if k.startswith('moe_serve_rank_info{rank="1"')]
    return int(key.split('pid="')[1].split('"')[0])


def open_stream_with_rank1_stopped(client, http):
    """(rank 1's pid, a stream opened while rank 1 is stopped (SIGSTOP)): its request is certainly
    in flight, blocked in its first step's collective (a tiny model would otherwise finish 400
    tokens into the socket buffers before a loaded test process reads the first chunk)."""
    pid = rank1_pid(http)
    os.kill(pid, signal.SIGSTOP)
    try:
        stream = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=400, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
    except BaseException:
        os.kill(pid, signal.SIGCONT)
        raise
    return pid, stream


def test_a_disconnect_frees_the_kv_blocks_and_stops_every_rank(client, http):
    before = rank_series(read_metrics(http), "rank_steps_total")
    pid, stream = open_stream_with_rank1_stopped(client, http)
    time.sleep(1.0)  # the engine thread takes the request into a step, which blocks on rank 1
    stream.close()  # the client leaves while its request is in the middle of that step
    time.sleep(0.5)  # (the server sees the disconnect and posts the abort; the step is still blocked)
    os.kill(pid, signal.SIGCONT)
    aborted = 'moe_serve_requests_finished_total{finish_reason="abort"}'
    # (the abort event comes with the engine's next step, after the scheduler has dropped the request)
    m = wait_for(lambda: (m := read_metrics(http))[aborted] >= 1 and m, timeout=30)
    assert m, "the abort was never reported"
    assert m["moe_serve_num_requests_running"] == 0 and m["moe_serve_kv_blocks_used"] == 0, m
    time.sleep(0.5)
    steps = rank_series(read_metrics(http), "rank_steps_total")
    assert steps == rank_series(m, "rank_steps_total")  # no rank runs the aborted request any more
    assert steps[0] == steps[1] and 1 <= steps[0] - before[0] <= 2, (before, steps)  # its blocked step, no more


def test_a_rank_killed_mid_stream_takes_the_server_down(served, client, http):
    proc, _url, err_path = served
    pid, stream = open_stream_with_rank1_stopped(client, http)
    os.kill(pid, signal.SIGKILL)  # (a stopped process dies at once)
    got = []
    with pytest.raises(openai.APIError, match="tensor-parallel rank 1"):
        for chunk in stream:
            got.append(chunk)
    assert len(got) < 400
    assert proc.wait(timeout=30) == 1  # down, not hanging, and not a clean exit
    err = err_path.read_text()
    assert f"error: the engine stopped: tensor-parallel rank 1 (pid {pid}) exited with code -9" in err, err


def test_a_layout_that_cannot_work_exits_2_before_any_rank_starts(run_dir, capsys):
    """Heads that do not split over 3 ranks: one line naming the field, exit 2, nothing spawned
    (`main` in this process, as `python -m moe.serve` runs it)."""
    import multiprocessing as mp

    from moe.serve.__main__ import main

    running = set(mp.active_children())
    assert main([str(run_dir), "--port", "0", "--tensor-parallel-size", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.n_heads=4 is not divisible by tensor_parallel_size=3") and \
        err.count("\n") == 1, err
    assert set(mp.active_children()) <= running
