"""`python -m moe.serve <checkpoint>` end to end: a real process on a free loopback port (--port 0),
the API key, a completion through the `openai` client, and a clean exit on SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import REPO, with_variants
from tests.serve_fixtures import make_checkpoint, serving_url

pytestmark = pytest.mark.timeout(120)


def test_cli_serves_a_checkpoint(tmp_path, tok):
    run = tmp_path / "tiny-run"
    make_checkpoint(run, tok)
    proc = subprocess.Popen([sys.executable, "-m", "moe.serve", str(run), "--host", "127.0.0.1", "--port", "0",
                             "--threads", "1", "--api-key", "sekrit", "--log-level", "warning"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = serving_url(proc)
        assert url.startswith("http://127.0.0.1:"), url
        assert httpx.get(url + "/v1/models").status_code == 401
        with openai.OpenAI(base_url=url + "/v1", api_key="sekrit", max_retries=0, timeout=30) as client:
            assert [m.id for m in client.models.list().data] == ["tiny-run-step5"]
            r = client.completions.create(model="tiny-run-step5", prompt="the lazy dog", max_tokens=4,
                                          temperature=0, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_cli_bad_checkpoint_exits_cleanly(tmp_path, capsys):
    """`python -m moe.serve <missing path>`: its main in this process (what `python -m` runs and exits
    with); the real process, its start-up and exit, is test_cli_serves_a_checkpoint above."""
    from moe.serve.__main__ import main

    assert main([str(tmp_path / "missing"), "--port", "0"]) == 2, "a missing checkpoint is not exit status 2"
    err = capsys.readouterr().err
    assert "does not exist" in err and err.startswith("error: ") and "Traceback" not in err, err


@pytest.mark.slow
def test_serve_cli_on_an_hf_directory(hf_dirs):
    directory, _ = hf_dirs("olmoe-tied-renorm")
    proc = subprocess.Popen([sys.executable, "-m", "moe.serve", str(directory), "--port", "0", "--threads", "1",
                             "--router-top-k", "2", "--drop-experts", "0", "--log-level", "warning"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = serving_url(proc)
        with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30) as client:
            name = directory.name
            assert [m.id for m in client.models.list().data] == [name]
            r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi w3"}],
                                               max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 4
            # the prompt is the model's own chat template: "<|im_start|> user hi w3 <|im_end|> <|im_start|> assistant"
            assert r.usage.prompt_tokens == 7
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
