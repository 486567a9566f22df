"""Next-token cross-entropy fused with the LM head (the "fused linear cross-entropy" of
Liger-Kernel / torchtune, in plain PyTorch).

`linear_cross_entropy(h_ND, w_VD, targets_N)` equals
`F.cross_entropy(h_ND @ w_VD.T, targets_N, ignore_index=-100)` but never holds the full
[N, V] logits: it walks over token chunks, and for each chunk computes the logits, the loss
and, right away, the gradients of h and w (softmax - one_hot), so the backward pass is only a
scale. That saves the logits' memory and two of the passes over them that log_softmax +
nll_loss + their backwards make, which dominate a small model's step on a CPU.
The trainer uses it (it needs no logits); `model(..., return_logits=True)` (the default)
keeps the plain path, which is also the reference in the tests.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_ND, w_VD, targets_N, chunk: int, compute_dtype):
        N = h_ND.shape[0]
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        valid_N = targets_N != IGNORE_INDEX
        n_valid = max(int(valid_N.sum()), 1)
        safe_N = targets_N.clamp_min(0)
        w = w_VD.to(compute_dtype)
        loss = torch.zeros((), dtype=torch.float32, device=h_ND.device)
        grad_h = torch.empty_like(h_ND) if need_grad else None
        grad_w = torch.zeros(w_VD.shape, dtype=torch.float32, device=w_VD.device) if need_grad else None
        for s in range(0, N, chunk):
            h_c = h_ND[s:s + chunk].to(compute_dtype)
            t_c, v_c = safe_N[s:s + chunk], valid_N[s:s + chunk]
            logits_cV = (h_c @ w.T).float()
            target_logit_c = logits_cV.gather(1, t_c[:, None]).squeeze(1)
            # logsumexp by hand so exp(logits - max) is computed once, in place, and reused
            # as the (unnormalised) softmax for the gradient.
            max_c = logits_cV.amax(dim=-1)
            e_cV = logits_cV.sub_(max_c[:, None]).exp_()
            sum_c = e_cV.sum(dim=-1)
            lse_c = max_c + sum_c.log()
            scale_c = v_c.to(torch.float32) / n_valid
            loss += ((lse_c - target_logit_c) * scale_c).sum()
            if need_grad:
                # d loss / d logits = (softmax - one_hot) * valid / n_valid, in place.
                g_cV = e_cV.mul_((scale_c / sum_c)[:, None])
                g_cV.scatter_add_(1, t_c[:, None], -scale_c[:, None])
                g_c = g_cV.to(compute_dtype)
                grad_h[s:s + chunk] = (g_c @ w).to(h_ND.dtype)
                grad_w.addmm_(g_cV.T, h_c.float())
        if need_grad:
            ctx.save_for_backward(grad_h, grad_w.to(w_VD.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss, grad_w * grad_loss, None, None, None


def linear_cross_entropy(h_ND: torch.Tensor, w_VD: torch.Tensor, targets_N: torch.Tensor,
                         chunk: int = 512) -> torch.Tensor:
    """Mean cross-entropy of `h_ND @ w_VD.T` against `targets_N` (-100 ignored), fp32 math.
    Under autocast the matmuls run in the autocast dtype, as `nn.Linear` would."""
    dev = h_ND.device.type
    compute_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h_ND.dtype
    with torch.autocast(dev, enabled=False):
        return _LinearCrossEntropy.apply(h_ND, w_VD, targets_N, chunk, compute_dtype)
