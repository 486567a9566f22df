"""Peak activation bytes of one engine forward, from the model's config alone (no model, no forward).

The planner (`python -m moe.engine.memory.plan`) answers from this formula instead of the meta-device
forward of `memory_profile.estimate_peak_activations`: that forward is exact for the code as it is,
but running the model's ops on meta tensors makes PyTorch import its compiler stack (~2 s of CPU)
and costs seconds more on a large config. The formula is an upper bound of that estimate, by
construction: it adds up, at each stage of a block, every buffer the stage allocates (the
sorted dispatch's [T*K, ...] buffers, the attention projections and the rotary temporaries, the
LM head's rows in the model's dtype and in fp32), as if none were freed early.
tests/engine/memory/test_activation_formula.py holds it within [1, 1.35] x the meta estimate on
varied configs (MHA/GQA, MLA, shared experts, dense layers, tied heads; 1.5 for GPT-OSS's clamped
experts, whose temporaries the estimate's stand-in dispatch does not make).
On a GPU the engine measures the forward instead (`cache_size`), so the bound never decides a
real cache size there.
"""

from __future__ import annotations

from moe.config.schema import ModelConfig

FP32 = 4
INDEX = 8  # int64 expert ids and sort orders


def _rotary(n_values: int, b: int) -> int:
    """apply_rotary on `n_values` values a token: the rotated half-swap and the fp32 math (moe/model.py)."""
    return n_values * (2 * b + 3 * FP32)


def _attention(cfg: ModelConfig, T: int, b: int) -> int:
    H, D = cfg.n_heads, cfg.d_model
    cos_sin = 2 * cfg.rotary_dim * FP32  # the gathered rows of the rotary tables
    if cfg.attention_kind == "mla":
        qk, rope = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.qk_rope_head_dim
        per_token = (((cfg.q_lora_rank or 0) * 2 + H * qk * 2  # query latent (+ its norm), query
                      + (cfg.kv_lora_rank + rope) * 3  # kv latent, its norm, the rotary key
                      + H * (cfg.qk_nope_head_dim + cfg.v_head_dim)  # up-projected keys and values
                      + H * max(qk, cfg.v_head_dim) * 2 + D) * b  # keys, output, o_proj
                     + _rotary(H * rope, b) + cos_sin)
    else:
        G, d = cfg.n_kv_heads, cfg.resolved_head_dim
        normed = 2 if (cfg.qk_norm != "none" or cfg.clip_qkv is not None) else 1  # a second copy of q, k, v
        qkv = (H + 2 * G) * d * b * normed  # alive (through views) until the block's output projection
        # the packed queries (and keys: without qk-norm or clipping they are rotated together) and the temporaries
        rotated = H * d if normed == 2 else (H + G) * d
        rotating = rotated * b + _rotary(rotated, b)
        projecting = ((H + G) * d + 2 * H * d + D) * b  # rotated q, k; the output, its reshape; o_proj
        per_token = qkv + max(rotating, projecting) + cos_sin
    return T * per_token + H * T * FP32  # (+ the fused kernel's fp32 logsumexp)


def _routed(cfg: ModelConfig, T: int, b: int) -> int:
    K, E, D, Hx = cfg.router.top_k, cfg.n_experts, cfg.d_model, cfg.expert_hidden
    N = T * K
    hidden = 6 if (cfg.expert_bias or cfg.expert_activation != "swiglu") else 4  # clamped SwiGLU: more temporaries
    # the gathered rows and the expert outputs in the model's dtype, their weighted sum in fp32
    dispatch = N * b * (2 * D + hidden * Hx) + N * D * FP32 + N * INDEX * 3
    routing = T * E * FP32 * 4 + T * K * (FP32 + INDEX) * 2
    shared = cfg.resolved_shared_hidden or 0
    return routing + dispatch + T * b * (3 * shared + 2 * D)  # + the shared FFN and the summed output


def _dense(cfg: ModelConfig, T: int, b: int) -> int:
    hidden = cfg.dense_hidden or cfg.expert_hidden * cfg.router.top_k
    return T * b * (3 * hidden + cfg.d_model)


def peak_activation_bytes(cfg: ModelConfig, num_tokens: int, num_logit_rows: int, dtype_bytes: int) -> int:
    """An upper bound of the peak bytes of one forward at `num_tokens` tokens with the LM head on
    `num_logit_rows` rows (as `estimate_peak_activations` measures it, parameters not counted)."""
    T, b, D = num_tokens, dtype_bytes, cfg.d_model
    R = min(num_logit_rows, num_tokens)
    stream = 3 * T * D * b  # the residual stream, its normed copy and the block's sum
    ffn = max([_routed(cfg, T, b)] * any(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
              + [_dense(cfg, T, b)] * any(not cfg.is_moe_layer(i) for i in range(cfg.n_layers)))
    logits = R * cfg.vocab_size * (b + (FP32 if b != FP32 else 0))  # the rows' logits (+ their fp32 copy)
    head = logits + R * D * b  # and the rows' hidden states
    return stream + max(_attention(cfg, T, b), ffn, head)
