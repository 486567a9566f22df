"""GPT-OSS checkpoints with MXFP4 experts kept as MXFP4 (`quantization="mxfp4"`): the stored bytes load
unchanged (the model computes what the dequantised load computes, and HF's logits), the engine serves
them with the dequantised model's greedy tokens, and import -> export -> import -> export writes the
published `_blocks` / `_scales` back bit for bit. One small random GPT-OSS directory for the module,
its experts quantized by our `mxfp4` scheme in HF's layout (so the scheme's layout is GPT-OSS's)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from moe.hf.commands import export_hf, import_hf
from moe.loading import load_model
from moe.quant import QuantExperts, get_scheme
from moe.weights import checkpoint_files
from tests.hf_fixtures import CASES, COMMON, random_ids, randomize_, save_word_tokenizer


def _stored(directory) -> dict:
    out = {}
    for file in checkpoint_files(directory):
        out.update(load_file(str(file)))
    return out


@pytest.fixture(scope="module")
def mxfp4_dir(tmp_path_factory):
    """(directory, HF model holding the dequantised experts): GPT-OSS as published, experts MXFP4."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {**COMMON, **CASES["gpt_oss-gqa-alternating"][1], "hidden_size": 64, "intermediate_size": 32}
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_oss", **fields, attn_implementation="eager"))
    randomize_(hf, 3)
    directory = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    hf.save_pretrained(str(directory), max_shard_size="40KB")
    save_word_tokenizer(directory)
    scheme = get_scheme("mxfp4")
    for file in checkpoint_files(directory):
        tensors = load_file(str(file))
        for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            stored = scheme.quantize(tensors.pop(name).transpose(1, 2))  # HF holds [E, in, out]; blocks run along in
            tensors[name + "_blocks"], tensors[name + "_scales"] = stored["blocks"], stored["scales"]
            with torch.no_grad():
                hf.get_parameter(name).copy_(scheme.dequantize(stored, fields["hidden_size"] if "gate" in name
                                                                else fields["intermediate_size"],
                                                                torch.float32).transpose(1, 2))
        save_file(tensors, str(file), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (directory / "config.json").write_text(json.dumps(config))
    return directory, hf.eval()


@pytest.fixture(scope="module")
def loaded(mxfp4_dir):
    """(kept: experts as stored, plain: dequantised at load by moe/hf/mxfp4.py's own dequantiser)."""
    directory, _ = mxfp4_dir
    return load_model(directory, quantization="mxfp4")[0], load_model(directory)[0]


def test_the_stored_bytes_load_as_they_are_and_compute_the_dequantised_model(mxfp4_dir, loaded):
    _, hf = mxfp4_dir
    kept, plain = loaded
    experts = kept.layers[1].ffn.experts
    assert isinstance(experts, QuantExperts) and experts.gate_up_blocks.dtype == torch.uint8
    assert kept.quant_spec.scheme == "mxfp4" and isinstance(kept.layers[0].attn.qkv_proj, torch.nn.Linear)
    for e in range(experts.n_experts):
        gate_up, down = experts.expert_weights(e)
        assert torch.equal(gate_up, plain.layers[1].ffn.experts.gate_up_proj[e])
        assert torch.equal(down, plain.layers[1].ffn.experts.down_proj[e])
    ids = random_ids(2, 11, 1)
    with torch.no_grad():
        assert (kept(ids).logits - hf(input_ids=ids).logits).abs().max().item() <= 1e-4


def test_the_engine_serves_the_kept_experts_with_the_dequantised_models_tokens(mxfp4_dir, loaded):
    from moe.engine import LLM, SamplingParams

    directory, _ = mxfp4_dir
    prompt = random_ids(1, 9, 3)[0].tolist()  # longer than the window (4)
    llm = LLM(str(directory), quantization="mxfp4", device="cpu", dtype="fp32", block_size=4, num_blocks=16,
              max_num_batched_tokens=8)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))[0]
    ids = torch.tensor([prompt])
    with torch.no_grad():  # naive greedy recompute on the dequantised model
        for _ in range(5):
            ids = torch.cat([ids, loaded[1](ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out.token_ids == ids[0, len(prompt):].tolist()


def test_import_export_writes_the_published_blocks_back_bit_for_bit(mxfp4_dir, tmp_path):
    directory, _ = mxfp4_dir
    ckpt = import_hf(directory, tmp_path / "run", quantization="mxfp4")
    assert torch.load(ckpt, weights_only=False)["quantization"] == {"scheme": "mxfp4", "linear": False}
    first = export_hf(ckpt, tmp_path / "first", max_shard_size="40KB")
    ours, theirs = _stored(first), _stored(directory)
    assert ours.keys() == theirs.keys() and any(k.endswith("_blocks") for k in ours)
    assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in ours)
    assert json.loads((first / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
    second = export_hf(import_hf(first, tmp_path / "run2", quantization="mxfp4"), tmp_path / "second",
                       max_shard_size="40KB")
    for file in checkpoint_files(first):
        assert file.read_bytes() == (second / file.name).read_bytes(), file.name
    assert (first / "config.json").read_text() == (second / "config.json").read_text()


def test_a_dequantised_import_exports_without_the_mxfp4_record(mxfp4_dir, tmp_path):
    directory, _ = mxfp4_dir
    out = export_hf(import_hf(directory, tmp_path / "run"), tmp_path / "out", max_shard_size="40KB")
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert not any(k.endswith(("_blocks", "_scales")) for k in _stored(out))
