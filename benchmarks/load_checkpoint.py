"""Loading a moe-lab checkpoint (one `.pt` file holding model, AdamW state and config): peak
resident memory and time of `moe.load_model` against the way it used to load, in one run.

    python -m benchmarks.load_checkpoint                       # ~250 MB of fp32 weights (+2x optimizer state)
    python -m benchmarks.load_checkpoint --size-mb 1000 --dtype bf16

The peer ("eager", the code before issue 21): `torch.load` of the whole file (optimizer state
included), a randomly initialised fp32 `Transformer`, `load_state_dict`, then the cast. Ours:
`torch.load(mmap=True)` (only the model's pages are ever read), the model built on the meta
device, the tensors converted once to the target dtype and assigned. Each loader runs in a fresh
interpreter that imports everything and loads a tiny checkpoint first, then resets its peak-RSS
counter (`/proc/self/clear_refs`), loads, and reads every weight once (a memory-mapped weight is
resident only once used); the figure is the peak RSS over that baseline, as a ratio to the
loaded weights (in the target dtype), and the time covers the load and that read. Both sides' fp32 logits on the same tokens must be
equal, else the run exits 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.load import _reset_peak, _status_kb  # noqa: E402
from moe.checkpoint import save_checkpoint  # noqa: E402
from moe.config import Config, ModelConfig, TrainConfig, to_dict  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402
from moe.variants import from_dict  # noqa: E402
from moe.dtypes import resolve_dtype  # noqa: E402
from moe.loading import load_model  # noqa: E402
from moe.model import Transformer  # noqa: E402
from moe.report import markdown_table  # noqa: E402
from benchmarks.timing import finish_record  # noqa: E402


def synthetic_config(size_mb: float, d: int = 256, vocab: int = 8192) -> ModelConfig:
    """About `size_mb` MB of fp32 weights: width `d`, 16 experts per layer, as many layers as fit."""
    E, H = 16, d
    per_layer = 3 * d * H * E + 4 * d * d + E * d + 2 * d
    n_layers = max(1, round((size_mb * 1e6 / 4 - 2 * vocab * d) / per_layer))
    return ModelConfig(vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=4, n_kv_heads=2, n_experts=E,
                       expert_hidden=H, max_seq_len=128, router=router_config(top_k=2))


def make_checkpoint(path: Path, size_mb: float, seed: int = 0) -> tuple[Path, int]:
    """A checkpoint file of random fp32 weights and an AdamW-shaped optimizer state (2 tensors
    per parameter); returns (path, weight bytes in fp32)."""
    cfg = synthetic_config(size_mb)
    with torch.device("meta"):
        shapes = {k: t.shape for k, t in Transformer(cfg).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    model = {k: torch.randn(s, generator=g) * 0.05 for k, s in shapes.items()}
    optim = {"state": {i: {"exp_avg": torch.randn(s, generator=g), "exp_avg_sq": torch.rand(s, generator=g)}
                       for i, s in enumerate(shapes.values())},
             "param_groups": [{"lr": 1e-3, "params": list(range(len(shapes)))}]}
    save_checkpoint(path, {"model": model, "optimizer": optim, "step": 1,
                           "config": to_dict(Config(model=cfg, train=TrainConfig(seq_len=64)))})
    return path, sum(t.numel() * 4 for t in model.values())


def eager_load(path: Path, dtype):
    """The peer: the loading code before issue 21 (whole file, random init, copy, cast)."""
    state = torch.load(path, map_location="cpu", weights_only=True)  # whole file, optimizer included
    model = Transformer(from_dict(state["config"]).model)
    model.load_state_dict(state["model"], strict=True)
    return model.to(dtype=dtype).eval()


def worker(kind: str, path: str, dtype_name: str, logits_out: str) -> dict:
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    dtype = resolve_dtype(dtype_name)
    load = (lambda p: load_model(p, dtype=dtype)[0]) if kind == "ours" else (lambda p: eager_load(p, dtype))
    with tempfile.TemporaryDirectory() as tmp:
        load(make_checkpoint(Path(tmp) / "step_0000001.pt", 0.1)[0])  # warm-up: every module imported
    gc.collect()
    reset = _reset_peak()
    baseline = _status_kb("VmRSS" if reset else "VmHWM") * 1024
    t0 = time.perf_counter()
    model = load(Path(path))
    with torch.no_grad():  # touch every page of every weight (a memory-mapped one is resident only once
        # used), through strided views, so the read itself allocates nothing of the weights' size
        torch.stack([p.reshape(-1)[::256].float().sum() for p in model.parameters()])
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM") * 1024
    loaded = sum(p.numel() * p.element_size() for p in model.parameters())
    model.float()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.save(model(ids).logits, logits_out)
    return {"loader": kind, "seconds": seconds, "peak_rss_bytes": peak - baseline, "weights_bytes": loaded,
            "rss_ratio": (peak - baseline) / loaded, "peak_reset": reset, "dtype": dtype_name}


def measure(kind: str, path: Path, dtype: str, logits_out: Path, timeout: float = 1800) -> dict:
    p = subprocess.run([sys.executable, "-m", "benchmarks.load_checkpoint", "--worker", kind, "--path", str(path),
                        "--dtype", dtype, "--logits-out", str(logits_out)], cwd=REPO, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{kind} loader failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=250, help="fp32 weights (the file is ~3x: AdamW state)")
    ap.add_argument("--dtype", default="fp32", help="the dtype to load in (fp32 | bf16 | fp16)")
    ap.add_argument("--loaders", default="ours,eager", help="comma-separated: ours, eager")
    ap.add_argument("--out", default=None, help="also write the results (and the command's settings) here as JSON")
    ap.add_argument("--worker", choices=["ours", "eager"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--logits-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.path, args.dtype, args.logits_out)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = make_checkpoint(Path(tmp) / "step_0000001.pt", args.size_mb)
        file_mb = path.stat().st_size / 1e6
        kinds = args.loaders.split(",")
        results = [measure(k, path, args.dtype, Path(tmp) / f"{k}.pt") for k in kinds]
        logits = [torch.load(Path(tmp) / f"{k}.pt") for k in kinds]
    same = all(torch.equal(logits[0], other) for other in logits[1:])
    rows = []
    for r in results:
        print(json.dumps(r))
        rows.append([r["loader"], f"{file_mb:.0f}", f"{r['weights_bytes'] / 1e6:.0f}", r["dtype"],
                     f"{r['seconds']:.2f}", f"{r['peak_rss_bytes'] / 1e6:.0f}", f"{r['rss_ratio']:.2f}"])
    print(markdown_table(["loader", "file (MB)", "weights (MB)", "dtype", "load (s)", "peak RSS over baseline (MB)",
                          "peak RSS / weights"], rows))
    print(f"fp32 logits of the loaders identical: {same}")
    if args.out:
        finish_record({"size_mb": args.size_mb, "dtype": args.dtype, "file_mb": file_mb,
                       "logits_identical": same, "results": results}, args.out, [])
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
