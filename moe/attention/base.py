"""The two attention interfaces and their registries.

* `AttentionBackend` (`ATTENTION_BACKENDS`, config field `attention.name`): causal attention
  over a batch, for training and plain forwards. `backend(q_BHTd, k_BGTd, v_BGTd, causal,
  window, sinks_H)` with H query heads and G <= H key/value heads (grouped-query attention,
  H % G == 0) -> `o_BHTd`.
* `PagedAttentionBackend` (`PAGED_BACKENDS`, engine option `attention_backend`): attention
  against the engine's paged KV cache: `write` new K/V into their slots, `decode` one query per
  sequence, `prefill` varlen chunks (semantics: the references in `kernels/paged_attention`).

Both take a layer's attention options: `window` (None, or a sliding window: a query sees the
last `window` positions, itself included, as HF's sliding-window mask) and `sinks_H` (None, or
a learned logit per query head that joins the softmax denominator with no value, GPT-OSS). A
backend that cannot honour one says so in `supports_window` / `supports_sinks`, and
`check_layer_options` makes asking for it a ConfigError naming the model option and the backend
option: never a silent full attention.

Each backend is a class registered by name; `unavailable_reason()` (a staticmethod, None when
it can run) is its one availability check, asked by `Registry.get`, so a backend that cannot run
here fails when the model or engine is built with an `UnavailableError` saying why.
"""

from __future__ import annotations

from typing import Optional

import torch

from moe.errors import ConfigError
from moe.registry import Registry


class LayerOptions:
    """What a backend can honour of the per-layer attention options, and the one check of it."""

    name = "base"
    option = "attention.name"  # the config field / engine option that chose the backend
    supports_window = True
    supports_sinks = True

    @classmethod
    def check_layer_options(cls, window: Optional[int], sinks: bool) -> None:
        if window is not None and not cls.supports_window:
            raise ConfigError(f"model.sliding_window={window} (a sliding-window layer) is not supported by "
                              f"{cls.option}={cls.name!r}; choose another {cls.option} or drop the window")
        if sinks and not cls.supports_sinks:
            raise ConfigError(f"model.attention_sinks=true is not supported by {cls.option}={cls.name!r}; "
                              f"choose another {cls.option}")

    @classmethod
    def check_model(cls, cfg) -> None:
        """`check_layer_options` for every layer of the model config `cfg`."""
        for i in range(cfg.n_layers):
            cls.check_layer_options(cfg.layer_window(i), cfg.attention_sinks)


class AttentionBackend(LayerOptions):
    name = "base"

    @staticmethod
    def unavailable_reason() -> Optional[str]:
        return None

    def __call__(self, q_BHTd: torch.Tensor, k_BGTd: torch.Tensor, v_BGTd: torch.Tensor, causal: bool = True,
                 window: Optional[int] = None, sinks_H: Optional[torch.Tensor] = None,
                 attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`window`: keys within the last `window` positions only; `sinks_H`: one learned logit per
        head in the softmax denominator; `attn_mask`: None, or a packed row's boolean document mask
        [B, 1, T, S] (True = attend, causal already; `document_mask.py`) that replaces the causal
        mask (a window still applies inside it)."""
        raise NotImplementedError


class PagedAttentionBackend(LayerOptions):
    """What the engine's kv context calls: `write`, `decode`, `prefill` (`max_seqlen_q` is a host
    int the engine already knows; `window` and `sinks_H` the layer's options, module docstring).
    `check_config` raises a ConfigError naming the engine option that this backend cannot serve
    (block size, dtype, device)."""

    name = "base"
    option = "attention_backend"

    @staticmethod
    def unavailable_reason() -> Optional[str]:
        return None

    def check_config(self, block_size: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        pass

    def plan_write(self, slot_mapping):
        """What a step's cache writes can work out once from its slot mapping for every layer (the
        kv context calls this at the step's first layer and hands the result to each `write` with
        that mapping as `plan`); None (the default): nothing, `write` is called without a plan."""
        return None

    def write(self, k, v, k_cache, v_cache, slot_mapping, plan=None) -> None:
        raise NotImplementedError

    def plan_decode(self, block_tables, context_lens, block_size: int):
        """What a step's decode can work out once from its tables for every layer that reads them
        (the kv context calls this at the step's first decoding layer and hands the result to each
        `decode` with those tables as `plan`); None (the default): nothing to work out."""
        return None

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale, window=None, sinks_H=None, plan=None):
        raise NotImplementedError

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q,
                window=None, sinks_H=None):
        raise NotImplementedError


ATTENTION_BACKENDS: Registry[type[AttentionBackend]] = Registry("attention.name", package="moe.attention")
PAGED_BACKENDS: Registry[type[PagedAttentionBackend]] = Registry("attention_backend", package="moe.attention")


def allowed_mask(T: int, S: int, window: Optional[int], device) -> torch.Tensor:
    """[T, S] bool: which keys each query may see when the T queries are the last T of S
    positions (bottom-right aligned causal mask), within `window` positions when set."""
    q_pos_T1 = torch.arange(S - T, S, device=device)[:, None]
    k_pos_1S = torch.arange(S, device=device)[None, :]
    allowed = k_pos_1S <= q_pos_T1
    if window is not None:
        allowed = allowed & (k_pos_1S > q_pos_T1 - window)
    return allowed


def with_sink_column(q_BHTd, k_BGTd, v_BGTd, allowed_TS, sinks_H):
    """Attention sinks for `scaled_dot_product_attention`, which has no argument for them: k and
    v with one more position of zeros, and the additive [H, T, S + 1] mask that gives that key
    each head's sink logit (q . 0 + sink) and -inf where `allowed_TS` forbids. The sink joins
    the softmax denominator and its zero value adds nothing to the output."""
    B, G, S, d = k_BGTd.shape
    H, T = q_BHTd.shape[1], q_BHTd.shape[2]
    zero_BG1d = k_BGTd.new_zeros(B, G, 1, d)
    k_BGSd = torch.cat([k_BGTd, zero_BG1d], dim=2)
    v_BGSd = torch.cat([v_BGTd, zero_BG1d], dim=2)
    bias_HTS = q_BHTd.new_zeros(H, T, S + 1)
    bias_HTS[:, :, :S].masked_fill_(~allowed_TS, float("-inf"))
    bias_HTS[:, :, S] = sinks_H.to(q_BHTd.dtype)[:, None]
    return k_BGSd, v_BGSd, bias_HTS


def repeat_kv(k_BGTd: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Expand G kv heads to G * n_rep heads (each kv head serves n_rep query heads)."""
    if n_rep == 1:
        return k_BGTd
    return k_BGTd.repeat_interleave(n_rep, dim=1)
