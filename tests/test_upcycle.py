"""Sparse upcycling: dense HF families load exactly, the upcycled model (noise 0) computes the
dense model's logits, the output is a run directory load_model reads, bad input is one line."""

import subprocess
import sys

import pytest
import torch

from moe.checkpoint import save_checkpoint, tokenizer_files
from moe.config import Config, ModelConfig, to_dict
from moe.data.tokenizer import Tokenizer
from moe.hf.dense import load_dense_hf
from moe.loading import load_model
from moe.model import Transformer
from moe.upcycle import UpcycleSpec, main, upcycle
from tests.conftest import REPO

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)


def _hf(kind):
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
    config, model, extra = {"llama": (LlamaConfig, LlamaForCausalLM, {"attention_bias": True}),
                            "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": True}),
                            "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 32}),
                            "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None})}[kind]
    torch.manual_seed(0)
    return model(config(**COMMON, **extra)).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "mistral"])
def hf_dir(request, tmp_path_factory):
    hf = _hf(request.param)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, path


def test_a_dense_hf_model_loads_with_equal_logits(hf_dir):
    hf, path = hf_dir
    ours = load_dense_hf(path)
    ids = torch.randint(0, 96, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("granularity, router", [(1, "topk"), (2, "topk"), (4, "aux_free")])
def test_upcycled_logits_equal_the_dense_model_with_noise_0(hf_dir, granularity, router):
    dense = load_dense_hf(hf_dir[1])
    moe = upcycle(dense, UpcycleSpec(experts=4, top_k=2, granularity=granularity, router=router))
    assert moe.cfg.n_experts == 4 * granularity and moe.cfg.router.top_k == 2 * granularity
    assert all(block.is_moe for block in moe.layers)
    ids = torch.randint(0, 96, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(moe(ids).logits, dense(ids).logits, rtol=1e-5, atol=1e-4)


def test_noise_makes_the_experts_differ(hf_dir):
    moe = upcycle(load_dense_hf(hf_dir[1]), UpcycleSpec(experts=4, top_k=2, noise=0.01))
    w = moe.layers[0].ffn.experts.gate_up_proj
    assert not torch.equal(w[0], w[1]) and torch.allclose(w[0], w[1], atol=0.1)


def _dense_run(tmp_path) -> "Path":
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_dense_layers=2,
                            dense_hidden=64, max_seq_len=64)
    cfg.train.seq_len = 32
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    tok = Tokenizer.train(["hello world, a dense model"] * 10, vocab_size=300)
    run = tmp_path / "dense_run"
    save_checkpoint(run / "checkpoints" / "step_0000010.pt",
                    {"model": model.state_dict(), "config": to_dict(cfg), "tokenizer": tokenizer_files(tok), "step": 10})
    return run


def test_the_cli_writes_a_run_directory_that_load_model_reads(tmp_path, capsys):
    run = _dense_run(tmp_path)
    out = tmp_path / "upcycled"
    assert main([str(run), str(out), "--experts", "4", "--top-k", "2", "--granularity", "2"]) == 0
    assert (out / "config.json").is_file() and (out / "tokenizer" / "tokenizer.json").is_file()
    moe, tok, cfg = load_model(out)
    dense, _, _ = load_model(run)
    assert cfg.model.n_experts == 8 and tok is not None
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(moe(ids).logits, dense(ids).logits, rtol=1e-5, atol=1e-4)
    # the overwrite rules of every output: refused, then moved aside with --overwrite
    assert main([str(run), str(out), "--experts", "4", "--top-k", "2"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main([str(run), str(out), "--experts", "4", "--top-k", "1", "--overwrite"]) == 0
    assert load_model(out)[2].model.router.top_k == 1 and list(tmp_path.glob("upcycled.old-*"))


@pytest.mark.parametrize("args, message", [
    (["--experts", "2", "--top-k", "3"], "--top-k=3 must be <= --experts=2"),
    (["--experts", "4", "--top-k", "2", "--router", "nope"], "nope"),
    (["--experts", "4", "--top-k", "2", "--granularity", "5"], "--granularity=5 must divide"),
    (["--experts", "4", "--top-k", "2", "--noise", "-1"], "--noise=-1.0 must be >= 0"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, args, message):
    """In-process (`main`, as the command runs it); the process's own exit status: the test below."""
    run = _dense_run(tmp_path)
    out = tmp_path / "out"
    assert main([str(run), str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_the_command_exits_2_with_one_line_on_bad_input(tmp_path):
    run = _dense_run(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "moe.upcycle", str(run), str(out), "--experts", "2", "--top-k", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--top-k=3 must be <= --experts=2" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_a_source_with_moe_layers_is_refused(tmp_path, capsys):
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4,
                            expert_hidden=16, max_seq_len=64)
    cfg.train.seq_len = 32
    save_checkpoint(tmp_path / "moe.pt", {"model": Transformer(cfg.model).state_dict(), "config": to_dict(cfg)})
    assert main([str(tmp_path / "moe.pt"), str(tmp_path / "out"), "--experts", "4", "--top-k", "2"]) == 2
    assert "the source has MoE layers [0, 1]" in capsys.readouterr().err and not (tmp_path / "out").exists()
