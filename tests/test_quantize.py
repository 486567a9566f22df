"""`python -m moe.quantize` and quantized checkpoints through `moe.load_model` and `LLM`."""

import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.errors import CheckpointError, ConfigError
from moe.loading import load_model, read_any_checkpoint
from moe.quant import QuantExperts, QuantLinear, weight_bytes
from moe.quantize import main
from tests.hf_fixtures import family_checkpoint

IDS = torch.tensor([[5, 9, 3, 17, 22, 8, 1, 40, 33, 2]])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, bpe_tokenizer):
    return family_checkpoint(tmp_path_factory.mktemp("q"), bpe_tokenizer, d_model=64, n_heads=4, n_kv_heads=4)


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


# each scheme is given its own options only: one it lacks is refused (tests/quant/test_apply.py)
OPTIONS = {"int4": {"group_size": 32}, "fp8": {}, "awq": {"group_size": 32, "calib_tokens": 256}}


@pytest.mark.parametrize("scheme", ["int4", "awq", "fp8"])
def test_quantize_writes_a_checkpoint_that_loads_quantized(ckpt, text_file, tmp_path, scheme, capsys):
    out = tmp_path / f"{scheme}.pt"
    options = dict(OPTIONS[scheme], **({"calib_path": str(text_file)} if scheme == "awq" else {}))
    flags = [a for k, v in options.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    assert main([str(ckpt), str(out), "--scheme", scheme, *flags]) == 0
    assert "wrote" in capsys.readouterr().out
    assert read_any_checkpoint(out)["quantization"]["scheme"] == scheme
    model, tok, _ = load_model(out)
    assert tok is not None
    assert isinstance(model.layers[0].attn.qkv_proj, QuantLinear)
    assert isinstance(model.layers[0].ffn.experts, QuantExperts)
    assert isinstance(model.lm_head, torch.nn.Linear) and isinstance(model.embed, torch.nn.Embedding)
    direct, _, _ = load_model(ckpt, quantization={"scheme": scheme, **options})
    torch.testing.assert_close(logits(model), logits(direct), atol=1e-5, rtol=1e-5)  # saved == in memory
    full, _, _ = load_model(ckpt)
    assert float((logits(model) - logits(full)).norm() / logits(full).norm()) < 0.3  # close, not equal
    b, f = weight_bytes(model), weight_bytes(full)
    assert b["total"] < f["total"] and b["full_precision"] < f["total"]


def test_none_changes_nothing_and_bad_schemes_fail_clearly(ckpt, tmp_path, capsys):
    full, _, _ = load_model(ckpt)
    same, _, _ = load_model(ckpt, quantization="none")
    assert torch.equal(logits(full), logits(same))
    assert all(not isinstance(m, (QuantLinear, QuantExperts)) for m in same.modules())
    with pytest.raises(ConfigError, match=r"quantization='int2' is unknown; choose one of \['none', 'awq'"):
        load_model(ckpt, quantization="int2")
    with pytest.raises(ConfigError, match="quant.calib_path"):
        load_model(ckpt, quantization="awq")
    assert main([str(ckpt), str(tmp_path / "x.pt"), "--scheme", "int2"]) == 2
    assert "choose one of" in capsys.readouterr().err
    assert main([str(ckpt), str(tmp_path / "g.pt"), "--scheme", "int8", "--group-size", "64"]) == 2
    # the scheme's own refusal, in this command's flag names
    assert capsys.readouterr().err == "error: --group-size: not an option of --scheme='int8'; it has no options\n"
    main([str(ckpt), str(tmp_path / "q.pt"), "--scheme", "int8"])
    with pytest.raises(CheckpointError, match="already quantized"):
        load_model(tmp_path / "q.pt", quantization="int4")


def test_engine_serves_a_quantized_model_exactly_as_its_forward(ckpt):
    llm = LLM(ckpt, quantization="int8", device="cpu", dtype="fp32", num_blocks=16, collect_routing_stats=False)
    assert isinstance(llm.model.layers[0].attn.o_proj, QuantLinear)
    prompt = IDS[0].tolist()
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].token_ids
    ids = list(prompt)
    with torch.no_grad():  # the naive reference: full forward per token on the same quantized model
        for _ in range(6):
            ids.append(int(llm.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out == ids[len(prompt):]


def test_options_are_checked_before_loading_in_this_commands_flag_names(tmp_path, capsys):
    missing = str(tmp_path / "missing.pt")  # nothing is loaded: each option is refused first
    for argv, expected in [
        (["--scheme", "none"], "--scheme='none' is unknown; choose one of ['awq', 'fp8', 'fp8_weight', 'int4', 'int8', 'mxfp4']"),
        (["--scheme", "awq"], "--scheme=awq needs calibration text: add --calib-path <text file>"),
        (["--scheme", "awq", "--calib-path", str(tmp_path / "no.txt")], "--calib-path="),
        (["--scheme", "int4", "--group-size", "3"], "--group-size=3 must be even"),
        (["--scheme", "int4", "--group-size", "0"], "--group-size=0 must be a positive int"),
    ]:
        assert main([missing, str(tmp_path / "out.pt"), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err
        assert "quant." not in err and "quantization=" not in err


def test_no_output_is_overwritten_and_no_input_or_run_checkpoint_is_replaced(ckpt, tmp_path, capsys):
    out = tmp_path / "q.pt"
    out.write_bytes(b"an older file")
    assert main([str(ckpt), str(out), "--scheme", "int8"]) == 2
    assert str(out) in capsys.readouterr().err and out.read_bytes() == b"an older file"
    assert main([str(ckpt), str(out), "--scheme", "int8", "--overwrite"]) == 0
    (old,) = tmp_path.glob("q.pt.old-*")
    assert old.read_bytes() == b"an older file" and read_any_checkpoint(out)["quantization"]["scheme"] == "int8"
    assert main([str(ckpt), str(ckpt), "--scheme", "int8", "--overwrite"]) == 2
    assert "must be a new path" in capsys.readouterr().err
    assert main([str(ckpt), str(tmp_path / "run" / "checkpoints" / "step_0000009.pt"), "--scheme", "int8"]) == 2
    assert "checkpoints/ directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()  # an existing (empty) directory: one line before the load, not a traceback after it
    assert main([str(ckpt), str(tmp_path / "empty"), "--scheme", "int8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out=") and "is a directory" in err and err.count("\n") == 1, err
    assert not any((tmp_path / "empty").iterdir())
