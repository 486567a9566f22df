"""Loading a sharded HF checkpoint: `moe.load_model` vs `transformers.AutoModelForCausalLM.from_pretrained`
on the same directory, time and peak resident memory, in one run.

    python -m benchmarks.load                                   # a synthetic ~250 MB bf16 Qwen3-MoE checkpoint
    python -m benchmarks.load --size-mb 1000 --shard-mb 100 --family olmoe
    python -m benchmarks.load --dir ~/models/OLMoE-1B-7B-0924   # a downloaded checkpoint

Each loader runs in a fresh interpreter (`--worker`) that first imports everything it needs,
then resets its peak-RSS counter (`/proc/self/clear_refs`), loads the checkpoint in its stored
dtype, and reports the load time and the peak RSS over the post-import baseline, as a ratio to
the size of the weights. Afterwards each side computes fp32 logits of the same random tokens
(the model cast to fp32 after the measurement); the two must agree (max abs diff <= --atol),
else the run exits 1. Output: a JSON line per loader and a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from moe.config import ModelConfig  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402
from moe.hf.families import family  # noqa: E402
from moe.hf.tensor_map import tensor_rows  # noqa: E402
from moe.loading import load_model  # noqa: E402
from moe.model import Transformer  # noqa: E402
from moe.report import markdown_table  # noqa: E402
from benchmarks.timing import finish_record  # noqa: E402
from moe.weights import checkpoint_files, save_safetensors  # noqa: E402

FAMILY_OPTIONS = {  # what each family's config needs on top of the plain model
    "mixtral": dict(),
    "olmoe": dict(qk_norm="full"),
    "qwen2_moe": dict(n_shared_experts=1, shared_expert_gate=True, qkv_bias=True),
    "qwen3_moe": dict(qk_norm="head"),
}


# ---------------------------------------------------------------------------- the checkpoint

def synthetic_config(size_mb: float, model_type: str, dtype_bytes: int = 2, d: int = 512,
                     vocab: int = 16384) -> ModelConfig:
    """A model of about `size_mb` MB: width `d`, as many 32-expert layers as fit (at least one)."""
    E, H = 32, d // 2
    per_layer = 3 * d * H * E + 4 * d * d + E * d + 2 * d
    n_layers = max(1, round((size_mb * 1e6 / dtype_bytes - 2 * vocab * d) / per_layer))
    return ModelConfig(vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=8, n_kv_heads=2, n_experts=E,
                       expert_hidden=H, max_seq_len=1024, router=router_config(top_k=4), **FAMILY_OPTIONS[model_type])


def make_synthetic_checkpoint(out_dir, size_mb: float = 250, shard_mb: float = 40, model_type: str = "qwen3_moe",
                              dtype: torch.dtype = torch.bfloat16, seed: int = 0, tiny: bool = False,
                              random: bool = True) -> Path:
    """An HF directory of `model_type` (config.json + safetensors shards of at most `shard_mb`)
    with unit-scale random weights (`random=False`: arbitrary contents, much faster to make, for
    memory measurements), in the published per-expert layout (`tiny`: d_model 64, vocab 256,
    one layer, whatever `size_mb` says)."""
    width = dict(d=64, vocab=256) if tiny else {}
    cfg = synthetic_config(size_mb, model_type, torch.finfo(dtype).bits // 8, **width)
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = Transformer(cfg)
    fam = family(model_type)
    tensors = {}
    shapes = model.state_dict()
    g = torch.Generator().manual_seed(seed)
    for hf_name, ours, index in tensor_rows(cfg, fam, "hub"):
        shape = shapes[ours][index].shape
        if not random:
            t = torch.empty(shape, dtype=dtype)
        elif len(shape) == 1:  # norm gains around 1, biases around 0
            t = (0.0 if hf_name.endswith(".bias") else 1.0) + 0.1 * torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
        tensors[hf_name] = t.to(dtype)
    out = Path(out_dir)
    save_safetensors(tensors, out, max_shard_bytes=int(shard_mb * 1e6))
    config = fam.hf_config(cfg)
    config.dtype = dtype
    config.save_pretrained(str(out))
    return out


def weights_bytes(directory) -> int:
    total = 0
    for file in checkpoint_files(directory):
        with safe_open(str(file), "pt") as f:
            for k in f.keys():
                s = f.get_slice(k)
                total += math.prod(s.get_shape()) * torch.finfo(getattr(torch, {
                    "BF16": "bfloat16", "F16": "float16", "F32": "float32"}[s.get_dtype()])).bits // 8
    return total


# ---------------------------------------------------------------------------- one loader, measured

def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _load(kind: str, directory):
    if kind == "ours":
        return load_model(directory)[0]
    return AutoModelForCausalLM.from_pretrained(str(directory), dtype="auto")


def worker(kind: str, directory: str, logits_out: str, seed: int) -> dict:
    """Load `directory` with `kind` (ours | hf) and measure; write fp32 logits to `logits_out`.

    Both loaders' modules are imported at the top of this file, before any baseline.

    The baseline is taken after a warm-up load of a tiny checkpoint of the same family, so the
    figures hold the weights and what loading them costs, not the modules either loader imports
    on first use."""
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model_type = json.loads((Path(directory) / "config.json").read_text())["model_type"]
    with tempfile.TemporaryDirectory() as tmp:
        _load(kind, make_synthetic_checkpoint(Path(tmp) / "warmup", size_mb=0, model_type=model_type, tiny=True))
    gc.collect()  # (the warm-up model is garbage now)
    reset = _reset_peak()
    baseline = _status_kb("VmRSS" if reset else "VmHWM") * 1024
    t0 = time.perf_counter()
    model = _load(kind, directory)
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM") * 1024
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    result = {"loader": kind, "seconds": seconds, "peak_rss_bytes": peak - baseline, "baseline_rss_bytes": baseline,
              "peak_reset": reset, "dtype": dtype}
    if logits_out is None:
        return result
    model.float().eval()
    ids = torch.randint(0, model.config.vocab_size if kind == "hf" else model.cfg.vocab_size, (2, 17),
                        generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = model(ids).logits if kind == "ours" else model(input_ids=ids).logits
    torch.save(logits, logits_out)
    return result


def measure(kind: str, directory, logits_out=None, seed: int = 0, timeout: float = 1800) -> dict:
    """Run `worker` in a fresh interpreter; its JSON result (fp32 logits saved to `logits_out`
    when given)."""
    extra = ["--logits-out", str(logits_out)] if logits_out is not None else []
    p = subprocess.run([sys.executable, "-m", "benchmarks.load", "--worker", kind, "--dir", str(directory),
                        "--seed", str(seed), *extra], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if p.returncode != 0:
        raise RuntimeError(f"{kind} loader failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="an HF model directory (default: make a synthetic one)")
    ap.add_argument("--family", default="qwen3_moe", choices=sorted(FAMILY_OPTIONS))
    ap.add_argument("--size-mb", type=float, default=250)
    ap.add_argument("--shard-mb", type=float, default=40)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the results (and the command's settings) here as JSON")
    ap.add_argument("--worker", choices=["ours", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--logits-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.dir, args.logits_out, args.seed)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.dir) if args.dir else make_synthetic_checkpoint(
            Path(tmp) / "ckpt", args.size_mb, args.shard_mb, args.family)
        size = weights_bytes(directory)
        results = [measure(kind, directory, Path(tmp) / f"{kind}.pt", args.seed) for kind in ("ours", "hf")]
        ours, hf = (torch.load(Path(tmp) / f"{k}.pt") for k in ("ours", "hf"))
        diff = (ours - hf).abs().max().item()
    rows = []
    for r in results:
        r.update(weights_bytes=size, rss_ratio=r["peak_rss_bytes"] / size, logits_max_abs_diff=diff)
        print(json.dumps(r))
        rows.append([r["loader"], f"{size / 1e6:.0f}", r["dtype"], f"{r['seconds']:.2f}",
                     f"{r['peak_rss_bytes'] / 1e6:.0f}", f"{r['rss_ratio']:.2f}"])
    print(markdown_table(["loader", "weights (MB)", "dtype", "load (s)", "peak RSS over baseline (MB)",
                          "peak RSS / weights"], rows))
    print(f"fp32 logits, max abs diff ours vs HF: {diff:.2e} (atol {args.atol})")
    if args.out:
        finish_record({"family": args.family, "size_mb": args.size_mb, "shard_mb": args.shard_mb,
                       "atol": args.atol, "results": results}, args.out, [])
    return 0 if diff <= args.atol else 1


if __name__ == "__main__":
    sys.exit(main())
