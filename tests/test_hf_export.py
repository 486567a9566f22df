"""`python -m moe.hf export|import` and `moe.hf_io`: the exported directory loads in transformers
(AutoModelForCausalLM -> Mixtral, AutoTokenizer -> our tokenizer and chat template) with fp32 logits
equal to ours, variants Mixtral cannot express are refused naming the option, and Mixtral HF
directories come back as moe-lab checkpoints (or load directly with `load_any`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe.checkpoint import checkpoint_path, load_model, save_checkpoint, tokenizer_files
from moe.config import Config, ConfigError, ModelConfig, RouterConfig, TrainConfig, to_dict
from moe.hf_io import describe_checkpoint, export_hf, import_hf, is_hf_dir, load_any
from moe.model import Transformer
from tests.conftest import REPO, SHARED_DATA

ATOL = 1e-5
SAMPLES = ["Once upon a time, there was a little girl named Lily.", "  leading spaces and ünïcödé 🙂\n",
           "<|user|>\nhi<|end|>\n", "Q: What is 2+2?\nA: 4"]


@pytest.fixture(scope="module")
def tokenizer():
    from moe.data import Tokenizer
    path = SHARED_DATA / "corpus" / "tinystories_train_head.txt"
    text = path.read_text(encoding="utf-8")[:60_000] if path.is_file() else "the quick brown fox " * 2000
    return Tokenizer.train(text.split("\n\n"), vocab_size=400)


def make_checkpoint(run_dir: Path, tokenizer, seed: int = 0, **model_kw) -> Path:
    """A moe-lab checkpoint with unit-scale random weights (no training needed)."""
    router_kw = model_kw.pop("router", {})
    cfg = Config(model=ModelConfig(**{**dict(vocab_size=448, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                             n_experts=4, expert_hidden=48, max_seq_len=64), **model_kw}),
                 router=RouterConfig(**{"top_k": 2, **router_kw}), train=TrainConfig(seq_len=32))
    torch.manual_seed(seed)
    model = Transformer(cfg.model, cfg.router)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g) if p.dim() == 1
                    else torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return save_checkpoint(checkpoint_path(run_dir, 7), {"model": model.state_dict(), "config": to_dict(cfg),
                                                        "tokenizer": tokenizer_files(tokenizer), "step": 7})


def ids_batch(tok) -> torch.Tensor:
    rows = [tok.encode(s)[:12] for s in SAMPLES[:1]] + [list(range(0, 440, 37))]
    n = min(len(r) for r in rows)
    return torch.tensor([r[:n] for r in rows])


def test_cli_export_loads_in_transformers_with_equal_logits(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, MixtralForCausalLM

    ckpt = make_checkpoint(tmp_path / "run", tokenizer)
    out = tmp_path / "hf"
    p = subprocess.run([sys.executable, "-m", "moe.hf", "export", str(tmp_path / "run"), str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    ours, tok, _ = load_model(ckpt)
    assert isinstance(hf, MixtralForCausalLM) and hf.config.model_type == "mixtral"
    assert next(hf.parameters()).dtype == torch.float32
    x = ids_batch(tok)
    with torch.no_grad():
        expected, got = hf(input_ids=x).logits, ours(x).logits
    assert expected.std() > 0.5
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    # The tokenizer: same ids, same special tokens, same chat template.
    for s in SAMPLES:
        assert hf_tok.encode(s, add_special_tokens=False) == tok.encode(s)
        assert hf_tok.encode(s) == tok.encode(s)  # no BOS added behind our back
        assert hf_tok.decode(tok.encode(s)) == s
    assert (hf_tok.pad_token, hf_tok.bos_token, hf_tok.eos_token) == ("<|pad|>", "<|bos|>", "<|eos|>")
    assert (hf_tok.pad_token_id, hf_tok.bos_token_id, hf_tok.eos_token_id) == (0, 1, 2)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    assert hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(msgs, add_generation_prompt=True)
    assert (hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id) == (1, 2, 0)
    assert GenerationConfig.from_pretrained(out).eos_token_id == [2, 6]  # <|eos|>, <|end|>
    prov = json.loads((out / "moe_lab.json").read_text())
    assert prov["step"] == 7 and prov["config"]["model"]["d_model"] == 64


@pytest.mark.parametrize("option,kw", [
    ("model.n_shared_experts", dict(n_shared_experts=1)),
    ("model.n_dense_layers", dict(n_dense_layers=1)),
    ("router.score_func", dict(router=dict(score_func="sigmoid"))),
    ("router.capacity_factor", dict(router=dict(capacity_factor=1.25))),
])
def test_export_refuses_what_mixtral_cannot_express(tmp_path, tokenizer, option, kw):
    make_checkpoint(tmp_path / "run", tokenizer, **kw)
    with pytest.raises(ConfigError, match=option.replace(".", r"\.") + ".*cannot be expressed as a Mixtral model"):
        export_hf(tmp_path / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_cli_refusal_and_missing_checkpoint_are_clear(tmp_path, tokenizer, capsys):
    from moe.hf_io import main  # what `python -m moe.hf` runs (the subprocess test above covers the dispatch)

    make_checkpoint(tmp_path / "run", tokenizer, n_shared_experts=1)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "hf")]) == 2
    assert "error: model.n_shared_experts=1 cannot be expressed as a Mixtral model" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "hf")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "run"), str(tmp_path / "x")]) == 2
    assert "not a Hugging Face model directory" in capsys.readouterr().err


def test_import_round_trip_and_load_any(tmp_path, tokenizer):
    ckpt = make_checkpoint(tmp_path / "run", tokenizer, tie_embeddings=True, n_kv_heads=1)
    hf_dir = export_hf(ckpt, tmp_path / "hf")
    assert is_hf_dir(hf_dir) and not is_hf_dir(tmp_path / "run") and not is_hf_dir(ckpt)
    path = import_hf(hf_dir, tmp_path / "back")
    assert path == checkpoint_path(tmp_path / "back", 7)
    a, tok_a, cfg_a = load_model(ckpt)
    b, tok_b, cfg_b = load_model(tmp_path / "back")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert cfg_b.model == cfg_a.model and cfg_b.router.top_k == cfg_a.router.top_k
    assert (b.lm_head.weight is b.embed.weight) and tok_b.encode(SAMPLES[0]) == tok_a.encode(SAMPLES[0])
    c, tok_c, cfg_c = load_any(hf_dir)
    x = ids_batch(tok_a)
    with torch.no_grad():
        torch.testing.assert_close(c(x).logits, a(x).logits, atol=ATOL, rtol=0)
    assert type(tok_c).__name__ == "Tokenizer" and cfg_c.model == cfg_a.model
    assert describe_checkpoint(hf_dir)["kind"] == "hf" and describe_checkpoint(hf_dir)["step"] == 7
    assert describe_checkpoint(tmp_path / "run")["step"] == 7


def test_a_foreign_mixtral_directory_loads_for_evaluation(tmp_path):
    """A Mixtral checkpoint that is not ours (no moe_lab.json, no moe-lab tokenizer) loads with
    `load_any`, and `import` turns it into a checkpoint `load_model` reads (without a tokenizer)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=200, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=64, sliding_window=None, router_jitter_noise=0.0)
    hf = MixtralForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "foreign")
    model, tok, mcfg = load_any(tmp_path / "foreign")
    assert tok is None and mcfg.model.n_experts == 4 and mcfg.router.top_k == 2
    x = torch.randint(0, 200, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, hf(input_ids=x).logits, atol=ATOL, rtol=0)
    path = import_hf(tmp_path / "foreign", tmp_path / "ours")
    back, tok_back, _ = load_model(path)
    assert tok_back is None
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, hf(input_ids=x).logits, atol=ATOL, rtol=0)
