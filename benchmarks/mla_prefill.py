"""One MLA layer's prefill step with a cached prefix, expanded vs absorbed (DeepSeek-V2-Lite's
attention shapes by default), to check moe/attention/mla_paged.py's `prefill_form` rule.

    python -m benchmarks.mla_prefill --context 2048 --q-lens 16 64 171 512 --repeats 3 --json out.json

One sequence of `--context` cached tokens whose last `q_len` are the step's queries (a later chunk
of chunked prefill, or the rest of a prompt after a prefix-cache hit). Two ways, interleaved per
repeat so load drifts hit both: `expanded` (`expanded_paged_prefill`: the cached latents expanded
per head once, causal attention at width nope + rope) and `absorbed` (`absorbed_paged_prefill`: a
decode per query row on the `--backend`). Reports ms per step (median, min, max), process CPU
seconds, which form the rule picks, and exits 1 if the two outputs differ by more than `--tol`.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.mla_decode import make_case  # noqa: E402
from moe.attention import PAGED_BACKENDS  # noqa: E402
from moe.attention.mla_paged import absorbed_paged_prefill, expanded_paged_prefill, prefill_form  # noqa: E402
from benchmarks.timing import finish_record  # noqa: E402
from moe.dtypes import resolve_dtype  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mla_prefill", description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--q-lens", type=int, nargs="+", default=[16, 64, 171, 512])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--nope", type=int, default=128)
    p.add_argument("--rope", type=int, default=64)
    p.add_argument("--v", type=int, default=128)
    p.add_argument("--latent", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="torch", help="paged backend of the absorbed way")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tol", type=float, default=2e-3)
    p.add_argument("--json", default=None)
    return p


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(fn, device) -> tuple[float, float, torch.Tensor]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t, c = time.perf_counter(), cpu_seconds()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t) * 1e3, cpu_seconds() - c, out


def run_q_len(a, q_len: int, dtype, device, backend) -> tuple[dict, list[str]]:
    a.seqs = 1
    q_nope, q_rope, cache, tables, lens, w_uk, w_uv, scale = make_case(a, a.context, dtype, device)
    g = torch.Generator().manual_seed(q_len)
    q_nope = torch.randn(q_len, a.heads, a.nope, generator=g).to(device=device, dtype=dtype)
    q_rope = torch.randn(q_len, a.heads, a.rope, generator=g).to(device=device, dtype=dtype)
    cu = torch.tensor([0, q_len], dtype=torch.int32, device=device)
    args = (q_nope, q_rope, cache, tables, cu, lens, w_uk, w_uv, scale)
    ways = {"expanded": lambda: expanded_paged_prefill(*args),
            "absorbed": lambda: absorbed_paged_prefill(backend, *args)}
    res = {name: dict(ms=[], cpu_s=[]) for name in ways}
    outs = {}
    with torch.inference_mode():
        for name, fn in ways.items():
            outs[name] = fn()  # warm-up
        for _ in range(a.repeats):
            for name, fn in ways.items():
                ms, cpu, _ = one(fn, device)
                res[name]["ms"].append(ms)
                res[name]["cpu_s"].append(cpu)
    for r in res.values():
        r.update(median_ms=statistics.median(r["ms"]), min_ms=min(r["ms"]), max_ms=max(r["ms"]))
    err = float((outs["expanded"].float() - outs["absorbed"].float()).abs().max())
    res["max_abs_diff"] = err
    res["rule_picks"] = prefill_form(q_len, a.latent, a.nope, a.v)
    res["faster"] = min(ways, key=lambda n: res[n]["median_ms"])
    wrong = [f"q_len {q_len}: |expanded - absorbed| = {err:.2e} > {a.tol}"] if err > a.tol else []
    return res, wrong


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    device, dtype = torch.device(a.device), resolve_dtype(a.dtype)
    torch.set_num_threads(a.threads)
    backend = PAGED_BACKENDS.get(a.backend)()
    record = dict(args=vars(a).copy(), machine=platform.platform(), cpus=os.cpu_count(), torch=torch.__version__,
                  threads=torch.get_num_threads(), load_before=os.getloadavg(),
                  commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  q_lens={})
    wrong = []
    for q_len in a.q_lens:
        r, bad = run_q_len(a, q_len, dtype, device, backend)
        record["q_lens"][str(q_len)], wrong = r, wrong + bad
        print(f"q_len {q_len:5d} context {a.context}: expanded {r['expanded']['median_ms']:9.1f} ms "
              f"({r['expanded']['min_ms']:.1f}-{r['expanded']['max_ms']:.1f}), absorbed "
              f"{r['absorbed']['median_ms']:9.1f} ms ({r['absorbed']['min_ms']:.1f}-{r['absorbed']['max_ms']:.1f}); "
              f"faster: {r['faster']}, rule picks {r['rule_picks']}; diff {r['max_abs_diff']:.1e}", flush=True)
    return finish_record(record, a.json, wrong)


if __name__ == "__main__":
    raise SystemExit(main())
