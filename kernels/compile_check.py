"""Compile every Triton kernel for a CUDA GPU on a machine without one (ahead of time).

    python -m kernels.compile_check [--arch 90] [--quick] [--json compile_check.json]

The kernel tests run the kernels under `TRITON_INTERPRET=1`, which checks their arithmetic but not
whether they compile: the interpreter executes the Python body with numpy and skips the whole GPU
pipeline (type checking of `tl.dot` operands and tile shapes, layout conversion, software
pipelining, LLVM, `ptxas`). This tool runs that pipeline for a chosen compute capability
(default 90, the H100/H200) through the same launchers the model calls, on CPU tensors, and
reports per kernel specialisation and autotune config: warps, stages and the shared memory it
needs against the architecture's per-block limit.

How: Triton compiles a kernel on its first launch for `driver.active.get_current_target()`. Inside
`compile_only(arch)` the active driver is a stand-in reporting `GPUTarget("cuda", arch, 32)`,
`JITFunction.run` compiles (`warmup=True`) and returns without launching, and the autotuner
compiles every one of its configs instead of timing them. The launchers' "tensors must be on
CUDA" checks are lifted for the duration; the outputs are left uninitialised (nothing runs), which
is fine because only the launch arguments matter. What it cannot see: runtime faults
(out-of-bounds addresses, races), register spills (known only once the cubin is loaded on a
device) and speed. Those need a GPU: `TRITON_INTERPRET=0 pytest tests/kernels` there.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Callable, Iterator, Optional
from unittest import mock

import torch

import kernels

# Max dynamic shared memory per block (bytes) by compute capability (CUDA programming guide,
# "Technical Specifications per Compute Capability").
SHARED_LIMITS = {70: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448,
                 100: 232448, 120: 101376}


@dataclass
class CompiledKernel:
    kernel: str
    constexprs: dict
    num_warps: int
    num_stages: int
    shared_bytes: int
    seconds: float
    autotuned: bool  # one config of an autotuner (a config that fails is skipped at run time)
    cubin_bytes: int = 0  # size of the device binary ptxas produced
    registers: Optional[int] = None  # per thread (255 is the hardware maximum)
    stack_bytes: Optional[int] = None  # per thread; > 0 here means register spills to local memory
    # which tensor-core instructions the dots became: "wgmma" (Hopper's asynchronous warpgroup MMA),
    # "mma.sync" (the Ampere-style warp MMA), or "none" (no dot, or exact-fp32 dots done with FMAs)
    tensor_cores: Optional[str] = None
    error: Optional[str] = None


@dataclass
class Report:
    arch: int
    shared_limit: Optional[int]
    kernels: list = field(default_factory=list)

    def problems(self) -> list[str]:
        """Launches that would fail on the device: compile errors and shared memory over the limit
        for fixed-config kernels; for autotuned kernels only when *every* config of a launch fails."""
        out, by_launch = [], {}
        for k in self.kernels:
            bad = k.error or (self.shared_limit is not None and k.shared_bytes > self.shared_limit)
            why = k.error or f"needs {k.shared_bytes} B of shared memory > {self.shared_limit} B on sm_{self.arch}"
            if not k.autotuned:
                if bad:
                    out.append(f"{k.kernel} {k.constexprs}: {why}")
                continue
            key = (k.kernel, tuple(sorted((n, v) for n, v in k.constexprs.items() if n not in _TUNED)))
            by_launch.setdefault(key, []).append((bad, why))
        for (name, consts), results in by_launch.items():
            if all(bad for bad, _ in results):
                out.append(f"{name} {dict(consts)}: every autotune config fails, e.g. {results[0][1]}")
        return out

    def spills(self) -> list["CompiledKernel"]:
        """Compiled kernels whose registers spill to local memory (a speed warning, not a failure)."""
        return [k for k in self.kernels if k.stack_bytes]


_TUNED = {"BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_I", "BLOCK_J"}  # what our autotuners vary (BLOCK_M: quant linear)


class _CompileOnlyDriver:
    """Just enough of Triton's driver interface for `JITFunction.run(..., warmup=True)`."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def _resource_usage(cubin: bytes) -> tuple[Optional[int], Optional[int]]:
    """(registers, stack bytes) per thread from `cuobjdump -res-usage` (shipped with Triton), or
    (None, None) when it is unavailable. A non-zero stack in a Triton kernel means spilled registers."""
    if not cubin:
        return None, None
    try:
        from triton import knobs
        tool = knobs.nvidia.cuobjdump.path
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    except Exception:  # noqa: BLE001  (the figures are extra information, not the check itself)
        return None, None
    reg, stack = re.search(r"REG:(\d+)", text), re.search(r"STACK:(\d+)", text)
    return (int(reg.group(1)) if reg else None), (int(stack.group(1)) if stack else None)


def _tensor_cores(ptx: str) -> str:
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if "mma.sync" in ptx:
        return "mma.sync"
    return "none"


@contextlib.contextmanager
def compile_only(arch: int = 90) -> Iterator[Report]:
    """Within the block, Triton kernel launches compile for sm_`arch` and return without running;
    the yielded report collects one entry per compiled kernel (errors included, not raised)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver
    from triton.language import standard as tl_standard
    from triton.runtime.jit import JITFunction

    if not isinstance(tl_standard.cdiv, JITFunction):
        raise RuntimeError("kernels.compile_check needs a process in which triton was imported with "
                           "TRITON_INTERPRET unset (under the interpreter Triton's own library functions are "
                           "built for the interpreter and cannot be compiled); run `python -m kernels.compile_check`")
    report = Report(arch, SHARED_LIMITS.get(arch))
    jit_run = JITFunction.run
    tuning = []  # set while the autotuner compiles its configs
    touched = set()  # JITFunctions whose per-device caches now hold sm_`arch` binaries

    def compile_run(self, *args, grid, warmup, **kwargs):
        consts = {p.name: kwargs[p.name] for p in self.params if p.is_constexpr and p.name in kwargs}
        touched.add(self)
        t0 = time.perf_counter()
        try:
            k = jit_run(self, *args, grid=grid, warmup=True, **kwargs)
            md = k.metadata
            cubin, ptx = k.asm.get("cubin", b""), k.asm.get("ptx", "")
            rec = CompiledKernel(self.__name__, consts, md.num_warps, md.num_stages, md.shared,
                                 time.perf_counter() - t0, bool(tuning), len(cubin), *_resource_usage(cubin),
                                 tensor_cores=_tensor_cores(ptx))
        except Exception as e:  # noqa: BLE001  (a compile failure is the finding; keep going)
            first = str(e).strip().splitlines()[:1] or [type(e).__name__]
            rec = CompiledKernel(self.__name__, consts, kwargs.get("num_warps", 4), kwargs.get("num_stages", 3),
                                 0, time.perf_counter() - t0, bool(tuning),
                                 error=f"{type(e).__name__}: {first[0][:300]}")
        report.kernels.append(rec)
        return None

    def compile_all_configs(self, *args, **kwargs):
        tuning.append(True)
        try:
            for cfg in self.configs:
                self.fn.run(*args, **kwargs, **cfg.all_kwargs())
        finally:
            tuning.pop()
        return None

    saved_env = os.environ.get("TRITON_INTERPRET")
    saved_driver = driver._active  # no public getter; restored exactly below
    os.environ["TRITON_INTERPRET"] = "0"
    driver.set_active(_CompileOnlyDriver(arch))
    try:
        with contextlib.ExitStack() as patches:
            patches.enter_context(mock.patch.object(JITFunction, "run", compile_run))
            patches.enter_context(mock.patch.object(Autotuner, "run", compile_all_configs))
            for cases in compile_case_modules().values():
                for launch in cases.LAUNCH_MODULES:
                    patches.enter_context(mock.patch.object(launch, "check_launch", lambda *tensors, **kw: None))
            yield report
    finally:
        driver._active = saved_driver
        for fn in touched:  # a later real launch in this process must not find these binaries
            fn.device_caches.clear()
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env


# ================================================================================ what to compile

def compile_case_modules() -> dict[str, ModuleType]:
    """`kernels/<name>/compile_cases.py` of every kernel folder, by the part name it declares (`PART`).
    Each has `launches(dtype_name, dtype, arch, options) -> [(description, callable)]` and the launch
    modules whose CUDA-only checks are lifted (`LAUNCH_MODULES`): a new kernel brings its own cases."""
    found = {}
    for pkg in pkgutil.iter_modules(kernels.__path__):
        if pkg.ispkg and importlib.util.find_spec(f"kernels.{pkg.name}.compile_cases") is not None:
            mod = importlib.import_module(f"kernels.{pkg.name}.compile_cases")
            found[mod.PART] = mod
    return found


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
QUICK = dict(dtypes=["bf16", "fp32"], head_dims=[128], groups=[4])
FULL = dict(dtypes=["bf16", "fp16", "fp32"], head_dims=[64, 128], groups=[1, 2, 4, 8])


def launches(dtypes=FULL["dtypes"], head_dims=FULL["head_dims"], groups=FULL["groups"], parts=None,
             quant_formats=None, arch: int = 90) -> list[tuple[str, Callable[[], None]]]:
    """(description, callable) for each group of launches to compile: every dtype x the cases of
    every kernel folder in `parts` (default all; `compile_case_modules`). A bad option: ValueError."""
    modules = compile_case_modules()
    unknown = set(parts or ()) - set(modules)
    if unknown:
        raise ValueError(f"--parts: unknown {sorted(unknown)}; allowed: {sorted(modules)}")
    options = {"head_dims": head_dims, "groups": groups, "quant_formats": quant_formats}
    return [case for name in dtypes for part, cases in modules.items() if parts is None or part in parts
            for case in cases.launches(name, DTYPES[name], arch, options)]


def run(arch: int = 90, progress: bool = True, **which) -> Report:
    with compile_only(arch) as report:
        for desc, fn in launches(arch=arch, **which):
            n0, t0 = len(report.kernels), time.perf_counter()
            fn()
            if progress:
                new = report.kernels[n0:]
                errs = sum(k.error is not None for k in new)
                print(f"  {desc}: {len(new)} compiles in {time.perf_counter() - t0:.1f}s"
                      + (f", {errs} failed" if errs else ""), flush=True)
    return report


def format_table(report: Report) -> str:
    lines = ["| kernel | constexprs | warps | stages | shared KiB | registers | spill (stack) B | tensor cores | result |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k in report.kernels:
        consts = ", ".join(f"{n}={v}" for n, v in k.constexprs.items())
        if k.error:
            result = k.error
        elif report.shared_limit is not None and k.shared_bytes > report.shared_limit:
            result = "over the shared-memory limit" + (" (autotune skips it)" if k.autotuned else "")
        else:
            result = "ok"
        lines.append(f"| {k.kernel} | {consts} | {k.num_warps} | {k.num_stages} | {k.shared_bytes / 1024:.1f} | "
                     f"{k.registers} | {k.stack_bytes} | {k.tensor_cores} | {result} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability as an int (80, 90, ...)")
    ap.add_argument("--quick", action="store_true", help=f"only {QUICK} (default: {FULL})")
    ap.add_argument("--dtypes", default=None, help="comma list of bf16,fp16,fp32")
    ap.add_argument("--head-dims", default=None, help="comma list of paged-attention head dims")
    ap.add_argument("--groups", default=None, help="comma list of GQA group sizes (query heads per kv head)")
    ap.add_argument("--parts", default=None, help="which kernels: comma list of "
                    f"{', '.join(compile_case_modules())} (default all)")
    ap.add_argument("--quant-formats", default=None,
                    help="comma list of the quantized GEMMs' formats (kernels/quant_gemm/compile_cases.py; default all)")
    ap.add_argument("--json", default=None, help="write the per-kernel records here")
    ap.add_argument("--table", action="store_true", help="print a Markdown table of every compile")
    args = ap.parse_args(argv)
    print(f"compiling the Triton kernels for sm_{args.arch} (no GPU needed)", flush=True)
    t0 = time.perf_counter()
    which = dict(QUICK if args.quick else FULL)
    if args.dtypes:
        which["dtypes"] = args.dtypes.split(",")
    if args.head_dims:
        which["head_dims"] = [int(v) for v in args.head_dims.split(",")]
    if args.groups:
        which["groups"] = [int(v) for v in args.groups.split(",")]
    which["parts"] = args.parts.split(",") if args.parts else None
    which["quant_formats"] = args.quant_formats.split(",") if args.quant_formats else None
    unknown = set(which["dtypes"]) - set(DTYPES)
    if unknown:
        ap.error(f"--dtypes: unknown {sorted(unknown)}; allowed: {sorted(DTYPES)}")
    try:
        launches(arch=args.arch, **which)  # the options checked before anything compiles
    except ValueError as e:
        ap.error(str(e))
    report = run(args.arch, **which)
    problems = report.problems()
    if args.table:
        print(format_table(report))
    n_err = sum(k.error is not None for k in report.kernels)
    print(f"{len(report.kernels)} compiles ({n_err} failed) in {time.perf_counter() - t0:.0f}s; "
          f"max shared memory {max((k.shared_bytes for k in report.kernels), default=0)} B "
          f"(limit {report.shared_limit})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arch": report.arch, "shared_limit": report.shared_limit, "problems": problems,
                       "spills": len(report.spills()),
                       "kernels": [asdict(k) for k in report.kernels]}, f, indent=2)
    spills = report.spills()
    print(f"{len(spills)} of them spill registers (stack > 0): "
          + (", ".join(sorted({f"{k.kernel} {_tiles(k)} {k.stack_bytes} B" for k in spills})) or "none"))
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


def _tiles(k: CompiledKernel) -> str:
    keys = [n for n in k.constexprs if n.startswith("BLOCK") or n in ("EPILOGUE", "IEEE", "HEAD_DIM", "FMT")]
    return "(" + ", ".join(f"{n}={k.constexprs[n]}" for n in keys) + f", warps={k.num_warps})"


if __name__ == "__main__":
    sys.exit(main())
