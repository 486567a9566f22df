"""AWQ (Lin et al., 2023, "Activation-aware Weight Quantization"): before int4 round-to-nearest,
scale each input channel of a weight by s = mean|x|^alpha (normalised), alpha searched on a grid
to minimise the layer's output error on calibration activations, and fold 1/s into whatever
produces the input (the preceding RMSNorm gain or projection rows), so the float model is
unchanged and salient channels get finer quantization steps.

Following llm-awq's `auto_scale`: activations are captured from one float forward over the
calibration tokens, scales are searched per group of linears sharing an input, with the
normalisation s / sqrt(max(s) * min(s)) and alpha in {0, 1/n, ..., (n-1)/n} (alpha = 0 is plain
RTN, so on the calibration data AWQ's error is never above RTN's). Not done: llm-awq's second
step, the per-group weight-clipping search.

What the dense recipes do not have, written here for this MoE:
* each expert's `gate_up` scale is searched on the tokens the router sends to that expert
  (captured from the router's own choice), its `down` scale on that expert's SwiGLU
  activations of those tokens;
* the experts' input norm also feeds the router and every other expert, so a per-expert scale
  cannot be folded into it: it stays a runtime input scale [E, D] of `QuantExperts` (one
  multiply per routed token). The `down` scales fold into each expert's own `up` rows, the
  attention input scale into the attention RMSNorm, the `o_proj` scale into the `v` rows of the
  fused qkv projection when there is one v row per o_proj input (n_heads == n_kv_heads; with GQA
  one v row feeds several o_proj inputs, so, as AutoAWQ does, o_proj is left unscaled).
Dense FFNs (dense layers, shared experts) get the same treatment: gate/up scale at runtime (their
input is the shared norm too), down folded into up_proj rows.
"""

from __future__ import annotations

from typing import Callable

import torch

from moe.quant.schemes import Scheme

MAX_ROWS = 4096  # calibration rows used per search (a seeded subsample above this)


def search_scale(w_OI: torch.Tensor, x_NI: torch.Tensor, scheme: Scheme, n_grid: int = 20) -> torch.Tensor:
    """AWQ's per-input-channel scale s [I] for weight w (output error of x @ w^T, MSE)."""
    I = w_OI.shape[1]
    if x_NI.shape[0] == 0:
        return torch.ones(I)
    if x_NI.shape[0] > MAX_ROWS:
        g = torch.Generator().manual_seed(0)
        x_NI = x_NI[torch.randperm(x_NI.shape[0], generator=g)[:MAX_ROWS]]
    w, x = w_OI.detach().float(), x_NI.detach().float()
    ref = x @ w.T
    x_mean = x.abs().mean(0)
    best_err, best_s = float("inf"), torch.ones(I)
    for i in range(n_grid):
        s = x_mean.pow(i / n_grid).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        wq = scheme.fake_quantize(w * s) / s
        err = float((x @ wq.T - ref).pow(2).mean())
        if err < best_err:
            best_err, best_s = err, s
    return best_s


def _capture(model, calib_ids_BT: torch.Tensor, batch: int = 8) -> dict:
    """Inputs of every quantized layer (rows of [N, D]) and each MoE layer's expert choices."""
    store: dict = {}
    handles = []

    def keep(key: str) -> Callable:
        def hook(_mod, args):
            store.setdefault(key, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).float())
        return hook

    def keep_route(key: str) -> Callable:
        def hook(_mod, _args, out):
            store.setdefault(key, []).append(out.experts_TK.detach())
        return hook

    for i, block in enumerate(model.layers):
        handles.append(block.attn.qkv_proj.register_forward_pre_hook(keep(f"{i}.qkv")))
        handles.append(block.attn.o_proj.register_forward_pre_hook(keep(f"{i}.o")))
        handles.append(block.ffn.register_forward_pre_hook(keep(f"{i}.ffn")))
        ffns = [block.ffn] if not block.is_moe else ([block.ffn.shared] if block.ffn.shared is not None else [])
        for j, ffn in enumerate(ffns):
            handles.append(ffn.down_proj.register_forward_pre_hook(keep(f"{i}.dense{j}.down")))
        if block.is_moe:
            handles.append(block.ffn.router.register_forward_hook(keep_route(f"{i}.route")))
    try:
        with torch.no_grad():
            for lo in range(0, calib_ids_BT.shape[0], batch):
                model(calib_ids_BT[lo:lo + batch].to(model.embed.weight.device))
    finally:
        for h in handles:
            h.remove()
    return {k: torch.cat(v) for k, v in store.items()}


@torch.no_grad()
def apply_awq(model, calib_ids_BT: torch.Tensor, scheme: Scheme, n_grid: int = 20) -> dict[str, torch.Tensor]:
    """Search and fold AWQ scales into the float `model` in place (its function is unchanged up
    to rounding); returns the runtime input scales {module path: [I] or [E, I]} of the layers
    whose scale could not be folded. Quantizing comes after (`moe.quant.apply.quantize_model`)."""
    acts = _capture(model, calib_ids_BT)
    runtime: dict[str, torch.Tensor] = {}
    for i, block in enumerate(model.layers):
        attn = block.attn
        # attention input: fold into the attention RMSNorm's gain
        s = search_scale(attn.qkv_proj.weight, acts[f"{i}.qkv"], scheme, n_grid)
        attn.qkv_proj.weight.mul_(s.to(attn.qkv_proj.weight))
        block.attn_norm.weight.div_(s.to(block.attn_norm.weight))
        if attn.n_heads == attn.n_kv_heads:  # one v row per o_proj input: fold into the v rows
            s = search_scale(attn.o_proj.weight, acts[f"{i}.o"], scheme, n_grid)
            v0 = (attn.n_heads + attn.n_kv_heads) * attn.head_dim
            attn.qkv_proj.weight[v0:].div_(s.to(attn.qkv_proj.weight).unsqueeze(1))
            if attn.qkv_proj.bias is not None:
                attn.qkv_proj.bias[v0:].div_(s.to(attn.qkv_proj.bias))
            attn.o_proj.weight.mul_(s.to(attn.o_proj.weight))
        x = acts[f"{i}.ffn"]
        dense = [(f"layers.{i}.ffn", block.ffn)] if not block.is_moe else (
            [(f"layers.{i}.ffn.shared", block.ffn.shared)] if block.ffn.shared is not None else [])
        for j, (path, ffn) in enumerate(dense):
            runtime.update(_dense_ffn(path, ffn, x, acts[f"{i}.dense{j}.down"], scheme, n_grid))
        if block.is_moe:
            runtime[f"layers.{i}.ffn.experts"] = _experts(block.ffn.experts, x, acts[f"{i}.route"], scheme, n_grid)
    return runtime


def _dense_ffn(path: str, ffn, x_ND, h_NH, scheme: Scheme, n_grid: int) -> dict[str, torch.Tensor]:
    w = torch.cat([ffn.gate_proj.weight, ffn.up_proj.weight])
    s = search_scale(w, x_ND, scheme, n_grid)
    ffn.gate_proj.weight.mul_(s.to(w))
    ffn.up_proj.weight.mul_(s.to(w))
    s_down = search_scale(ffn.down_proj.weight, h_NH, scheme, n_grid)
    ffn.up_proj.weight.div_(s_down.to(w).unsqueeze(1))
    ffn.down_proj.weight.mul_(s_down.to(w))
    inv = 1.0 / s
    return {f"{path}.gate_proj": inv, f"{path}.up_proj": inv}


def _experts(experts, x_ND, experts_NK, scheme: Scheme, n_grid: int) -> torch.Tensor:
    """Per expert: the gate_up scale on its routed tokens (kept as a runtime scale), the down
    scale on its SwiGLU activations (folded into its up rows). Returns the runtime scales [E, D]."""
    E, H = experts.n_experts, experts.hidden
    gate_up, down = experts.gate_up_proj, experts.down_proj
    in_scale = torch.ones(E, experts.d_model)
    for e in range(E):
        rows = torch.where((experts_NK == e).any(-1))[0]
        x_e = x_ND[rows]
        w_gu = gate_up[e].float()
        gate, up = (x_e @ w_gu.T).chunk(2, dim=-1)
        h_e = torch.nn.functional.silu(gate) * up  # this expert's down inputs, from the float weights
        s = search_scale(w_gu, x_e, scheme, n_grid)
        s_down = search_scale(down[e], h_e, scheme, n_grid)
        gate_up[e].mul_(s.to(gate_up))
        gate_up[e, H:].div_(s_down.to(gate_up).unsqueeze(1))
        down[e].mul_(s_down.to(down))
        in_scale[e] = 1.0 / s
    return in_scale
