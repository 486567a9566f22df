"""Sweeps and multi-node training on a cluster through Hydra's submitit launcher (docs/guides/cluster.md):
the launcher (`launcher.py`), what it checks and sets up for each training job (`jobs.py`), and the
sweep's `sweep.json` (`sweep_state.py`)."""
