"""Tensor- and expert-parallel inference: one engine over T processes (docs/guides/multi_device.md).

`launch.py` spawns and joins the ranks, `shard.py` splits a loaded model, `runner.py` runs a step
on every rank, `worker.py` is the loop of ranks 1..T-1, `layout.py` the checks made before any
process starts, `comm.py` the engine's own process group."""
