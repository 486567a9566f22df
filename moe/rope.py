"""Rotary inverse frequencies and attention scaling for the HF `rope_type`s the families use:
default, linear, dynamic (NTK), YaRN and llama3, as transformers' `modeling_rope_utils` defines
them (tests/test_rope.py checks each against its `ROPE_INIT_FUNCTIONS`).

`rope_parameters(cfg)` gives `(inv_freq [head_dim / 2], attention_scaling)`; the model's
`Rotary` builds fp32 cos / sin tables from them for `cfg.max_context` positions once, and
multiplies both by `attention_scaling` (YaRN's mscale; 1 for the others), as HF does.

One deliberate difference: HF's `dynamic` recomputes the frequencies every forward from the
batch's longest position (a host sync, and a table that depends on the batch). Here, as in
vLLM, the frequencies are those for the whole extended context (`seq_len = max_context`): the
same at every position and step. They equal HF's when HF sees a sequence of max_context tokens.
"""

from __future__ import annotations

import math

import torch

from moe.config import ModelConfig


def default_inv_freq(theta: float, dim: int, device=None) -> torch.Tensor:
    """theta^(-2i/dim) for i < dim/2, fp32 (the exponent computed in fp32, as HF does)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))


def rope_parameters(cfg: ModelConfig, device: torch.device) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim / 2] fp32, attention_scaling) of `cfg`'s rotary (`cfg.rope_scaling`)."""
    dim, theta, s = cfg.rotary_dim, float(cfg.rope_theta), cfg.rope_scaling
    kind = s.get("rope_type", "default") if s else "default"
    if kind == "default":
        return default_inv_freq(theta, dim, device), 1.0
    factor = float(s["factor"])
    if kind == "linear":
        return default_inv_freq(theta, dim, device) / factor, 1.0
    if kind == "dynamic":
        return _dynamic(theta, dim, factor, cfg.max_seq_len, cfg.max_context, device), 1.0
    if kind == "yarn":
        return _yarn(theta, dim, factor, s, device)
    if kind == "llama3":
        return _llama3(theta, dim, factor, s, device), 1.0
    raise ValueError(f"rope_type={kind!r}")  # validate_model refuses it first


def _dynamic(theta: float, dim: int, factor: float, max_pos: int, seq_len: int, device) -> torch.Tensor:
    # NTK-aware: a larger base, so the lowest frequencies stretch over seq_len / max_pos more.
    seq_len = max(seq_len, max_pos)
    base = theta * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return default_inv_freq(base, dim, device)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(theta: float, dim: int, factor: float, s: dict, device) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): high frequencies extrapolated, low ones interpolated by `factor`,
    a linear ramp between the dims that rotate beta_fast and beta_slow times over the original
    context; attention scaled by 0.1 ln(factor) + 1 (or the mscale ratio, DeepSeek's form)."""
    original = s["original_max_position_embeddings"]
    attention = s.get("attention_factor")
    if attention is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) if m and m_all else _yarn_mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:  # the dim that turns `rotations` times over `original`
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    pos_freqs = theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate
    return interpolation * (1 - keep) + extrapolation * keep, float(attention)


def _llama3(theta: float, dim: int, factor: float, s: dict, device) -> torch.Tensor:
    """Llama 3.1: wavelengths above original / low_freq_factor divided by `factor`, below
    original / high_freq_factor kept, a smooth blend in between."""
    inv_freq = default_inv_freq(theta, dim, device)
    low_f, high_f, original = s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = original / low_f, original / high_f
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)
