"""The MoE transformer: one readable file, one model for training and inference.

Decoder-only, pre-norm RMSNorm, grouped-query attention with rotary embeddings (optional
q/k/v and output biases, qk-norm, q/k/v clamping; per layer full or sliding-window, optional
attention sinks), and an MoE (or, for the layers listed by
`n_dense_layers` / `dense_layers`, dense) SwiGLU feed-forward in every block; the MoE layer may
add a (sigmoid-gated) shared expert. These options are what the pretrained families need
(Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE): `moe/hf/families/` converts their checkpoints both ways. Inference engines pass a `kv_context` that owns the KV cache; without one,
attention is plain causal attention over the batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from moe.attention import ATTENTION_BACKENDS, MultiHeadLatentAttention
from moe.attention.document_mask import document_causal_mask
from moe.config import ModelConfig, validate_model
from moe.errors import ConfigError
from moe.loss import linear_cross_entropy
from moe.routing.metrics import MoERecord
from moe.experts import EXPERT_DISPATCH
from moe.moe_layer import MoE, SwiGLU
from moe.mtp import MultiTokenPrediction
from moe import perf
from moe.profiling import stage
from moe.rope import rope_parameters
from moe.routing.routers import ROUTERS, rebuild_router
from moe.variants import resolve_model


def check_variants(cfg: ModelConfig) -> None:
    """Look the model's variant names up in the registries that own them, without building
    anything: an unknown name is a ConfigError listing the known ones, a variant that cannot run
    here an UnavailableError saying why. Entry points call this at start-up, before minutes of
    data preparation; building the model does the same lookups."""
    ROUTERS.lookup(cfg.router.name)
    ATTENTION_BACKENDS.get(cfg.attention.name)
    EXPERT_DISPATCH.get(cfg.experts.name)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (as Mixtral does) so bf16 activations keep their precision. (An fp32 input skips
        # the two casts, each a no-op call: 9 norms a decode step.)
        fp32 = x.dtype == torch.float32
        x32 = x if fp32 else x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x32 if fp32 else x32.to(x.dtype))


class Rotary(nn.Module):
    """Rotary position embedding tables (the "rotate half" layout of HF Llama/Mixtral), with the
    config's RoPE scaling (`moe/rope.py`: linear, dynamic, YaRN, llama3).

    The tables cover `cfg.max_context` positions, built once (and again on a device move), so the
    forward is a pure gather: no host sync, nothing data-dependent for CUDA graphs. They are always
    fp32 and rebuilt from the config: `model.to(bf16)` must not round them (cos at position 4000
    would be off by 0.5), so they are not cast with the model.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg, self.length = cfg, cfg.max_context
        self.cos = self.sin = torch.empty(0)
        self._build(torch.device("cpu"))

    def extend(self, n: int) -> None:
        """Tables for at least `n` positions: past the model's context only on an explicit request
        (the engine's `allow_long_context`), once, before any step."""
        if n > self.length:
            self.length = n
            self._build(self.cos.device)

    def _build(self, device: torch.device) -> None:
        if device.type == "meta":  # shapes only; computing them on meta costs seconds (lazy meta registrations)
            self.cos = self.sin = torch.empty(self.length, self.cfg.rotary_dim, device=device)
            return
        inv_freq, scaling = rope_parameters(self.cfg, device)
        freqs = torch.outer(torch.arange(self.length, dtype=torch.float32, device=device), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos() * scaling, emb.sin() * scaling  # YaRN's attention scaling (1: others)

    def _apply(self, fn, recurse=True):
        # Follow the model's device but never its dtype.
        probe = fn(torch.empty(0))
        if probe.device != self.cos.device:
            self._build(probe.device)
        return super()._apply(fn, recurse)

    def forward(self, positions: torch.Tensor):
        """cos/sin for `positions` (any shape, each < max_context), fp32, shape positions.shape + (head_dim,)."""
        n = self.cos.shape[0]
        # Checked where it costs no device sync (CPU tensors, not under torch.compile); on a GPU an
        # out-of-range gather is a device-side assert, and the engine and trainer bound positions.
        if positions.device.type == "cpu" and positions.numel() and not torch.compiler.is_compiling() \
                and int(positions.max()) >= n:
            raise ConfigError(f"position {int(positions.max())} is beyond the {n} positions of the rotary tables "
                              f"(model.max_seq_len={self.cfg.max_seq_len}, model.rope_scaling="
                              f"{self.cfg.rope_scaling}); set model.rope_scaling to go further")
        return self.cos[positions], self.sin[positions]


def apply_rotary(x_BHTd: torch.Tensor, cos_BTd: torch.Tensor, sin_BTd: torch.Tensor) -> torch.Tensor:
    cos, sin = cos_BTd.unsqueeze(1), sin_BTd.unsqueeze(1)  # broadcast over heads
    x1, x2 = x_BHTd.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    if x_BHTd.dtype in (torch.float32, torch.float64):  # (no no-op casts: 13.5 -> 9.7 us a decode call, plan_1205)
        return x_BHTd * cos + rotated * sin
    wide = torch.promote_types(x_BHTd.dtype, torch.float32)  # fp32 math for bf16
    return (x_BHTd.to(wide) * cos + rotated.to(wide) * sin).to(x_BHTd.dtype)


class Attention(nn.Module):
    """Grouped-query attention. Stages: fused qkv projection (optional biases) -> optional
    qk-norm (`full`: RMSNorm over the whole q / k projection output, OLMoE; `head`: per-head
    RMSNorm, Qwen3) -> optional clamp of q, k, v (`clip_qkv`) -> rotary on q, k -> attention
    (the configured backend, or the inference context's paged cache) -> output projection."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim
        H, G, d = self.n_heads, self.n_kv_heads, self.head_dim
        self.qkv_proj = nn.Linear(cfg.d_model, (H + 2 * G) * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(H * d, cfg.d_model, bias=cfg.attn_out_bias)
        self.qk_norm, self.clip_qkv = cfg.qk_norm, cfg.clip_qkv
        if cfg.qk_norm != "none":
            full = cfg.qk_norm == "full"
            self.q_norm = RMSNorm(H * d if full else d, cfg.norm_eps)
            self.k_norm = RMSNorm(G * d if full else d, cfg.norm_eps)
        self.backend = ATTENTION_BACKENDS.get(cfg.attention.name)()
        # This layer's kind (model.layer_types): its sliding window (None = full) and, with
        # model.attention_sinks, a learned sink logit per query head (GPT-OSS).
        self.window = cfg.layer_window(layer_idx)
        self.backend.check_layer_options(self.window, cfg.attention_sinks)
        self.sinks = nn.Parameter(torch.empty(H)) if cfg.attention_sinks else None

    def forward(self, x_BTD, cos_BTd, sin_BTd, kv_context: Any = None, attn_mask=None) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, G, d = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.qkv_proj(x_BTD)
        if self.qk_norm == "none" and self.clip_qkv is None:
            # q and k side by side in the projection: packed and rotated as one [B, H + G, T, d] tensor (the same
            # elementwise values as rotating each; half the calls: ~9 fewer ops per layer in a decode step)
            qk_BNTd = apply_rotary(qkv[..., :(H + G) * d].view(B, T, H + G, d).transpose(1, 2).contiguous(),
                                   cos_BTd, sin_BTd)
            q_BHTd, k_BGTd = qk_BNTd.split([H, G], dim=1)
            v_BGTd = qkv[..., (H + G) * d:].view(B, T, G, d).transpose(1, 2)
        else:
            q_BHTd, k_BGTd, v_BGTd = self._normed_rotated(qkv, B, T, cos_BTd, sin_BTd)
        o_BHTd = self._attend(q_BHTd, k_BGTd, v_BGTd, kv_context, attn_mask)
        return self.o_proj(o_BHTd.transpose(1, 2).reshape(B, T, H * d))

    def _normed_rotated(self, qkv, B, T, cos_BTd, sin_BTd):
        """q, k, v with the layer's qk-norm and clipping, then q and k rotated (each on its own)."""
        H, G, d = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = qkv.split([H * d, G * d, G * d], dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q_BTHd, k_BTGd, v_BTGd = q.view(B, T, H, d), k.view(B, T, G, d), v.view(B, T, G, d)
        if self.qk_norm == "head":
            q_BTHd, k_BTGd = self.q_norm(q_BTHd), self.k_norm(k_BTGd)
        if self.clip_qkv is not None:
            c = self.clip_qkv
            q_BTHd, k_BTGd, v_BTGd = q_BTHd.clamp(-c, c), k_BTGd.clamp(-c, c), v_BTGd.clamp(-c, c)
        # Packing the strided head views first makes rotary's elementwise passes (and their
        # backward) ~1.5x faster on CPU than working on the transposed slices of qkv.
        q_BHTd = apply_rotary(q_BTHd.transpose(1, 2).contiguous(), cos_BTd, sin_BTd)
        k_BGTd = apply_rotary(k_BTGd.transpose(1, 2).contiguous(), cos_BTd, sin_BTd)
        return q_BHTd, k_BGTd, v_BTGd.transpose(1, 2)

    def _attend(self, q_BHTd, k_BGTd, v_BGTd, kv_context, attn_mask) -> torch.Tensor:
        """The configured backend, or the inference context's paged cache, with this layer's options."""
        if kv_context is None:
            return self.backend(q_BHTd, k_BGTd, v_BGTd, causal=True, window=self.window, sinks_H=self.sinks,
                                attn_mask=attn_mask)
        if self.window is None and self.sinks is None:
            return kv_context.attend(self.layer_idx, q_BHTd, k_BGTd, v_BGTd)
        return kv_context.attend(self.layer_idx, q_BHTd, k_BGTd, v_BGTd, window=self.window, sinks_H=self.sinks)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        mla = cfg.attention_kind == "mla"  # DeepSeek's Multi-head Latent Attention (moe/attention/mla.py)
        self.attn = MultiHeadLatentAttention(cfg, layer_idx, RMSNorm) if mla else Attention(cfg, layer_idx)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.is_moe = cfg.is_moe_layer(layer_idx)
        if self.is_moe:
            self.ffn = MoE(cfg)
        else:
            self.ffn = SwiGLU(cfg.d_model, cfg.dense_hidden or cfg.expert_hidden * cfg.router.top_k)

    def forward(self, x_BTD, cos, sin, token_ids_BT=None, kv_context=None, attn_mask=None, need_records=True):
        with stage("attention"):
            x_BTD = x_BTD + self.attn(self.attn_norm(x_BTD), cos, sin, kv_context, attn_mask)
        h = self.ffn_norm(x_BTD)
        if self.is_moe:
            y, aux_loss, record = self.ffn(h, token_ids_BT, need_records)
            return x_BTD + y, aux_loss, record
        return x_BTD + self.ffn(h), None, None


@dataclass
class ModelOutput:
    logits: Optional[torch.Tensor]  # [B, T, V]; None when return_logits=False
    loss: Optional[torch.Tensor] = None  # lm_loss + router losses (when labels/targets given)
    lm_loss: Optional[torch.Tensor] = None
    aux_loss: Optional[torch.Tensor] = None  # sum over layers of the weighted router losses
    moe_records: list[MoERecord] = field(default_factory=list)
    # with MTP modules (model.mtp_depth) and targets: per depth, the mean cross-entropy and top-1 accuracy
    mtp_losses: list[torch.Tensor] = field(default_factory=list)
    mtp_accuracies: list[torch.Tensor] = field(default_factory=list)


class Transformer(nn.Module):
    """Stages of `forward`: embed -> blocks (attention + MoE/dense FFN, each pre-norm with a
    residual) -> final norm -> LM head -> (loss: next-token cross-entropy + router losses)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg = resolve_model(cfg)  # the variants' own Configs (moe/variants.py), validated
        if cfg.vocab_size is None:
            raise ConfigError("model.vocab_size must be set (train.py takes it from the tokenizer)")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rotary = Rotary(cfg)
        # Multi-token prediction (moe/mtp.py): each module's block is built as the last layer's (its FFN
        # kind, MoE or dense, and its attention settings); the engine gives it a KV cache of its own.
        self.mtp = MultiTokenPrediction(cfg.mtp_depth, cfg.d_model, lambda _k: Block(cfg, cfg.n_layers - 1),
                                        lambda: RMSNorm(cfg.d_model, cfg.norm_eps)) if cfg.mtp_depth else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)  # residual-branch outputs (GPT-2)
        for name, p in self.named_parameters():
            if name.endswith((".bias", "_bias")):
                nn.init.zeros_(p)  # projection, router and expert biases
            elif name.endswith(".sinks"):
                nn.init.normal_(p, 0.0, std)  # attention sink logits (as HF's GPT-OSS)
            elif p.dim() == 1:
                nn.init.ones_(p)  # RMSNorm gains
            elif name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, input_ids: torch.Tensor, labels: Optional[torch.Tensor] = None,
                targets: Optional[torch.Tensor] = None, positions: Optional[torch.Tensor] = None,
                kv_context: Any = None, return_logits: bool = True,
                segments: Optional[torch.Tensor] = None, need_records: bool = True) -> ModelOutput:
        """`labels` follow HF's convention (aligned with input_ids, shifted here, -100 ignored);
        `targets` are already the next tokens (aligned with the logits). `positions`
        default to 0..T-1 for every row. With a loss to compute, `return_logits=False` fuses
        the LM head into the cross-entropy (`moe/loss.py`) and skips the [B, T, V] logits.
        `segments` (packed rows: the document id of each token, with `positions` restarting per
        document) keeps attention inside each document (`moe/attention/document_mask.py`).
        `need_records=False` (eval mode only: inference that reads no routing statistics) skips the
        routers' losses and the routing records: `aux_loss` None, `moe_records` empty, the same logits."""
        if not need_records and self.training:
            raise ValueError("need_records=False skips the router losses training needs: call model.eval() first")
        B, T = input_ids.shape
        if positions is None:
            if T > self.rotary.length:  # a shape, known on the host: no sync (longer only by Rotary.extend)
                raise ConfigError(f"a sequence of {T} tokens is longer than the model's context "
                                  f"{self.cfg.max_context} (model.max_seq_len, model.rope_scaling)")
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        cos, sin = self.rotary(positions)
        x = self.embed(input_ids)
        attn_mask = document_causal_mask(segments) if segments is not None else None
        aux_total, records = None, []
        for block in self.layers:
            x, aux, rec = block(x, cos, sin, input_ids, kv_context, attn_mask, need_records)
            if rec is not None:
                records.append(rec)
                aux_total = aux if aux_total is None else aux_total + aux
        h = self.norm(x)
        if labels is not None:
            targets = torch.cat([labels[:, 1:], labels.new_full((B, 1), -100)], dim=1)
        fused = targets is not None and not return_logits
        logits = None if fused else self.lm_head(h)
        out = ModelOutput(logits=logits, aux_loss=aux_total, moe_records=records)
        if targets is not None:
            if fused:
                out.lm_loss = linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.lm_head.weight, targets.reshape(-1))
            else:
                out.lm_loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                              ignore_index=-100)
            if self.mtp is not None:  # the MTP losses: the trainer weighs them (train.mtp_loss_coef)
                mtp = self.mtp(x, input_ids, targets, self.embed, self.lm_head, cos, sin, fused)
                out.mtp_losses, out.mtp_accuracies = mtp.losses, mtp.accuracies
                if mtp.aux_loss is not None:  # the MTP blocks' routers balance like the others
                    aux_total = mtp.aux_loss if aux_total is None else aux_total + mtp.aux_loss
                    out.aux_loss = aux_total
            out.loss = out.lm_loss + aux_total if aux_total is not None else out.lm_loss
        return out

    # ------------------------------------------------------------------ routing ablations
    def set_routing(self, top_k: Optional[int] = None, drop_experts: Optional[list] = None,
                    renormalize: Optional[bool] = None) -> None:
        """Change how tokens are routed without retraining (an inference-time ablation): `top_k`
        experts per token, `drop_experts` removed from every router (never selected, the softmax
        over the rest), `renormalize` the k weights or not. None keeps a setting. The routers are
        rebuilt from the new config around their own weights and buffers (no copy); `self.cfg`
        becomes the new config, so accounting (`num_params(active=True)`) follows."""
        changes = {k: v for k, v in dict(top_k=top_k, drop_experts=drop_experts, renormalize=renormalize).items()
                   if v is not None}
        if "drop_experts" in changes:
            changes["drop_experts"] = [int(e) for e in changes["drop_experts"]]
        cfg = dataclasses.replace(self.cfg, router=dataclasses.replace(self.cfg.router, **changes))
        validate_model(cfg)
        for block in self.layers:
            if not block.is_moe:
                continue
            block.ffn.router = rebuild_router(
                block.ffn.router, cfg, f"router={cfg.router.name!r} cannot change {sorted(changes)} after training")
        self.cfg = cfg

    # ------------------------------------------------------------------ accounting
    def num_params(self, active: bool = False, embedding: bool = True) -> int:
        """Parameter count; `active=True` counts only top_k of the routed experts per layer
        (what one token uses); `embedding=False` leaves out the input embedding table."""
        n = sum(p.numel() for p in self.parameters())
        if not embedding and not self.cfg.tie_embeddings:
            n -= self.embed.weight.numel()
        if active:
            k, E = self.cfg.router.top_k, self.cfg.n_experts
            mtp_blocks = [m.block for m in self.mtp.layers] if self.mtp is not None else []
            for block in [*self.layers, *mtp_blocks]:
                if block.is_moe:
                    per_expert = sum(p.numel() for p in block.ffn.experts.parameters()) // E
                    n -= (E - k) * per_expert
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward): 6 per active matmul
        parameter plus attention's 12 * L * H * d * T (nanoGPT / PaLM convention)."""
        c = self.cfg
        # A tied table stays in: it is the LM head's matmul (embedding lookups are free).
        matmul_params = self.num_params(active=True, embedding=False)
        attn = 12 * c.n_layers * c.n_heads * c.resolved_head_dim * seq_len
        return 6 * matmul_params + attn

    def estimate_mfu(self, tokens_per_s: float, seq_len: int, peak_flops: float) -> float:
        """Model FLOPs utilisation: achieved training FLOP/s over the device's peak (a ValueError
        when it would exceed 1: then `peak_flops` is not the device's peak; see `moe.perf`)."""
        return perf.mfu(self.flops_per_token(seq_len) * tokens_per_s, peak_flops)
