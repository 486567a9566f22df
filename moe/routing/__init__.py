"""Routing: which experts each token goes to, and how to watch it.

- `routers/`: the router variants (`router.name`), each a module with its own options (`Config`),
  found by discovery (`ROUTERS`, moe/routing/routers/base.py); `build_router` / `rebuild_router`.
- `metrics.py`: per-layer routing records and the scalars logged from them (load, entropy, drops).
- `monitor.py`: alerts when a layer's routing collapses (dead experts, imbalance, no learning).
- `probe.py`: train/inference overlap and routing stability probes.
- `options.py`: the routing ablation a loaded model accepts without retraining (`routing=`).

Nothing is imported here, so `moe.routing.options` stays light (no torch) for the command lines.
"""
