"""The metric sinks (moe/logging.py): the W&B run summary keeps the losses in view."""

from __future__ import annotations

from tests.train.test_loop import tiny_cfg


def test_wandb_summary_shows_the_losses(tmp_path):
    """W&B prints the run summary sorted by key and cut after `max_end_of_run_summary_metrics`:
    the per-layer routing keys must not push train/loss and val/loss off it."""
    from moe.logging import WandbSink
    cfg = tiny_cfg(tmp_path, logger=dict(name="wandb"))
    sink = WandbSink(cfg, tmp_path, None)
    try:
        metrics = ["token_entropy", "token_entropy_norm", "load_entropy_norm", "load_max", "load_min", "load_cv",
                   "load_imbalance", "dropped_frac", "dead_experts", "aux_loss", "z_loss"]
        for step in (10, 20):
            record = {f"moe/layer{i}/{m}": 1.0 for i in range(4) for m in metrics}
            record.update({f"moe/{m}": 1.0 for m in metrics + ["train_eval_overlap", "routing_stability"]})
            record.update({"step": step, "train/loss": 4.0, "train/lr": 1e-3, "train/aux_loss": 0.01,
                           "train/grad_norm": 1.0, "train/tokens": 100, "perf/tokens_per_s": 1e3,
                           "perf/model_flops_per_s": 1e9, "perf/mfu": 0.3, "val/loss": 4.2, "val/ppl": 66.0})
            sink.write(record)
        shown = sorted(k for k in sink.run.summary.keys() if not k.startswith("_"))
        assert "moe/load_imbalance" in shown and not any(k.startswith("moe/layer") for k in shown)
        limit = sink.run.settings.max_end_of_run_summary_metrics
        assert {"train/loss", "val/loss"} <= set(shown[:limit]), (limit, shown)
        assert sink.location.startswith("offline, upload with: wandb sync ")
    finally:
        sink.close()
