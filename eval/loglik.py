"""Batched log-likelihood of continuations, exactly as lm-evaluation-harness's HFLM computes it.

Encoding (`encode_pair`, the harness's `_encode_pair`): trailing spaces of the context move to
the continuation; the continuation's tokens are those of `encode(context + continuation)` after
the first `len(encode(context))` tokens, so a token that straddles the boundary is scored as
part of the continuation, as the harness does. `encode` is the tokenizer's plain encode: for a
moe-lab tokenizer nothing (no BOS) is added, as with the harness on our HF export.

Scoring (`loglikelihoods`, the harness's `_loglikelihood_tokens`): the model sees
`(context + continuation)[-(max_length + 1):][:-1]` (left truncation to the model's length);
requests are sorted by total length (longest first), right-padded into batches, one forward
per batch, `log_softmax` over the vocabulary, and the continuation's log-probabilities are read
from the last `len(continuation)` positions of each row and summed (only those positions go
through the LM head and the softmax; the others' logits are never needed). Identical requests are
scored once. Padding is on the right and attention is causal, so a row's scores do not depend
on the rest of its batch (MoE routing is per token and dropless; with a capacity factor, it
would).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional, Sequence

import torch

log = logging.getLogger("moe.eval")

Request = tuple[tuple[int, ...], tuple[int, ...]]  # (context tokens, continuation tokens)


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) as the harness's `_encode_pair`."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    return list(ctx), list(whole[len(ctx):])


def model_window(context: Sequence[int], continuation: Sequence[int], max_length: int) -> list[int]:
    """The tokens the model is fed for one request (left-truncated to max_length)."""
    return (list(context) + list(continuation))[-(max_length + 1):][:-1]


@torch.no_grad()
def loglikelihoods(model, requests: Sequence[Request], max_length: int, batch_size: int = 32,
                   device: Optional[torch.device] = None, pad_id: int = 0,
                   progress_every: float = 30.0) -> tuple[list[tuple[float, bool]], dict]:
    """[(sum of continuation log-probs, whether every continuation token is the argmax)] in
    request order, and timing stats."""
    device = device or next(model.parameters()).device
    unique = sorted(set((tuple(c), tuple(x)) for c, x in requests),
                    key=lambda r: (-len(r[0] + r[1]), r[0] + r[1]))  # the harness's order
    for ctx, cont in unique:
        if not ctx:
            raise ValueError("a request has an empty context (the harness scores those after the EOT token; "
                             "not needed here)")
        if not cont:
            raise ValueError("a request has an empty continuation")
        if len(cont) > max_length:
            raise ValueError(f"a continuation of {len(cont)} tokens is longer than max_length={max_length}")
    results: dict[Request, tuple[float, bool]] = {}
    t0 = last = time.perf_counter()
    n_tokens = 0
    for start in range(0, len(unique), batch_size):
        chunk = unique[start:start + batch_size]
        windows = [model_window(c, x, max_length) for c, x in chunk]
        width = max(len(w) for w in windows)
        batch = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        for i, w in enumerate(windows):
            batch[i, :len(w)] = torch.tensor(w, dtype=torch.long)
        n_tokens += sum(len(w) for w in windows)
        with _lm_head_deferred(model) as head:
            out = model(batch.to(device)).logits  # the final hidden states when the head is deferred
            # positions predicting the continuation tokens, all rows together
            picked = torch.cat([out[i, len(w) - len(x):len(w)] for i, ((_, x), w) in enumerate(zip(chunk, windows))])
            logits = head(picked) if head is not None else picked
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        offset = 0
        for (ctx, cont) in chunk:
            rows = logprobs[offset:offset + len(cont)]
            offset += len(cont)
            target = torch.tensor(cont, dtype=torch.long, device=rows.device)
            lp = rows.gather(1, target.unsqueeze(1)).squeeze(1)
            greedy = bool((rows.argmax(dim=-1) == target).all())
            results[(ctx, cont)] = (float(lp.double().sum()), greedy)
        now = time.perf_counter()
        if now - last > progress_every:
            done = start + len(chunk)
            log.info("log-likelihoods: %d/%d sequences (%.0f tokens/s)", done, len(unique), n_tokens / (now - t0))
            last = now
    elapsed = time.perf_counter() - t0
    stats = {"requests": len(requests), "unique_requests": len(unique), "tokens": n_tokens,
             "seconds": elapsed, "tokens_per_s": n_tokens / elapsed if elapsed > 0 else None}
    return [results[(tuple(c), tuple(x))] for c, x in requests], stats


@contextlib.contextmanager
def _lm_head_deferred(model):
    """Run `model` with its LM head replaced by the identity (its output is then the final
    normed hidden states) and hand back the head, so that only the positions that are scored go
    through the head and the softmax: the same numbers as full logits, without computing
    vocabulary-sized rows for every context token. Models without an `lm_head` module run as is
    (the context yields None)."""
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Module):
        yield None
        return
    model.lm_head = torch.nn.Identity()
    try:
        yield head
    finally:
        model.lm_head = head  # the same module object: a tied weight stays tied


@torch.no_grad()
def reference_loglikelihood(model, context: Sequence[int], continuation: Sequence[int], max_length: int,
                            device: Optional[torch.device] = None) -> float:
    """The slow reference: one request, its own forward, no batching or padding."""
    device = device or next(model.parameters()).device
    w = model_window(context, continuation, max_length)
    logits = model(torch.tensor([w], dtype=torch.long, device=device)).logits[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    total = 0.0
    n = len(continuation)
    for j, tok in enumerate(continuation):
        total += float(logprobs[len(w) - n + j, tok])
    return total
