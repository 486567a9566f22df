"""`python -m moe.hf export|import` and HF directories through `load_model`: the exported directory loads in transformers
(AutoModelForCausalLM -> Mixtral, AutoTokenizer -> our tokenizer and chat template) with fp32 logits
equal to ours, variants Mixtral cannot express are refused naming the option, and Mixtral HF
directories come back as moe-lab checkpoints (or load directly with `load_model`)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from moe.checkpoint import checkpoint_path, save_checkpoint, tokenizer_files
from moe.config import Config, ModelConfig, TrainConfig, to_dict
from moe.routing.routers import router_config
from moe.errors import ConfigError
from moe.hf.commands import export_hf, import_hf
from moe.hf.io import TOKENIZER_FILES
from moe.hf.layout import is_hf_dir
from moe.loading import describe_checkpoint, load_model
from moe.model import Transformer
from moe.weights import checkpoint_files
from tests.conftest import REPO, SHARED_DATA
from tests.hf_fixtures import VOCAB, family_checkpoint

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
                                             n_experts=4, expert_hidden=48, max_seq_len=64), **model_kw,
                                      "router": router_config(**{"top_k": 2, **router_kw})}),
                 train=TrainConfig(seq_len=32))
    torch.manual_seed(seed)
    model = Transformer(cfg.model)
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
    ("router.name", dict(router=dict(name="aux_free"))),  # (sigmoid scores: only aux_free has score_func)
    ("router.capacity_factor", dict(router=dict(capacity_factor=1.25))),
])
def test_export_refuses_what_mixtral_cannot_express(tmp_path, tokenizer, option, kw):
    make_checkpoint(tmp_path / "run", tokenizer, **kw)
    with pytest.raises(ConfigError, match=option.replace(".", r"\.") + ".*cannot be expressed as a Mixtral model"):
        export_hf(tmp_path / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_cli_refusal_and_missing_checkpoint_are_clear(tmp_path, tokenizer, capsys):
    from moe.hf.commands import main  # what `python -m moe.hf` runs (the subprocess test above covers the dispatch)

    make_checkpoint(tmp_path / "run", tokenizer, n_shared_experts=1)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "hf"), "--family", "mixtral"]) == 2
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
    # Everything but the training-only router losses Mixtral has no field for (z-loss) comes back.
    assert dataclasses.replace(cfg_b.model, router=cfg_a.model.router) == cfg_a.model
    assert cfg_b.model.router.top_k == cfg_a.model.router.top_k
    assert (b.lm_head.weight is b.embed.weight) and tok_b.encode(SAMPLES[0]) == tok_a.encode(SAMPLES[0])
    c, tok_c, cfg_c = load_model(hf_dir)
    x = ids_batch(tok_a)
    with torch.no_grad():
        torch.testing.assert_close(c(x).logits, a(x).logits, atol=ATOL, rtol=0)
    assert type(tok_c).__name__ == "Tokenizer" and cfg_c.model == cfg_b.model
    assert describe_checkpoint(hf_dir)["kind"] == "hf" and describe_checkpoint(hf_dir)["step"] == 7
    assert describe_checkpoint(tmp_path / "run")["step"] == 7
    # Exported and imported files get ordinary permissions, as any file the user writes (not owner-only).
    umask = os.umask(0)
    os.umask(umask)
    written = [p for p in hf_dir.iterdir() if p.is_file()] + [path, ckpt]
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in written} == {p.name: 0o666 & ~umask for p in written}


def test_a_foreign_mixtral_directory_loads_for_evaluation(tmp_path):
    """A Mixtral checkpoint that is not ours (no moe_lab.json, no moe-lab tokenizer) loads with
    `load_model`, and `import` turns it into a checkpoint `load_model` reads (without a tokenizer)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=200, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=64, sliding_window=None, router_jitter_noise=0.0)
    hf = MixtralForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "foreign")
    model, tok, mcfg = load_model(tmp_path / "foreign")
    assert tok is None and mcfg.model.n_experts == 4 and mcfg.model.router.top_k == 2
    x = torch.randint(0, 200, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, hf(input_ids=x).logits, atol=ATOL, rtol=0)
    path = import_hf(tmp_path / "foreign", tmp_path / "ours")
    back, tok_back, _ = load_model(path)
    assert tok_back is None
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, hf(input_ids=x).logits, atol=ATOL, rtol=0)


# ------------------------------------------------------------------ every family, bit for bit

def stored_tensors(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in checkpoint_files(directory):
        with safe_open(str(file), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out

def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k

@pytest.mark.parametrize("case", ["mixtral-mha-tied", "olmoe-gqa1-bias-clip", "qwen2-mha-tied-mlponly",
                                  "qwen3-gqa1-bias-step2-tied", "deepseek_v2-group-qlora",
                                  "deepseek_v3-sigmoid-bias-groups"])
def test_hf_import_export_round_trips_bit_exactly(case, hf_dirs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    original, hf = hf_dirs(case)
    ckpt = import_hf(original, tmp_path / "run")
    ours, tok, cfg = load_model(tmp_path / "run")
    assert type(tok).__name__ == "HFTokenizer"  # the model's own tokenizer, kept as it was
    msgs = [{"role": "user", "content": "hi w1"}]
    assert tok.apply_chat_template(msgs) == AutoTokenizer.from_pretrained(str(original)).apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(ids).logits - hf(input_ids=ids).logits).abs().max().item() <= ATOL

    first = export_hf(ckpt, tmp_path / "first", max_shard_size="30KB")
    assert_same_tensors(stored_tensors(first), stored_tensors(original))
    for name in TOKENIZER_FILES:
        if (original / name).is_file():
            assert (first / name).read_bytes() == (original / name).read_bytes(), name
    hf_first = AutoModelForCausalLM.from_pretrained(str(first), attn_implementation="eager").eval()
    assert type(hf_first) is type(hf)
    assert {k: v for k, v in hf_first.config.to_dict().items() if k != "_name_or_path"} == \
        {k: v for k, v in hf.config.to_dict().items() if k != "_name_or_path"}
    with torch.no_grad():
        torch.testing.assert_close(hf_first(input_ids=ids).logits, hf(input_ids=ids).logits, atol=0, rtol=0)

    second = export_hf(import_hf(first, tmp_path / "run2"), tmp_path / "second", max_shard_size="30KB")
    files = sorted(p.name for p in first.iterdir())
    assert files == sorted(p.name for p in second.iterdir()) and len(checkpoint_files(first)) > 1
    for name in files:
        if name != "moe_lab.json":  # (it names the source checkpoint)
            assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert json.loads((first / "moe_lab.json").read_text())["config"] == \
        json.loads((second / "moe_lab.json").read_text())["config"]

@pytest.mark.parametrize("model_kw, family", [
    (dict(qk_norm="head", head_dim=16, dense_layers=[1], dense_hidden=40, qkv_bias=True, attn_out_bias=True,
          router=dict(renormalize=False)), "qwen3_moe"),
    (dict(qk_norm="full", clip_qkv=1.5, tie_embeddings=True), "olmoe"),
    (dict(n_shared_experts=1, shared_expert_gate=True, shared_expert_hidden=24, qkv_bias=True, n_dense_layers=1,
          dense_hidden=40), "qwen2_moe"),
])
def test_a_moe_lab_checkpoint_exports_as_the_family_its_options_need(model_kw, family, bpe_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    ckpt = family_checkpoint(tmp_path / "run", bpe_tokenizer, **model_kw)
    out = export_hf(ckpt, tmp_path / "hf")  # --family auto
    hf = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    assert hf.config.model_type == family
    ours, tok, _ = load_model(ckpt)
    text = tok.encode("the quick brown fox jumps over the lazy dog, the lazy dog")
    assert len(text) >= 7
    ids = torch.tensor([text[:7], list(range(7))])
    with torch.no_grad():
        expected, got = hf(input_ids=ids).logits, ours(ids).logits
    assert expected.std() > 0.5 and (got - expected).abs().max().item() <= ATOL
    back, _, cfg_back = load_model(out)
    assert torch.equal(back(ids).logits, load_model(import_hf(out, tmp_path / "back"))[0](ids).logits)
    assert cfg_back.model.dense_layer_ids == ours.cfg.dense_layer_ids


def test_export_and_import_never_overwrite_without_asking(tmp_path, tokenizer, capsys):
    from moe.hf.commands import main

    make_checkpoint(tmp_path / "run", tokenizer)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("someone else's")
    assert main(["export", str(tmp_path / "run"), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err and "--overwrite" in err
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert main(["export", str(tmp_path / "run"), str(out), "--overwrite"]) == 0
    (old,) = tmp_path.glob("hf.old-*")
    assert (old / "config.json").read_text() == "someone else's" and (out / "model.safetensors").is_file()
    assert main(["import", str(out), str(tmp_path / "run")]) == 2  # an existing run: refused
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "run"), "--overwrite"]) == 2  # onto its input
    assert "must be a new path" in capsys.readouterr().err
    for cmd, src in (("export", tmp_path / "run"), ("import", out)):  # into the run's checkpoints/: refused
        assert main([cmd, str(src), str(tmp_path / "run" / "checkpoints" / "hf")]) == 2
        err = capsys.readouterr().err
        assert "is inside a run's checkpoints/ directory" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_0000007.pt"]
