"""`python -m moe.engine.memory.plan --quant`: quantized weights counted at the bytes the scheme stores
(moe.engine.memory.plan_quant), checked against a really quantized model's bytes, against the
format's arithmetic (mxfp4: 4.25 bits a weight), and `auto` from an HF config's quantization_config."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch

from moe.config.schema import ModelConfig
from moe.engine.memory.plan import main, plan_model, read_model_config
from moe.engine.memory.plan_quant import resolve_quant
from moe.errors import ConfigError
from moe.model import Transformer
from moe.quant import quantize_model, weight_bytes
from tests.hf_fixtures import hf_config

# d_model 64 and expert_hidden 96: every expert input dim a multiple of mxfp4's 32-value block
CFG = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=96,
                  max_seq_len=256)
EXPERT_WEIGHTS = 2 * CFG.n_experts * 3 * CFG.d_model * CFG.expert_hidden  # 2 layers of gate, up, down


def real_bytes(cfg: ModelConfig, scheme: str, dtype=torch.float32) -> dict:
    torch.manual_seed(0)
    model = Transformer(cfg).to(dtype).eval()
    return weight_bytes(quantize_model(model, scheme))


@pytest.mark.parametrize("scheme", ["none", "mxfp4", "int8", "int4", "fp8"])
def test_planned_weights_equal_a_quantized_model(scheme):
    planned = plan_model(CFG, 10**9, torch.float32, 64, 4, quant=scheme)
    assert planned.weights == real_bytes(CFG, scheme)["total"]


def test_gpt_oss_mxfp4_with_a_short_block_and_biases_equals_the_real_model():
    # hidden 32, intermediate 16: the down projection's 16 inputs fill half an MXFP4 block (zero-padded)
    cfg = read_model_config_of("gpt_oss-gqa-alternating")
    planned = plan_model(cfg, 10**9, torch.bfloat16, 64, 4, quant="mxfp4")
    assert planned.weights == real_bytes(cfg, "mxfp4", torch.bfloat16)["total"]
    assert planned.weights < plan_model(cfg, 10**9, torch.bfloat16, 64, 4).weights


def test_mxfp4_is_four_and_a_quarter_bits_a_weight_and_the_rest_stays_at_dtype():
    none = plan_model(CFG, 10**9, torch.bfloat16, 64, 4).weights
    mx = plan_model(CFG, 10**9, torch.bfloat16, 64, 4, quant="mxfp4").weights
    # experts only (mxfp4's default, as GPT-OSS ships): bf16 (16 bits) -> 4.25 bits, everything else unchanged
    assert none - mx == EXPERT_WEIGHTS * 2 - EXPERT_WEIGHTS * 17 // 32
    int8 = plan_model(CFG, 10**9, torch.bfloat16, 64, 4, quant="int8").weights
    assert mx < int8 < none  # int8 also quantizes the attention projections, at 8 bits + per-channel scales


def read_model_config_of(case: str) -> ModelConfig:
    with tempfile.TemporaryDirectory() as d:
        hf_config(case).to_json_file(f"{d}/config.json")
        return read_model_config(d)


def write_config(tmp_path, case: str, quantization_config=None) -> str:
    hf = hf_config(case).to_dict()
    if quantization_config is not None:
        hf["quantization_config"] = quantization_config
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    return str(path)


def test_auto_follows_the_configs_quantization_config(tmp_path):
    plain = write_config(tmp_path, "gpt_oss-gqa-alternating")
    assert resolve_quant("auto", plain) == "none"
    shipped = write_config(tmp_path, "gpt_oss-gqa-alternating", {"quant_method": "mxfp4"})
    assert resolve_quant("auto", shipped) == "mxfp4" and resolve_quant("int4", shipped) == "int4"
    odd = write_config(tmp_path, "gpt_oss-gqa-alternating", {"quant_method": "bitsandbytes"})
    with pytest.raises(ConfigError, match="quant_method='bitsandbytes'"):
        resolve_quant("auto", odd)
    with pytest.raises(ConfigError, match=r"--quant='mx4' is unknown; choose one of \['auto', 'none'"):
        resolve_quant("mx4", plain)


def test_command_line_counts_auto_and_refuses_bad_or_uncombinable_options(tmp_path, capsys):
    path = write_config(tmp_path, "gpt_oss-gqa-alternating", {"quant_method": "mxfp4"})
    common = [path, "--device-memory", "2GiB", "--dtype", "bf16", "--json"]
    assert main(common) == 0
    none = json.loads(capsys.readouterr().out)
    assert main(common + ["--quant", "auto"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert auto["quant"] == "mxfp4" and none["quant"] == "none"
    assert auto["weights"] == auto["weights_quantized"] + auto["weights_full_precision"] < none["weights"]
    assert auto["kv_cache"] - none["kv_cache"] == none["weights"] - auto["weights"]  # what the weights free
    assert main(common[:-1]) == 0  # the text form names the shipped format when it is not counted
    assert "the config ships mxfp4 weights" in capsys.readouterr().out
    assert main(common + ["--quant", "nf4"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --quant='nf4' is unknown; choose one of")
    assert main(common + ["--quant", "auto", "--devices", "2"]) == 2
    err = capsys.readouterr().err
    assert "--quant=auto (mxfp4) is not supported with --devices" in err and err.count("\n") == 1


def test_expert_cache_counts_quantized_experts(tmp_path, capsys):
    path = write_config(tmp_path, "gpt_oss-gqa-alternating")
    common = [path, "--device-memory", "2GiB", "--dtype", "bf16", "--json", "--expert-cache", "2"]
    assert main(common) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(common + ["--quant", "mxfp4"]) == 0
    mx = json.loads(capsys.readouterr().out)
    # the slow tier holds every expert as stored: the quantized bytes (mxfp4 quantizes the experts only)
    assert mx["expert_cache_slow_tier_bytes"] == mx["weights_quantized"] < plain["expert_cache_slow_tier_bytes"]
    assert mx["expert_cache_fast_tier_bytes"] * 2 == mx["expert_cache_slow_tier_bytes"]  # 2 of 4 experts a layer


def test_awq_is_refused_where_quantize_model_refuses_it(tmp_path, capsys):
    path = write_config(tmp_path, "gpt_oss-gqa-alternating")
    assert main([path, "--device-memory", "2GiB", "--quant", "awq"]) == 2
    err = capsys.readouterr().err
    assert "--quant=awq is not supported with model.expert_activation=" in err and err.count("\n") == 1
    with pytest.raises(ConfigError, match="model.attention_kind='mla'"):
        plan_model(read_model_config_of("deepseek_v2-lite-yarn"), 10**9, torch.bfloat16, 64, 4, quant="awq")
    assert plan_model(CFG, 10**9, torch.float32, 64, 4, quant="awq").weights < \
        plan_model(CFG, 10**9, torch.float32, 64, 4).weights  # a plain GQA model with SwiGLU experts: planned
