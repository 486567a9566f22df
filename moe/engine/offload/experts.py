"""`OffloadedExperts`: stands in for a MoE layer's experts module (`SwiGLUExperts`, `BiasedExperts`
or `QuantExperts`; same forward signature) and runs that module's own forward on fast-tier slots
instead of all E experts (`stored.on_rows`).

Exactness with the resident layer: the experts a forward needs are taken in ascending id order,
and expert ids are mapped to slot-tensor rows monotonically (the slot tensors themselves when
the slots happen to be in that order, else a gathered copy of the chunk's slots), so the
dispatch sees the same groups in the same order and adds each token's expert outputs in the same
order as the resident layer. When a forward needs more experts than there are slots (a large
prefill at a small budget), it runs in chunks of at most `n_slots` experts and sums the chunks'
outputs, chunked so that the sum is bitwise the resident one (`chunks.py`).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from moe.engine.offload.cache import LayerExpertCache
from moe.engine.offload.chunks import exact_chunks
from moe.engine.offload.stored import on_rows, template


class OffloadedExperts(nn.Module):
    def __init__(self, cache: LayerExpertCache, resident: nn.Module, keeps: bool):
        """`resident`: the module replaced; only its settings are kept (`stored.template`)."""
        super().__init__()
        self.cache, self.keeps = cache, keeps
        self.n_experts, self.d_model, self.hidden = cache.n_experts, resident.d_model, resident.hidden
        self.kind = type(resident).__name__
        self.dispatch_name = getattr(resident, "dispatch_name", None)
        # kept off the module tree: it has no tensors of its own to move, save or print
        self.__dict__["template"] = template(resident)

    def forward(self, x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        used = [e for e in torch.unique(experts_TK).tolist() if e != self.n_experts]  # (sorted) one host sync
        cache.stats.forwards += 1
        cache.stats.tokens += x_TD.shape[0]
        cache.score_prediction(used)
        y_TD = None
        rows_TK = experts_TK.tolist() if len(used) > cache.n_slots else []  # (a second sync, only when chunked)
        for chunk in exact_chunks(rows_TK, used, cache.n_slots):
            out_TD = self._run_chunk(x_TD, experts_TK, weights_TK, chunk, cache.acquire(chunk))
            y_TD = out_TD if y_TD is None else y_TD + out_TD
        if not self.keeps:
            cache.drop_all()
        return torch.zeros_like(x_TD) if y_TD is None else y_TD

    def _run_chunk(self, x_TD, experts_TK, weights_TK, chunk: list[int], slots: list[int]) -> torch.Tensor:
        cache = self.cache
        if slots == sorted(slots):
            tensors, rows = cache.slots, slots
        else:
            t0 = time.perf_counter()
            index = torch.tensor(slots, device=cache.device)
            tensors = {name: t.index_select(0, index) for name, t in cache.slots.items()}
            rows = list(range(len(chunk)))
            cache.stats.gather_s += time.perf_counter() - t0
        module = on_rows(self.template, tensors)
        dropped = module.n_experts  # the dispatch's "no expert" id: everything outside this chunk
        row_of_E = torch.full((self.n_experts + 1,), dropped, dtype=experts_TK.dtype, device=experts_TK.device)
        row_of_E[torch.tensor(chunk, device=experts_TK.device)] = torch.tensor(rows, dtype=experts_TK.dtype,
                                                                               device=experts_TK.device)
        return module(x_TD, row_of_E[experts_TK], weights_TK)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, slots={self.cache.n_slots}, layer={self.cache.layer}, "
                f"experts={self.kind}, dispatch={self.dispatch_name}")
