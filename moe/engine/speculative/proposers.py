"""Proposers: who drafts the k tokens the target model then verifies in one forward.

`propose(seqs, ks, sample)` returns, per sequence, (the proposed tokens, their proposal
distributions [len, V] or None when the proposal is deterministic).

- `NgramProposer` (prompt lookup): finds the most recent earlier occurrence of the context's last
  n tokens (n from `prompt_lookup_max` down to `prompt_lookup_min`) and proposes what followed it.
- `ModelProposer`: a drafting model with its own paged KV cache and block manager (no prefix
  caching). Each sequence has a shadow `Sequence` in that cache; before proposing, the shadow is
  synced with the real sequence (its KV is kept up to the longest common prefix, so rejected
  proposals are rolled back there too), the tokens it has not seen run in one extend forward,
  then k - 1 batched decode steps draft the rest. Used for `draft` (a second checkpoint) and for
  `self` (`SelfDraftModel`: the served model with a reduced router top_k and/or skipped layers).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Callable, Optional

import torch
from torch import nn

from moe.engine.memory.block_manager import BlockManager
from moe.engine.runner.model_runner import ModelRunner
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import ScheduledBatch, Sequence
from moe.errors import ConfigError
from moe.routing.routers import rebuild_router

Proposal = tuple[list[int], Optional[torch.Tensor]]


class NgramProposer:
    def __init__(self, max_n: int, min_n: int):
        self.max_n, self.min_n = max_n, min_n

    def lookup(self, ids: list[int], k: int, max_n: int, min_n: int) -> list[int]:
        L = len(ids)
        for n in range(min(max_n, L - 1), min_n - 1, -1):
            tail = ids[L - n:]
            for s in range(L - n - 1, -1, -1):  # most recent earlier match first
                if ids[s:s + n] == tail:
                    return ids[s + n:s + n + k]
        return []

    def propose(self, seqs: list[Sequence], ks: list[int], sample: Callable) -> list[Proposal]:
        out = []
        for seq, k in zip(seqs, ks):
            c = seq.spec
            out.append((self.lookup(seq.token_ids, k, c.prompt_lookup_max, c.prompt_lookup_min), None))
        return out

    def release(self, live: set) -> None:
        pass

    def drop(self, request_id: str) -> None:
        pass


class SelfDraftModel(nn.Module):
    """The served model run with a reduced router `top_k` and/or without `skip_layers`: the same
    weights (nothing copied); its routers are rebuilt once around the target routers' own
    parameters (as `Transformer.set_routing` does) and swapped in only for the drafting forward."""

    def __init__(self, target, top_k: Optional[int], skip_layers: tuple):
        super().__init__()
        cfg = target.cfg
        bad = [i for i in skip_layers if i >= cfg.n_layers]
        if bad or len(skip_layers) >= cfg.n_layers:
            raise ConfigError(f"speculative.skip_layers={list(skip_layers)} must name some, not all, of the "
                              f"model's layers 0..{cfg.n_layers - 1}")
        if top_k is not None and top_k > cfg.router.top_k:
            raise ConfigError(f"speculative.top_k={top_k} must be <= the model's router top_k={cfg.router.top_k}")
        if (top_k is None or top_k == cfg.router.top_k) and not skip_layers:
            raise ConfigError(f"speculative method 'self' needs a cheaper drafting pass: a top_k below the model's "
                              f"{cfg.router.top_k} and/or skip_layers")
        self._target = [target]  # a list: not a submodule (its parameters stay the target's)
        self.cfg = cfg if top_k is None else dataclasses.replace(cfg, router=dataclasses.replace(cfg.router,
                                                                                                 top_k=top_k))
        self.norm = target.norm  # the runner hooks it to keep only the rows it samples
        self.skip = set(skip_layers)
        self.routers = {}
        if top_k is not None and top_k != cfg.router.top_k:
            for i, block in enumerate(target.layers):
                if block.is_moe and i not in self.skip:
                    refusal = f"router={self.cfg.router.name!r} cannot draft with top_k={self.cfg.router.top_k}"
                    self.routers[i] = rebuild_router(block.ffn.router, self.cfg, refusal)

    def forward(self, input_ids, positions, kv_context):
        t = self._target[0]
        cos, sin = t.rotary(positions)
        x = t.embed(input_ids)
        for i, block in enumerate(t.layers):
            if i in self.skip:
                continue
            router = self.routers.get(i)
            if router is None:
                x = block(x, cos, sin, input_ids, kv_context)[0]
                continue
            own, block.ffn.router = block.ffn.router, router
            try:
                x = block(x, cos, sin, input_ids, kv_context)[0]
            finally:
                block.ffn.router = own
        return SimpleNamespace(logits=t.lm_head(t.norm(x)), moe_records=[])


class ModelProposer:
    def __init__(self, model, num_blocks: int, block_size: int, backend, device, dtype):
        self.model = model
        self.runner = ModelRunner(model, num_blocks, block_size, backend, device, dtype)
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.shadows: dict[str, Sequence] = {}

    def _sync(self, seq: Sequence) -> Sequence:
        sh = self.shadows.get(seq.request_id)
        if sh is None:
            sh = self.shadows[seq.request_id] = Sequence(seq.request_id, None, [], SamplingParams(), 0.0)
        ids, keep = seq.token_ids, min(sh.num_computed_tokens, seq.num_tokens - 1)
        if sh.token_ids[:keep] != ids[:keep]:  # rejected proposals: roll back to the common prefix
            keep = next(i for i, (a, b) in enumerate(zip(sh.token_ids[:keep], ids)) if a != b)
        sh.token_ids, sh.num_computed_tokens = list(ids), keep
        self.bm.trim(sh, keep)
        return sh

    def _forward(self, shadows: list[Sequence]) -> torch.Tensor:
        """Run every shadow's uncomputed tokens (decodes first, as the runner expects); the
        logits of each one's last token, in the order given."""
        order = sorted(range(len(shadows)), key=lambda i: shadows[i].num_tokens - shadows[i].num_computed_tokens != 1)
        batch = ScheduledBatch()
        batch.seqs = [shadows[i] for i in order]
        batch.num_new_tokens = [s.num_tokens - s.num_computed_tokens for s in batch.seqs]
        batch.num_decodes = sum(1 for n in batch.num_new_tokens if n == 1)
        logits, _sampled, _ = self.runner.execute(batch)
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            s.num_computed_tokens += n
        out = torch.empty_like(logits)
        out[torch.tensor(order, device=logits.device)] = logits
        return out

    def propose(self, seqs: list[Sequence], ks: list[int], sample: Callable) -> list[Proposal]:
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            sh = self._sync(seq)
            # room for the k - 1 proposals it feeds back; when the cache is short, this one drafts nothing
            if self.bm.allocate_slots(sh, sh.num_tokens - sh.num_computed_tokens + k - 1):
                active.append(i)
            else:
                self.bm.free(sh)
                del self.shadows[seq.request_id]
        for step in range(max((ks[i] for i in active), default=0)):
            active = [i for i in active if ks[i] > step]
            if not active:
                break
            shadows = [self.shadows[seqs[i].request_id] for i in active]
            logits = self._forward(shadows)
            toks, qs = sample(logits, [seqs[i] for i in active], shadows)
            for r, i in enumerate(active):
                drafts[i].append(toks[r])
                probs[i].append(qs[r])
                shadows[r].token_ids.append(toks[r])
        return [(d, torch.stack(p) if d and p[0] is not None else None) for d, p in zip(drafts, probs)]

    def release(self, live: set) -> None:
        for rid in [r for r in self.shadows if r not in live]:
            self.drop(rid)

    def drop(self, request_id: str) -> None:
        sh = self.shadows.pop(request_id, None)
        if sh is not None:
            self.bm.free(sh)
