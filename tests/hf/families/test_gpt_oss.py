"""GPT-OSS: HF directories (bf16/fp32 and MXFP4 experts) load with HF's logits, the engine's greedy
output equals HF `generate()` on prompts longer than the window, import -> export round-trips bit
for bit (also the Mixtral / Qwen2-MoE window cases), and the MXFP4 dequantiser equals a hand
computation and transformers' own."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from moe.errors import ConfigError
from moe.hf.commands import export_hf, import_hf
from moe.hf.convert import hf_config, model_config_from_hf
from moe.hf.mxfp4 import dequantize_mxfp4
from moe.loading import load_model
from moe.weights import checkpoint_files
from tests.hf_fixtures import hf_config as case_config, random_ids

ATOL = 1e-4
GPT_OSS = ["gpt_oss-gqa-alternating", "gpt_oss-mha-yarn-tied", "gpt_oss-gqa1-nobias"]


def _stored(directory) -> dict:
    out = {}
    for file in checkpoint_files(directory):
        out.update(load_file(str(file)))
    return out


def test_config_maps_every_gpt_oss_feature():
    cfg = model_config_from_hf(case_config("gpt_oss-mha-yarn-tied"))
    assert cfg.layer_types == ["full", "sliding", "sliding"] and cfg.sliding_window == 3
    assert cfg.attention_sinks and cfg.router_bias and cfg.expert_bias and cfg.qkv_bias and cfg.attn_out_bias
    assert (cfg.expert_activation, cfg.swiglu_alpha, cfg.swiglu_limit) == ("clamped_swiglu", 1.0, 0.8)
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.router.renormalize and cfg.router.top_k == 1
    back = hf_config(cfg, "gpt_oss")
    assert back.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]


@pytest.mark.parametrize("option,value", [("model.attention_sinks", True), ("model.expert_bias", True),
                                          ("model.expert_activation", "clamped_swiglu")])
def test_other_families_refuse_gpt_oss_options(option, value):
    cfg = model_config_from_hf(case_config("mixtral-window"))
    cfg.__dict__[option.split(".")[1]] = value
    with pytest.raises(ConfigError, match=option):
        hf_config(cfg, "mixtral")


def test_mixtral_refuses_per_layer_windows_and_olmoe_any_window():
    cfg = model_config_from_hf(case_config("mixtral-window"))
    cfg.layer_types = ["sliding", "full", "sliding"]
    with pytest.raises(ConfigError, match="model.layer_types"):
        hf_config(cfg, "mixtral")
    with pytest.raises(ConfigError, match="model.sliding_window"):
        hf_config(cfg, "olmoe")


def test_a_quantization_other_than_mxfp4_is_refused():
    c = case_config("gpt_oss-gqa-alternating")
    c.quantization_config = {"quant_method": "bitsandbytes"}
    with pytest.raises(ConfigError, match="quantization_config.quant_method"):
        model_config_from_hf(c)


def test_mxfp4_dequantisation_by_hand():
    # byte 0x21: low nibble 1 (+0.5) first, high nibble 2 (+1.0); byte 0xF8: 8 (-0.0), 15 (-6.0)
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0], blocks[0, 0, 1], blocks[0, 0, 15] = 0x21, 0xF8, 0x7F
    scales = torch.tensor([[129]], dtype=torch.uint8)  # 2 ** (129 - 127) = 4
    out = dequantize_mxfp4(blocks, scales)
    assert out.shape == (1, 32)
    assert out[0, :4].tolist() == [2.0, 4.0, -0.0, -24.0] and out[0, 30:].tolist() == [-24.0, 24.0]
    assert out[0, 4:30].abs().sum() == 0


def test_mxfp4_dequantisation_equals_transformers():
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 6, 2, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(100, 150, (3, 6, 2), dtype=torch.uint8, generator=g)
    theirs = mx.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, C, R]
    assert torch.equal(dequantize_mxfp4(blocks, scales).transpose(1, 2), theirs)


def _to_mxfp4(directory):
    """Rewrite a GPT-OSS directory as the published checkpoints are: expert weights as MXFP4
    blocks / scales, `quantization_config` in config.json. Returns HF's experts, dequantised."""
    g = torch.Generator().manual_seed(7)
    dequantised = {}
    for file in checkpoint_files(directory):
        tensors = load_file(str(file))
        for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            rows, cols = tensors[name].shape[-1], tensors[name].shape[-2]  # HF holds [E, in, out]
            E = tensors[name].shape[0]
            blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
            scales = torch.randint(122, 128, (E, rows, cols // 32), dtype=torch.uint8, generator=g)
            del tensors[name]
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
            dequantised[name] = dequantize_mxfp4(blocks, scales).transpose(1, 2)
        save_file(tensors, str(file), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router", "lm_head"]}
    (directory / "config.json").write_text(json.dumps(config))
    return dequantised


def test_an_mxfp4_directory_loads_dequantised_with_hf_logits(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.hf_fixtures import COMMON, CASES, randomize_
    fields = {**COMMON, **CASES["gpt_oss-gqa-alternating"][1], "hidden_size": 64, "intermediate_size": 32}
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_oss", **fields, attn_implementation="eager"))
    randomize_(hf, 5)
    hf.save_pretrained(str(tmp_path))
    experts = _to_mxfp4(tmp_path)
    with torch.no_grad():
        for name, value in experts.items():
            hf.get_parameter(name).copy_(value)
    model, _, cfg = load_model(tmp_path)
    assert cfg.model.expert_activation == "clamped_swiglu"
    ids = random_ids(2, 13, 1)
    with torch.no_grad():
        assert (model(ids).logits - hf(input_ids=ids).logits.float()).abs().max().item() <= ATOL


@pytest.mark.parametrize("case", GPT_OSS[:2])
def test_engine_greedy_equals_hf_generate_past_the_window(case, hf_dirs):
    from moe.engine import LLM, SamplingParams

    directory, hf = hf_dirs(case)
    prompts = [random_ids(1, 11, 3)[0].tolist(), random_ids(1, 6, 4)[0].tolist()]
    llm = LLM(str(directory), device="cpu", dtype="fp32", block_size=4, num_blocks=64, max_num_batched_tokens=8)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert out.token_ids == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("case", [*GPT_OSS, "mixtral-window", "qwen2-window"])
def test_import_export_round_trips_bit_exactly(case, hf_dirs, tmp_path):
    original, hf = hf_dirs(case)
    first = export_hf(import_hf(original, tmp_path / "run"), tmp_path / "first", max_shard_size="30KB")
    ours, theirs = _stored(first), _stored(original)
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in ours)
    from transformers import AutoConfig
    assert {k: v for k, v in AutoConfig.from_pretrained(str(first)).to_dict().items() if k != "_name_or_path"} == \
        {k: v for k, v in hf.config.to_dict().items() if k != "_name_or_path"}
    second = export_hf(import_hf(first, tmp_path / "run2"), tmp_path / "second", max_shard_size="30KB")
    for file in checkpoint_files(first):
        assert file.read_bytes() == (second / file.name).read_bytes(), file.name
    assert (first / "config.json").read_text() == (second / "config.json").read_text()
