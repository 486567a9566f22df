"""The one table between HF tensor names and ours, for every family and both HF layouts.

Each row is (HF name, our state-dict name, index into ours): our fused `qkv_proj` holds HF's
q, k and v rows in that order, and our stacked experts (`gate_up_proj [E, 2H, D]`, gate rows
first, and `down_proj [E, D, H]`) hold each HF expert at index e. Two HF layouts:

    "hub"     what transformers' `save_pretrained` writes and the published checkpoints hold:
              one tensor per expert and projection (`mlp.experts.{e}.gate_proj.weight`; Mixtral:
              `block_sparse_moe.experts.{e}.w1.weight`), no `lm_head.weight` when tied
    "memory"  the HF model's `state_dict()` in transformers 5: stacked experts
              (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`), `lm_head.weight` always

    ours                                  HF (hub layout; {moe} = mlp, Mixtral: block_sparse_moe)
    embed.weight                          model.embed_tokens.weight
    layers.{i}.attn_norm.weight           model.layers.{i}.input_layernorm.weight
    layers.{i}.attn.qkv_proj.{weight,bias}  model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias} (rows)
    layers.{i}.attn.{q,k}_norm.weight     model.layers.{i}.self_attn.{q,k}_norm.weight
    layers.{i}.attn.o_proj.{weight,bias}  model.layers.{i}.self_attn.o_proj.{weight,bias}
    layers.{i}.ffn_norm.weight            model.layers.{i}.post_attention_layernorm.weight
    layers.{i}.ffn.router.weight          model.layers.{i}.{moe}.gate.weight
    layers.{i}.ffn.experts.gate_up_proj   model.layers.{i}.{moe}.experts.{e}.{gate,up}_proj.weight ([e, :H], [e, H:])
    layers.{i}.ffn.experts.down_proj      model.layers.{i}.{moe}.experts.{e}.down_proj.weight ([e])
    layers.{i}.ffn.shared.*_proj.weight   model.layers.{i}.mlp.shared_expert.*_proj.weight (DeepSeek: shared_experts)
    layers.{i}.ffn.router.e_score_correction_bias  model.layers.{i}.mlp.gate.e_score_correction_bias (DeepSeek-V3)
    layers.{i}.attn.{q,q_a,q_b,kv_b}_proj.weight  model.layers.{i}.self_attn.{same}.weight (DeepSeek's MLA)
    layers.{i}.attn.kv_a_proj.weight      model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight
    layers.{i}.attn.{q_a,kv_a}_norm.weight  model.layers.{i}.self_attn.{q_a,kv_a}_layernorm.weight
    layers.{i}.ffn.shared_gate.weight     model.layers.{i}.mlp.shared_expert_gate.weight
    layers.{i}.ffn.*_proj.weight (dense)  model.layers.{i}.mlp.*_proj.weight
    norm.weight, lm_head.weight           model.norm.weight, lm_head.weight
    mtp.layers.{k}.*                      model.layers.{n_layers + k}.* (DeepSeek-V3's MTP layers, `_nextn_rows`)

GPT-OSS (`Family.expert_layout == "fused"`) stores its experts fused in both layouts, in its own
layout: `mlp.experts.gate_up_proj [E, D, 2H]` (gate and up columns interleaved),
`gate_up_proj_bias [E, 2H]` (interleaved), `down_proj [E, H, D]`, `down_proj_bias [E, D]`, the
router as `mlp.router.{weight,bias}` and the sinks as `self_attn.sinks`. Its family's
`tensor_transform` turns those tensors into ours and back; `hf_tensors` and `load_route` apply it.
Its experts kept as MXFP4 (moe/hf/mxfp4.py) are written as `experts.{gate_up,down}_proj_{blocks,scales}`
(`Family.kept_tensors`); a model quantized in any other way is refused on export.
"""

from __future__ import annotations

import re
from typing import Iterator, Optional

from moe.config import ModelConfig
from moe.errors import ConfigError
from moe.hf.families.base import Family
from moe.weights import Placement

Row = tuple[str, str, tuple]  # (HF name, our name, index into ours)
LAYOUTS = ("hub", "memory")
# Stored tensors that old checkpoints may carry and that are rebuilt, never loaded.
_DERIVED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def tensor_rows(cfg: ModelConfig, fam: Family, layout: str = "hub") -> Iterator[Row]:
    """Every HF tensor of a model of `cfg` in `layout`, with where it lives in ours."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; choose one of {list(LAYOUTS)}")
    yield "model.embed_tokens.weight", "embed.weight", ()
    for i in range(cfg.n_layers):
        yield from _block_rows(cfg, fam, layout, i, f"layers.{i}.", f"model.layers.{i}.")
    yield "model.norm.weight", "norm.weight", ()
    if layout == "memory" or not cfg.tie_embeddings:
        yield "lm_head.weight", "lm_head.weight", ()
    if cfg.mtp_depth and layout == "hub":  # transformers' models hold no MTP layers: files only
        yield from _nextn_rows(cfg, fam, layout)


def _block_rows(cfg: ModelConfig, fam: Family, layout: str, i: int, ours: str, hf: str) -> Iterator[Row]:
    """One transformer block's tensors (its FFN kind: that of layer `i`)."""
    d, H, G = cfg.resolved_head_dim, cfg.n_heads, cfg.n_kv_heads
    qkv = {"q": slice(0, H * d), "k": slice(H * d, (H + G) * d), "v": slice((H + G) * d, (H + 2 * G) * d)}
    yield hf + "input_layernorm.weight", ours + "attn_norm.weight", ()
    if cfg.attention_kind == "mla":
        yield from _mla_rows(cfg, ours + "attn.", hf + "self_attn.")
    for p, rows in qkv.items() if cfg.attention_kind == "mha" else ():
        yield hf + f"self_attn.{p}_proj.weight", ours + "attn.qkv_proj.weight", (rows,)
        if cfg.qkv_bias:
            yield hf + f"self_attn.{p}_proj.bias", ours + "attn.qkv_proj.bias", (rows,)
    if cfg.qk_norm != "none":
        yield hf + "self_attn.q_norm.weight", ours + "attn.q_norm.weight", ()
        yield hf + "self_attn.k_norm.weight", ours + "attn.k_norm.weight", ()
    yield hf + "self_attn.o_proj.weight", ours + "attn.o_proj.weight", ()
    if cfg.attn_out_bias:
        yield hf + "self_attn.o_proj.bias", ours + "attn.o_proj.bias", ()
    if cfg.attention_sinks:
        yield hf + "self_attn.sinks", ours + "attn.sinks", ()
    yield hf + "post_attention_layernorm.weight", ours + "ffn_norm.weight", ()
    if cfg.is_moe_layer(i):
        yield from _moe_rows(cfg, fam, layout, ours + "ffn.", hf)
    else:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            yield hf + f"mlp.{proj}.weight", ours + f"ffn.{proj}.weight", ()


def _nextn_rows(cfg: ModelConfig, fam: Family, layout: str) -> Iterator[Row]:
    """DeepSeek-V3's multi-token-prediction layers as its checkpoints store them: depth k is
    `model.layers.{n_layers + k}`, a decoder layer plus `enorm`, `hnorm`, `eh_proj`,
    `shared_head.norm` and copies of the embedding and LM head (`embed_tokens`,
    `shared_head.head`: loaded only as checks that they equal the main model's, written back on
    export). Ours: `mtp.layers.{k}` (moe/mtp.py), its block built as the last layer's."""
    for k in range(cfg.mtp_depth):
        ours, hf = f"mtp.layers.{k}.", f"model.layers.{cfg.n_layers + k}."
        for norm in ("enorm", "hnorm"):
            yield hf + f"{norm}.weight", ours + f"{norm}.weight", ()
        yield hf + "eh_proj.weight", ours + "eh_proj.weight", ()
        yield hf + "shared_head.norm.weight", ours + "norm.weight", ()
        yield hf + "embed_tokens.weight", "embed.weight", ()
        yield hf + "shared_head.head.weight", "lm_head.weight", ()
        yield from _block_rows(cfg, fam, layout, cfg.n_layers - 1, ours + "block.", hf)


def _mla_rows(cfg: ModelConfig, ours: str, hf: str) -> Iterator[Row]:
    """DeepSeek's MLA projections (HF name -> ours: the same names, its norms `*_layernorm`)."""
    names = ["q_proj"] if cfg.q_lora_rank is None else ["q_a_proj", "q_b_proj"]
    for name in names + ["kv_b_proj"]:
        yield hf + f"{name}.weight", ours + f"{name}.weight", ()
    yield hf + "kv_a_proj_with_mqa.weight", ours + "kv_a_proj.weight", ()
    for norm in (["q_a"] if cfg.q_lora_rank is not None else []) + ["kv_a"]:
        yield hf + f"{norm}_layernorm.weight", ours + f"{norm}_norm.weight", ()


def _moe_rows(cfg: ModelConfig, fam: Family, layout: str, ours: str, hf: str) -> Iterator[Row]:
    E, Hx = cfg.n_experts, cfg.expert_hidden
    if fam.expert_layout == "fused":  # GPT-OSS: one layout on disk and in memory (module docstring)
        moe = f"{hf}{fam.moe_module}."
        yield moe + "router.weight", ours + "router.weight", ()
        if cfg.router_bias:
            yield moe + "router.bias", ours + "router.bias", ()
        for proj in ("gate_up_proj", "down_proj"):
            yield moe + f"experts.{proj}", ours + f"experts.{proj}", ()
            if cfg.expert_bias:
                yield moe + f"experts.{proj}_bias", ours + f"experts.{proj}_bias", ()
    elif layout == "memory":
        yield hf + "mlp.gate.weight", ours + "router.weight", ()
        if cfg.router.name == "aux_free":  # DeepSeek-V3's selection bias (a buffer of our router)
            yield hf + "mlp.gate.e_score_correction_bias", ours + "router.e_score_correction_bias", ()
        yield hf + "mlp.experts.gate_up_proj", ours + "experts.gate_up_proj", ()
        yield hf + "mlp.experts.down_proj", ours + "experts.down_proj", ()
    else:
        moe = f"{hf}{fam.moe_module}."
        gate, up, down = fam.expert_names
        yield moe + "gate.weight", ours + "router.weight", ()
        if cfg.router.name == "aux_free":
            yield moe + "gate.e_score_correction_bias", ours + "router.e_score_correction_bias", ()
        for e in range(E):
            yield moe + f"experts.{e}.{gate}.weight", ours + "experts.gate_up_proj", (e, slice(0, Hx))
            yield moe + f"experts.{e}.{up}.weight", ours + "experts.gate_up_proj", (e, slice(Hx, 2 * Hx))
            yield moe + f"experts.{e}.{down}.weight", ours + "experts.down_proj", (e,)
    if cfg.resolved_shared_hidden:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            yield hf + f"mlp.{fam.shared_module}.{proj}.weight", ours + f"shared.{proj}.weight", ()
        if cfg.shared_expert_gate:
            yield hf + "mlp.shared_expert_gate.weight", ours + "shared_gate.weight", ()


def hf_tensors(state: dict, cfg: ModelConfig, fam: Family, layout: str = "hub") -> dict:
    """HF name -> tensor of our `state` (a state dict): detached views of ours, or copies in the
    family's layout where it stores a tensor differently (`Family.tensor_transform`)."""
    out, whole = {}, set()
    for hf_name, our_name, index in tensor_rows(cfg, fam, layout):
        if our_name not in state:  # quantized: the family's own stored format (GPT-OSS's MXFP4 experts), or refused
            kept = fam.kept_tensors(state, hf_name, our_name)
            if kept is None:
                raise ConfigError(f"{our_name} is quantized in a format {fam.display_name} checkpoints cannot "
                                  "store; export the full-precision checkpoint")
            out.update(kept)
            continue
        t = state[our_name].detach()[index]
        if index == ():  # a second HF name for a whole tensor of ours (DeepSeek-V3's MTP copies of the
            ptr = t.untyped_storage().data_ptr()  # embedding and head): a copy, as safetensors stores no aliases
            t = t.clone() if ptr in whole else t
            whole.add(ptr)
        transform = fam.tensor_transform(hf_name)
        out[hf_name] = t if transform is None else transform[1](t)
    return out


def copy_hf_tensor_(state: dict, cfg: ModelConfig, fam: Family, hf_sd: dict, skip=()) -> None:
    """Copy the HF tensors of `hf_sd` (memory layout) into our `state`, in place (names in
    `skip` and absent names left alone)."""
    for hf_name, our_name, index in tensor_rows(cfg, fam, "memory"):
        if hf_name in hf_sd and hf_name not in skip:
            transform = fam.tensor_transform(hf_name)
            value = hf_sd[hf_name] if transform is None else transform[0](hf_sd[hf_name])
            state[our_name].detach()[index].copy_(value)


def load_route(cfg: ModelConfig, fam: Family):
    """The `moe.weights` route of an HF checkpoint of `cfg`: either layout (or a mix) loads, so
    does a tied model's extra `lm_head.weight` (checked equal to the embedding)."""
    table: dict[str, list[Placement]] = {}
    for layout in LAYOUTS:
        for hf_name, our_name, index in tensor_rows(cfg, fam, layout):
            places = table.setdefault(hf_name, [])
            transform = fam.tensor_transform(hf_name)
            place = Placement(our_name, index, None if transform is None else transform[0])
            if place not in places:
                places.append(place)

    def route(name: str) -> Optional[list[Placement]]:
        if _DERIVED.search(name):
            return None  # rebuilt from the config
        return table.get(name, [])

    return route
