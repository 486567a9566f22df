"""Log-likelihoods of continuations with each shared prefix run once: the harness's numbers, fewer FLOPs.

What is scored is exactly lm-evaluation-harness's `_loglikelihood_tokens` (causal): the model sees
`(context + continuation)[-(max_length + 1):][:-1]`, the continuation's log-probabilities are read
from the last `len(continuation)` positions and summed, and "greedy" says every continuation token
is the argmax. The engine cannot return prompt log-probabilities, so the model's forward is called
directly, in two passes per batch:

  1. the *prefix* of each request (its window minus the scored positions) is grouped with the
     identical prefixes of other requests (a question's choices: the same context), and each
     distinct prefix runs once, right-padded with the other groups' prefixes, its per-layer K/V
     kept (`PrefixKV.capture`); no logits are computed for it;
  2. the *suffix* rows (the scored positions, one row per request) run together, each row's
     attention seeing its group's cached prefix K/V (masked to the prefix's length) and its own
     tokens causally (`PrefixKV.attend`), at positions that continue the prefix.

MoE routing is per token and dropless and padding sits on the right of each part, so a row's
numbers do not depend on its batch. Attention is `scaled_dot_product_attention` over [prefix |
suffix] keys with an explicit mask; it equals the model's causal attention up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from moe.engine.runner.model_runner import only_rows

Request = tuple[tuple[int, ...], tuple[int, ...]]  # (context tokens, continuation tokens)


@dataclass
class Split:
    """One request's model window cut into its unscored prefix and its scored suffix."""

    prefix: tuple[int, ...]  # window positions whose logits are not needed (their K/V are)
    suffix: tuple[int, ...]  # the last len(continuation) window positions: each predicts a continuation token
    continuation: tuple[int, ...]


def split_request(context: Sequence[int], continuation: Sequence[int], max_length: int) -> Split:
    if not context or not continuation:
        raise ValueError("a log-likelihood request needs a non-empty context and continuation "
                         "(the harness puts the prefix token in front of an empty context)")
    if len(continuation) > max_length:
        raise ValueError(f"a continuation of {len(continuation)} tokens is longer than max_length={max_length}")
    window = (tuple(context) + tuple(continuation))[-(max_length + 1):][:-1]
    n = len(continuation)
    return Split(window[:-n], window[-n:], tuple(continuation))


class PrefixKV:
    """The `kv_context` the model's attention layers call (`attend(layer, q, k, v)`): in `capture`
    mode it attends causally and keeps each layer's K/V of the prefixes; in `suffix` mode it
    attends each row over its group's kept prefix K/V and itself."""

    def __init__(self):
        self.k: dict[int, torch.Tensor] = {}  # layer -> [n_groups, G, P, d]
        self.v: dict[int, torch.Tensor] = {}
        self.capturing = True
        self.row_group: Optional[torch.Tensor] = None  # [B] group of each suffix row
        self.mask_B1SK: Optional[torch.Tensor] = None  # [B, 1, S, P + S] bool: which keys each query sees

    def start_suffix(self, row_group_B: torch.Tensor, prefix_len_B: torch.Tensor, width_P: int, width_S: int):
        self.capturing = False
        self.row_group = row_group_B
        device = row_group_B.device
        key_P = torch.arange(width_P, device=device)
        prefix_ok_BP = key_P.unsqueeze(0) < prefix_len_B.unsqueeze(1)
        causal_SS = torch.ones(width_S, width_S, dtype=torch.bool, device=device).tril()
        B = row_group_B.shape[0]
        self.mask_B1SK = torch.cat([prefix_ok_BP[:, None, None, :].expand(B, 1, width_S, width_P),
                                    causal_SS.expand(B, 1, width_S, width_S)], dim=-1)

    def attend(self, layer_idx: int, q_BHTd: torch.Tensor, k_BGTd: torch.Tensor, v_BGTd: torch.Tensor) -> torch.Tensor:
        gqa = q_BHTd.shape[1] != k_BGTd.shape[1]
        if self.capturing:
            self.k[layer_idx], self.v[layer_idx] = k_BGTd, v_BGTd
            return F.scaled_dot_product_attention(q_BHTd, k_BGTd, v_BGTd, is_causal=True, enable_gqa=gqa)
        if layer_idx in self.k:
            k_BGKd = torch.cat([self.k[layer_idx][self.row_group], k_BGTd], dim=2)
            v_BGKd = torch.cat([self.v[layer_idx][self.row_group], v_BGTd], dim=2)
        else:  # no row of this batch has a prefix
            k_BGKd, v_BGKd = k_BGTd, v_BGTd
        mask = self.mask_B1SK[..., -k_BGKd.shape[2]:]
        return F.scaled_dot_product_attention(q_BHTd, k_BGKd, v_BGKd, attn_mask=mask, enable_gqa=gqa)


def _right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def _batches(groups: dict[tuple, list[int]], splits: list[Split], batch_size: int) -> list[list[tuple[tuple, list[int]]]]:
    """Lists of (prefix, request indices) with at most `batch_size` suffix rows each, longest
    first (a group larger than a batch is cut in pieces, each running its prefix again)."""
    pieces = []
    for prefix, idx in groups.items():
        for s in range(0, len(idx), batch_size):
            pieces.append((prefix, idx[s:s + batch_size]))
    pieces.sort(key=lambda p: -(len(p[0]) + max(len(splits[i].suffix) for i in p[1])))
    batches, current, rows = [], [], 0
    for piece in pieces:
        if current and rows + len(piece[1]) > batch_size:
            batches.append(current)
            current, rows = [], 0
        current.append(piece)
        rows += len(piece[1])
    if current:
        batches.append(current)
    return batches


@torch.inference_mode()
def score_batch(model, batch: list[tuple[tuple, list[int]]], splits: list[Split], device: torch.device,
                pad_id: int) -> dict[int, tuple[float, bool]]:
    """{request index: (sum of continuation log-probs, greedy)} for one batch of prefix groups."""
    kv = PrefixKV()
    prefix_lens = [len(p) for p, _ in batch]
    width_P = max(prefix_lens)
    if width_P:  # pass 1: every distinct prefix once, no logits
        prefixes = _right_padded([p if p else (pad_id,) for p, _ in batch], pad_id).to(device)
        with only_rows(model, torch.zeros(0, dtype=torch.long, device=device)):
            model(prefixes, kv_context=kv)
    rows = [(g, i) for g, (_, idx) in enumerate(batch) for i in idx]
    suffixes = [splits[i].suffix for _, i in rows]
    ids_BS = _right_padded(suffixes, pad_id).to(device)
    width_S = ids_BS.shape[1]
    row_group = torch.tensor([g for g, _ in rows], dtype=torch.long, device=device)
    prefix_len_B = torch.tensor([prefix_lens[g] for g, _ in rows], dtype=torch.long, device=device)
    lengths_B = torch.tensor([len(s) for s in suffixes], dtype=torch.long, device=device)
    offsets_S = torch.arange(width_S, device=device)
    # padding positions (past a row's own suffix) are clamped to its last real one: in range of the rotary tables
    positions_BS = prefix_len_B.unsqueeze(1) + torch.minimum(offsets_S.unsqueeze(0), (lengths_B - 1).unsqueeze(1))
    kv.start_suffix(row_group, prefix_len_B, width_P, width_S)
    logits_BSV = model(ids_BS, positions=positions_BS, kv_context=kv).logits  # pass 2
    logprobs_BSV = torch.log_softmax(logits_BSV.float(), dim=-1)
    out = {}
    for b, (_, i) in enumerate(rows):
        cont = torch.tensor(splits[i].continuation, dtype=torch.long, device=device)
        lp_SV = logprobs_BSV[b, :len(cont)]
        lp = lp_SV.gather(1, cont.unsqueeze(1)).squeeze(1)
        # summed in fp32, as the harness does (`float(logits.sum())`): the same rounding as `hf`
        out[i] = (float(lp.sum()), bool((lp_SV.argmax(dim=-1) == cont).all()))
    return out


def score_requests(model, requests: Sequence[Request], max_length: int, batch_size: int = 32,
                   device: Optional[torch.device] = None, pad_id: int = 0) -> tuple[list[tuple[float, bool]], dict]:
    """[(log-likelihood, greedy)] in request order, and counts of what ran (for the logs and the
    benchmark: `prefix_tokens` is what prefix sharing computed, `prefix_tokens_unshared` what it
    would have without it)."""
    device = device or next(model.parameters()).device
    unique = list(dict.fromkeys((tuple(c), tuple(x)) for c, x in requests))  # identical requests score once
    splits = [split_request(c, x, max_length) for c, x in unique]
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(splits):
        groups.setdefault(s.prefix, []).append(i)
    results: dict[int, tuple[float, bool]] = {}
    batches = _batches(groups, splits, batch_size)
    for batch in batches:
        results.update(score_batch(model, batch, splits, device, pad_id))
    index = {r: i for i, r in enumerate(unique)}
    stats = {"requests": len(requests), "unique_requests": len(unique), "prefix_groups": len(groups),
             "forwards": 2 * len(batches), "prefix_tokens": sum(len(p) for b in batches for p, _ in b),
             "prefix_tokens_unshared": sum(len(s.prefix) for s in splits),
             "suffix_tokens": sum(len(s.suffix) for s in splits)}
    return [results[index[(tuple(c), tuple(x))]] for c, x in requests], stats
