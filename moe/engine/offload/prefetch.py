"""Lookahead prefetch (mixtral-offloading's speculative expert loading): when layer l's MoE
starts, layer l+1's router is applied to layer l's MoE input (its normed hidden state) to guess
the experts layer l+1 will pick; the guessed experts not resident are loaded while layer l (and
layer l+1's attention) compute: on a background thread on CPU, on a side CUDA stream on GPU.
Layer l+1's forward waits for that load before it uses its cache (`LayerExpertCache.acquire`).

The guess is the most-voted experts of the batch's tokens (each token's router top_k), at most
the layer's slots. A router that needs token ids (hash routing) has nothing to apply: such a
layer gets no prefetch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from moe.engine.offload.cache import LayerExpertCache


class LookaheadPrefetcher:
    def __init__(self, model, caches: dict[int, LayerExpertCache], device: torch.device):
        self.caches, self.device = caches, device
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="expert-prefetch")
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.hooks = []
        layers = sorted(caches)
        for this, nxt in zip(layers, layers[1:]):
            router = model.layers[nxt].ffn.router
            if router.uses_token_ids:
                continue
            hook = self._make_hook(router, caches[nxt])
            self.hooks.append(model.layers[this].ffn.register_forward_pre_hook(hook))

    def _make_hook(self, router, cache: LayerExpertCache):
        def hook(_module, args):
            self.prefetch(router, cache, args[0])
        return hook

    @torch.no_grad()
    def prefetch(self, router, cache: LayerExpertCache, h_BTD: torch.Tensor) -> None:
        logits_TE = router.logits(h_BTD.reshape(-1, h_BTD.shape[-1]))
        k = min(router.top_k, logits_TE.shape[-1])
        votes_E = torch.bincount(logits_TE.topk(k, dim=-1).indices.reshape(-1), minlength=logits_TE.shape[-1])
        ranked = torch.argsort(votes_E, descending=True, stable=True)[: cache.n_slots]
        chosen = [e for e in ranked.tolist() if votes_E[e] > 0]
        cache.wait_prefetch()  # (the previous one for this layer; normally long finished)
        cache.predicted = set(chosen)
        cache.stats.predicted += len(chosen)
        missing = [e for e in chosen if e not in cache.slot_of]
        if not missing:
            return
        for e in chosen:
            cache.policy.touch(e)  # a guessed expert is "recent": its own prefetch must not evict it
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # slots still read by queued kernels
        cache.pending = self.executor.submit(self._load, cache, missing, set(chosen))

    def _load(self, cache: LayerExpertCache, missing: list[int], chosen: set[int]) -> None:
        if self.stream is None:
            cache.stats.prefetched += cache.load(missing, pinned=chosen)
            return
        with torch.cuda.stream(self.stream):
            cache.stats.prefetched += cache.load(missing, pinned=chosen, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        cache.ready_event = event

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.executor.shutdown(wait=True)
