"""Counters of the expert cache, per MoE layer, and their engine-wide summary (`llm.stats()`'s
`offload/...` keys, the server's `/metrics`)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class LayerStats:
    uses: int = 0  # distinct experts needed, summed over forwards
    hits: int = 0  # ...of which resident when the forward asked for them
    misses: int = 0  # ...loaded synchronously (the forward waited)
    loads: int = 0  # experts copied slow -> fast (misses and prefetches)
    bytes_moved: int = 0
    stall_s: float = 0.0  # time forwards waited: synchronous loads and unfinished prefetches
    predicted: int = 0  # lookahead: experts predicted for this layer
    predicted_used: int = 0  # ...that its next forward used
    predicted_uses: int = 0  # experts used by forwards that had a prediction (recall's denominator)
    prefetched: int = 0  # ...loaded by the prefetch (the rest were already resident)
    gather_s: float = 0.0  # time spent copying out-of-order slots into id order (exactness's price)
    forwards: int = 0
    tokens: int = 0

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default)


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def layer_summary(s: LayerStats) -> dict:
    """Hit rate; prefetch precision (predicted experts that were used) and recall (used experts
    that were predicted); bytes moved per token through this layer."""
    return dict(hit_rate=_ratio(s.hits, s.uses), prefetch_precision=_ratio(s.predicted_used, s.predicted),
                prefetch_recall=_ratio(s.predicted_used, s.predicted_uses),
                bytes_per_token=_ratio(s.bytes_moved, s.tokens), stall_s=s.stall_s, gather_s=s.gather_s, loads=s.loads,
                uses=s.uses, hits=s.hits, misses=s.misses, prefetched=s.prefetched)


def engine_summary(per_layer: dict[int, LayerStats], policy: str, slots: int, n_experts: int) -> dict:
    """The `offload/...` keys of `stats()`: totals over layers, and `offload/layers` per layer."""
    tot = LayerStats()
    for s in per_layer.values():
        for f in fields(LayerStats):
            setattr(tot, f.name, getattr(tot, f.name) + getattr(s, f.name))
    tokens = max((s.tokens for s in per_layer.values()), default=0)  # every token passes every layer
    out = {f"offload/{k}": v for k, v in layer_summary(tot).items()}
    out["offload/bytes_per_token"] = _ratio(tot.bytes_moved, tokens)  # all layers' bytes per token
    out["offload/bytes_moved"] = tot.bytes_moved
    out.update({"offload/policy": policy, "offload/experts_per_layer": slots,
                "offload/residency": slots / n_experts,
                "offload/layers": {layer: layer_summary(s) for layer, s in sorted(per_layer.items())}})
    return out
