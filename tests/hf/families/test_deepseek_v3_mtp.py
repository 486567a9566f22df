"""DeepSeek-V3's multi-token-prediction layers (`model.layers.{n}` in its checkpoints, dropped by
transformers) load into moe/mtp.py's modules, compute what DeepSeek-V3's MTP module computes
(checked against transformers' own DeepseekV3DecoderLayer loaded with the stored tensors), draft
for the engine, and survive export -> import -> export bit for bit."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from moe.loading import load_model
from tests.hf_fixtures import random_ids

CASE = "deepseek_v3-sigmoid-bias-groups"
MTP_ONLY = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")


def _stored(directory) -> dict:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out.update({k: s.get_tensor(k) for k in s.keys()})
    return out


@pytest.fixture(scope="module")
def v3_with_mtp(hf_dirs, tmp_path_factory):
    """The saved random V3 plus one MTP layer in a shard of its own, as DeepSeek stores it: a decoder
    layer shaped like the last one (random values), the MTP norms and projection, and copies of
    the embedding and LM head."""
    src, hf = hf_dirs(CASE)
    d = tmp_path_factory.mktemp("v3_mtp")
    shutil.copytree(src, d, dirs_exist_ok=True)
    n, D = hf.config.num_hidden_layers, hf.config.hidden_size
    stored = _stored(src)
    g = torch.Generator().manual_seed(5)
    mtp = {}
    for name, t in stored.items():
        if name.startswith(f"model.layers.{n - 1}."):
            mtp[name.replace(f"model.layers.{n - 1}.", f"model.layers.{n}.")] = torch.randn(t.shape, generator=g) * 0.3
    mtp.update({f"model.layers.{n}.{k}": (1 + 0.3 * torch.randn(D, generator=g)) for k in MTP_ONLY if "norm" in k})
    mtp[f"model.layers.{n}.eh_proj.weight"] = torch.randn(D, 2 * D, generator=g) / (2 * D) ** 0.5
    mtp[f"model.layers.{n}.embed_tokens.weight"] = stored["model.embed_tokens.weight"].clone()
    mtp[f"model.layers.{n}.shared_head.head.weight"] = stored["lm_head.weight"].clone()
    save_file(mtp, str(d / "model-mtp.safetensors"), metadata={"format": "pt"})
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"].update({k: "model-mtp.safetensors" for k in mtp})
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d, hf, mtp


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_mtp_layer_loads_and_computes_deepseek_v3s_module(v3_with_mtp):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    d, hf, mtp = v3_with_mtp
    model, _, _ = load_model(d)
    c = hf.config
    n, eps = c.num_hidden_layers, c.rms_norm_eps
    assert model.cfg.mtp_depth == 1 and model.mtp is not None
    ids = random_ids(2, 11, 7)
    with torch.no_grad():  # the main model is untouched by the extra layer
        assert (model(ids).logits - hf(input_ids=ids).logits).abs().max() <= 1e-4
        # ours: depth 1 on the main model's last hidden state h0 and the next tokens' embeddings
        h0 = {}
        hook = model.layers[-1].register_forward_hook(lambda m, a, out: h0.update(x=out[0]) and None)
        model(ids)
        hook.remove()
        nxt = torch.roll(ids, -1, dims=1)
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        cos, sin = model.rotary(pos)
        module = model.mtp.layers[0]
        h1, _ = module(h0["x"], model.embed(nxt), cos, sin, nxt)
        ours = model.lm_head(module.norm(h1))
        # reference: DeepSeek-V3's equations with the stored tensors, the block as transformers' layer
        p = f"model.layers.{n}."
        layer = DeepseekV3DecoderLayer(c, layer_idx=n - 1).eval()
        sd = {k[len(p):]: v for k, v in mtp.items() if k.startswith(p) and not k[len(p):].startswith(
            ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens", "mlp.experts."))}
        E = c.n_routed_experts  # transformers 5 holds the experts stacked: [E, 2H, D] (gate rows, up rows), [E, D, H]
        sd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([mtp[f"{p}mlp.experts.{e}.gate_proj.weight"],
                                                                 mtp[f"{p}mlp.experts.{e}.up_proj.weight"]]) for e in range(E)])
        sd["mlp.experts.down_proj"] = torch.stack([mtp[f"{p}mlp.experts.{e}.down_proj.weight"] for e in range(E)])
        layer.load_state_dict(sd, strict=True)
        emb = torch.nn.functional.embedding(nxt, mtp[p + "embed_tokens.weight"])
        x = torch.cat([_rms(emb, mtp[p + "enorm.weight"], eps), _rms(h0["x"], mtp[p + "hnorm.weight"], eps)], -1)
        x = x @ mtp[p + "eh_proj.weight"].T
        T = ids.shape[1]
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=hf.model.rotary_emb(x, pos))
        y = y[0] if isinstance(y, tuple) else y
        ref = _rms(y, mtp[p + "shared_head.norm.weight"], eps) @ mtp[p + "shared_head.head.weight"].T
    assert ref.std() > 0.3
    assert (ours - ref).abs().max() <= 1e-4


def test_engine_drafts_with_the_imported_mtp_layer(v3_with_mtp):
    from moe.engine import LLM, SamplingParams

    d, _, _ = v3_with_mtp
    prompts = [random_ids(1, 9, 3)[0].tolist(), random_ids(1, 6, 4)[0].tolist()]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    plain = LLM(str(d), device="cpu", dtype="fp32", block_size=4, num_blocks=64).generate(prompts, params)
    spec = LLM(str(d), device="cpu", dtype="fp32", block_size=4, num_blocks=64, speculative="mtp")
    outs = spec.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert spec.stats()["spec_proposed"] > 0  # the MTP layer drafted


def test_export_writes_the_mtp_layer_back_bit_exact(v3_with_mtp, tmp_path):
    from moe.hf.commands import export_hf, import_hf

    d, _, mtp = v3_with_mtp
    ours = import_hf(d, tmp_path / "ours")
    out = export_hf(ours, tmp_path / "hf")
    stored = _stored(out)
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 1
    for name, t in mtp.items():
        assert torch.equal(stored[name], t), name


def test_a_directory_without_the_layer_loads_the_main_model_alone(hf_dirs):
    src, hf = hf_dirs(CASE)  # transformers' save_pretrained: num_nextn_predict_layers=1, no layer stored
    assert hf.config.num_nextn_predict_layers == 1
    model, _, _ = load_model(src)
    assert model.cfg.mtp_depth == 0 and model.mtp is None
