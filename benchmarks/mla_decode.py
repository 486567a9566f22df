"""One MLA layer's paged decode step, absorbed vs expanded, at long contexts (DeepSeek-V2-Lite's
attention shapes by default: 16 heads, nope 128, rope 64, v 128, latent 512).

    python -m benchmarks.mla_decode --contexts 2048 8192 --seqs 2 --repeats 3 --json out.json

Three ways to decode `--seqs` sequences of `--contexts` cached tokens (random latent rows, random
W_UK / W_UV, one query per sequence), each timed `--repeats` times after one warm-up:
- `absorbed`: the engine's path (moe/attention/mla_paged.py `absorbed_latent_decode` on the
  `--backend` paged backend): the latent cache (576 values a token); with `--backend triton` the
  Triton MLA kernel (kernels/mla_decode), with `torch` the cache read as one kv head by torch.
- `absorbed_torch` (only when `--backend` is not torch): the same on the torch backend.
- `expanded_from_latent`: the torch reference: the same cache, keys and values re-expanded per
  head from the latent every step (vLLM's non-absorbed form).
- `expanded_cache`: per-head keys [nope + rope] and values [v] cached (what a plain multi-head
  cache holds, zero-padded to one width as the engine's expanded path did), plain paged decode.
Exits 1 when a way's output differs from the reference by more than `--tol` (a wrong output is
not a benchmark result). Reports per-step milliseconds (median, min, max) and cache bytes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from moe.attention import PAGED_BACKENDS  # noqa: E402
from moe.attention.mla_paged import absorbed_latent_decode, expanded_paged_decode  # noqa: E402
from benchmarks.timing import finish_record  # noqa: E402
from moe.dtypes import resolve_dtype  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mla_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--seqs", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--nope", type=int, default=128)
    p.add_argument("--rope", type=int, default=64)
    p.add_argument("--v", type=int, default=128)
    p.add_argument("--latent", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="torch", help="paged backend of the absorbed and expanded-cache ways")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared CPU)")
    p.add_argument("--tol", type=float, default=2e-3)
    p.add_argument("--json", default=None)
    return p


def make_case(a, context: int, dtype, device):
    g = torch.Generator().manual_seed(context)
    S, H, C, bs = a.seqs, a.heads, a.latent, a.block_size
    width = -(-context // bs)
    latent = torch.randn(S * width, bs, 1, C + a.rope, generator=g)
    latent[..., :C] = F.normalize(latent[..., :C], dim=-1) * C ** 0.5  # RMS-normalised, as kv_a_norm leaves it
    tables = torch.randperm(S * width, generator=g).view(S, width).to(torch.int32)
    q_nope, q_rope = torch.randn(S, H, a.nope, generator=g), torch.randn(S, H, a.rope, generator=g)
    w_uk = torch.randn(H, a.nope, C, generator=g) * C ** -0.5
    w_uv = torch.randn(H, a.v, C, generator=g) * C ** -0.5
    lens = torch.full((S,), context, dtype=torch.int32)
    to = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return (to(q_nope), to(q_rope), to(latent), tables.to(device), lens.to(device), to(w_uk), to(w_uv),
            (a.nope + a.rope) ** -0.5)


def expanded_cache(case, a):
    """Per-head K [nope + rope] and V [v] of every cached token, zero-padded to one width, and the
    query padded alike (one kv head per query head)."""
    q_nope, q_rope, latent, tables, lens, w_uk, w_uv, scale = case
    C, D = a.latent, max(a.nope + a.rope, a.v)
    rows = latent[..., 0, :]  # [blocks, bs, C + rope]
    k_nope = torch.einsum("bsc,hnc->bshn", rows[..., :C], w_uk)
    k = torch.cat([k_nope, rows[..., None, C:].expand(-1, -1, a.heads, -1)], dim=-1)
    v = torch.einsum("bsc,hvc->bshv", rows[..., :C], w_uv)
    k, v = F.pad(k, (0, D - k.shape[-1])), F.pad(v, (0, D - v.shape[-1]))
    q = F.pad(torch.cat([q_nope, q_rope], dim=-1), (0, D - a.nope - a.rope))
    return q, k.contiguous(), v.contiguous(), tables, lens, scale


def timed(fn, repeats: int, device) -> tuple[list[float], torch.Tensor]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t) * 1e3)
    return times, out


def run_context(a, context: int, dtype, device, backend) -> tuple[dict, list[str]]:
    case = make_case(a, context, dtype, device)
    ref = expanded_paged_decode(*case).float()
    q, k, v, tables, lens, scale = expanded_cache(case, a)
    ways = {
        "absorbed": lambda: absorbed_latent_decode(backend, *case),
        "expanded_from_latent": lambda: expanded_paged_decode(*case),
        "expanded_cache": lambda: backend.decode(q, k, v, tables, lens, scale)[..., :a.v],
    }
    if backend.name != "torch":
        ways["absorbed_torch"] = lambda: absorbed_latent_decode(PAGED_BACKENDS.get("torch")(), *case)
    elt = torch.empty((), dtype=dtype).element_size()
    cache_bytes = {"absorbed": case[2].numel() * elt, "absorbed_torch": case[2].numel() * elt,
                   "expanded_from_latent": case[2].numel() * elt, "expanded_cache": (k.numel() + v.numel()) * elt}
    result, wrong = {}, []
    for name, fn in ways.items():
        with torch.inference_mode():
            times, out = timed(fn, a.repeats, device)
        err = float((out.float() - ref).abs().max())
        if err > a.tol:
            wrong.append(f"{name} at context {context}: max |out - reference| = {err:.2e} > {a.tol}")
        result[name] = dict(ms=times, median_ms=statistics.median(times), min_ms=min(times), max_ms=max(times),
                            max_abs_err=err, cache_bytes=cache_bytes[name])
    return result, wrong


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    device, dtype = torch.device(a.device), resolve_dtype(a.dtype)
    torch.set_num_threads(a.threads)
    backend = PAGED_BACKENDS.get(a.backend)()
    record = dict(args=vars(a), machine=platform.platform(), cpus=os.cpu_count(), torch=torch.__version__,
                  threads=torch.get_num_threads(), load_before=os.getloadavg(),
                  commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  contexts={})
    wrong = []
    for context in a.contexts:
        record["contexts"][str(context)], bad = run_context(a, context, dtype, device, backend)
        wrong += bad
        for name, r in record["contexts"][str(context)].items():
            print(f"context {context:6d} {name:22s} median {r['median_ms']:9.2f} ms (min {r['min_ms']:.2f}, "
                  f"max {r['max_ms']:.2f}) cache {r['cache_bytes'] / 2**20:8.1f} MiB  err {r['max_abs_err']:.1e}")
    return finish_record(record, a.json, wrong)


if __name__ == "__main__":
    raise SystemExit(main())
