"""The recorded fine-tuning runs of issue 31 (docs/guides/finetune.md, "Recorded runs"), on CPU.

    python -m benchmarks.finetune_runs --out docs/results/finetune --work /tmp/ft-runs
        [--parts sft,upcycle,router] [--source /work/ckpt/default] [--seeds 0,1] [--model tiny|small]
        [--dense-steps 150] [--steps 150] [--sft-steps 60] [--router-steps 30] [--repeats 3]
    python -m benchmarks.finetune_runs merge-upcycle --out DIR a/upcycle.json b/upcycle.json

Three parts, each through the project's own commands (train.py, python -m moe.upcycle,
python -m eval), each writing `<out>/<part>.json`:

* sft: MT-Bench answers (judge=none) of `--source` (a pretrained run), an instruction tune of it
  on the repository's chat set (`data=chat`, tests/fixtures/chat/messages.jsonl), and the answers
  again; the answer files go to `<out>/answers/`.
* upcycle: per seed, a dense model (`--model`'s shape with every layer a SwiGLU FFN as wide as one
  expert: 128 for tiny) pretrained for `--dense-steps`, upcycled to 8 experts top-2 (noise 0) and
  trained `--steps` more; against the same MoE (model=tiny: 8 experts of width 128, top-2) from scratch for `--steps` and for
  `--dense-steps + --steps`, and the dense model trained `--steps` more. Validation loss curves
  go to `<out>/upcycle_val_loss.png`.
* router: `--source` fine-tuned with `router=aux_free` and only `*router*` trainable, against
  full fine-tuning with the same `router=aux_free`, `--repeats` interleaved runs each: per-step wall and CPU
  time (benchmarks/finetune_step_worker.py), peak RSS, optimizer state bytes.

`merge-upcycle` joins upcycle records of the same settings run separately (e.g. one seed each, side
by side) into one `upcycle.json` and plot. Run directories go under `--work` (created; it must not exist or be empty). Files already in
`--out` with the names this writes are refused unless `--overwrite`. The machine's load average
is recorded before and after each part: figures from a loaded machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from benchmarks.finetune_report import plot_upcycle, read_upcycle_records

REPO = Path(__file__).resolve().parents[1]
PARTS = ("sft", "upcycle", "router")
CHAT_SET = "tests/fixtures/chat/messages.jsonl"
SFT_OVERRIDES = ["data=chat", f"data.path={CHAT_SET}", "data.val_fraction=0.2", "train.seq_len=128",
                 "train.batch_size=4", "train.eval_interval=10", "train.eval_batches=4", "optim.warmup_steps=5",
                 "optim.lr=1e-3"]
MT_BENCH_OVERRIDES = ["task=mt_bench", "judge=none", "eval.max_new_tokens=64"]
# (layers, expert width) of the model configs the upcycle part takes: the dense twin has every layer a
# SwiGLU FFN as wide as one expert, so the upcycled model is exactly `model=<name>` (8 experts, top-2)
MODEL_SHAPES = {"tiny": (4, 128), "small": (8, 768)}


def dense_model(name: str) -> list[str]:
    layers, width = MODEL_SHAPES[name]
    return [f"model={name}", f"model.n_dense_layers={layers}", f"model.dense_hidden={width}"]


CURVE = ["train.eval_interval=20", "train.log_interval=20", "train.eval_batches=8"]
# Both retarget the loaded topk routers to aux_free (gate kept, bias from 0); they differ only in what trains.
ROUTER_VARIANTS = {
    "full_aux_free": ["router=aux_free", "router.score_func=softmax"],
    "router_only_aux_free": ["router=aux_free", "router.score_func=softmax", "train.trainable=[*router*]"],
}
BASELINE = "full_aux_free"
# Python-source markers: the pretrained tiny model learnt the stdlib's code; chat answers lose them.
CODE_MARKERS = ("def ", "import ", "self", "return ", "\"\"\"", "    #", "class ")


class RunFailed(RuntimeError):
    pass


# --- running the project's commands


def child_env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", PYTHONPATH=str(REPO))
    return env


def run_child(argv: Sequence[str], log_path: Path) -> dict:
    """Run one command (cwd: the repository), its output to `log_path`; wall, CPU (user + sys) and
    peak RSS of that child alone (os.wait4)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO)
        _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise RunFailed(f"{shlex.join(argv)} exited with {rc}; its output is in {log_path}")
    return {"command": shlex.join(argv), "wall_s": time.perf_counter() - t0, "cpu_s": ru.ru_utime + ru.ru_stime,
            "max_rss_mb": ru.ru_maxrss / 1024}


def train(run_dir: Path, overrides: Sequence[str]) -> dict:
    """`python train.py <overrides>` into `run_dir`; the child's costs and the run's summary.json."""
    argv = [sys.executable, "train.py", *overrides, "logger=none", f"hydra.run.dir={run_dir}"]
    out = run_child(argv, run_dir.parent / f"{run_dir.name}.log")
    out["summary"] = json.loads((run_dir / "summary.json").read_text())
    return out


def mt_bench(ckpt: Path, out_dir: Path) -> dict:
    argv = [sys.executable, "-m", "eval", *MT_BENCH_OVERRIDES, f"ckpt={ckpt}", "logger=none",
            f"hydra.run.dir={out_dir}"]
    out = run_child(argv, out_dir.parent / f"{out_dir.name}.log")
    out["results"] = json.loads((out_dir / "results.json").read_text())
    return out


# --- reading what the runs wrote


def val_curve(run_dir: Path) -> list[dict]:
    """[{step, tokens, val_loss}] from a run's metrics.jsonl (tokens = step x batch x seq_len)."""
    cfg = json.loads((run_dir / "config.json").read_text())
    per_step = cfg["train"]["batch_size"] * cfg["train"]["seq_len"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{"step": r["step"], "tokens": r["step"] * per_step, "val_loss": r["val/loss"]} for r in rows
            if "val/loss" in r]


def answer_stats(results: dict, answers: list[dict]) -> dict:
    """How the MT-Bench answers ended and looked: per-turn finish reasons, length, Python markers."""
    gen = results["generation"]
    turns = gen["per_turn"]
    texts = [t for row in answers for t in row["choices"][0]["turns"]]
    stopped = sum(1 for t in turns if t["finish_reason"] == "stop")
    return {"answers": len(texts), "stopped_at_end_of_turn": stopped, "stop_fraction": stopped / len(turns),
            "mean_output_tokens": gen["mean_output_tokens"], "max_new_tokens": gen["max_new_tokens"],
            "truncated_prompts": gen["truncated_prompts"], "empty_answers": sum(1 for t in texts if not t.strip()),
            "answers_with_code_markers": sum(1 for t in texts if any(m in t for m in CODE_MARKERS)),
            "finish_reasons": gen["finish_reasons"]}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spread(values: Sequence[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def machine(note: str) -> dict:
    return {"when": note, "loadavg": Path("/proc/loadavg").read_text().split()[:3], "time": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# --- the parts


def sft_part(work: Path, out: Path, source: Path, steps: int) -> dict:
    """MT-Bench answers before / after instruction tuning `source` on the repository's chat set."""
    before = mt_bench(source, work / "mt_bench_before")
    overrides = [f"train.init_from={source}", *SFT_OVERRIDES, f"train.max_steps={steps}"]
    sft = train(work / "sft", overrides)
    after = mt_bench(work / "sft", work / "mt_bench_after")
    result = {"source": str(source), "chat_set": CHAT_SET, "sft_overrides": overrides, "sft": sft,
              "chat_val_curve": val_curve(work / "sft"), "mt_bench_overrides": MT_BENCH_OVERRIDES}
    (out / "answers").mkdir(exist_ok=True)
    for name, ev in (("before", before), ("after", after)):
        afile = Path(ev["results"]["answer_file"])
        rows = read_jsonl(afile)
        shutil.copyfile(afile, out / "answers" / f"mt_bench_{name}.jsonl")
        result[f"mt_bench_{name}"] = {"command": ev["command"], "wall_s": ev["wall_s"], "cpu_s": ev["cpu_s"],
                                      "model_id": ev["results"]["model_id"], "stats": answer_stats(ev["results"], rows)}
    return result


def upcycle_seed(work: Path, seed: int, dense_steps: int, steps: int, model: str = "tiny") -> dict:
    """One seed of upcycled-vs-scratch: run summaries, costs and validation curves."""
    s, runs, moe_model = f"seed={seed}", {}, f"model={model}"
    runs["dense"] = train(work / f"dense_s{seed}", [*dense_model(model), s, f"train.max_steps={dense_steps}", *CURVE])
    up_dir = work / f"upcycle_out_s{seed}"  # what moe.upcycle writes; the run training it is upcycled_s<seed>
    runs["upcycle_command"] = run_child([sys.executable, "-m", "moe.upcycle", str(work / f"dense_s{seed}"),
                                         str(up_dir), "--experts", "8", "--top-k", "2", "--seed", str(seed)],
                                        work / f"upcycle_out_s{seed}.log")
    plan = {"upcycled": [f"train.init_from={up_dir}", s, f"train.max_steps={steps}", *CURVE],
            "scratch": [moe_model, s, f"train.max_steps={steps}", *CURVE],
            "scratch_total": [moe_model, s, f"train.max_steps={dense_steps + steps}", *CURVE],
            "dense_continued": [f"train.init_from={work / f'dense_s{seed}'}", s, f"train.max_steps={steps}", *CURVE]}
    for name, overrides in plan.items():
        runs[name] = train(work / f"{name}_s{seed}", overrides)
    curves = {name: val_curve(work / f"{name}_s{seed}") for name in ("dense", *plan)}
    # noise 0: the upcycled model computes the dense one's function, so its step-0 loss is the dense final one
    start = {"dense_final_val_loss": curves["dense"][-1]["val_loss"],
             "upcycled_step0_val_loss": curves["upcycled"][0]["val_loss"]}
    return {"seed": seed, "runs": runs, "curves": curves, "upcycled_start": start, "tokenizers_equal": same_tokenizer(
        [work / f"{name}_s{seed}" for name in ("dense", *plan)])}


def same_tokenizer(run_dirs: Sequence[Path]) -> bool:
    """All runs tokenised the data alike (so their validation losses are over the same tokens)."""
    texts = {(d / "tokenizer" / "tokenizer.json").read_bytes() for d in run_dirs}
    return len(texts) == 1


def upcycle_part(work: Path, out: Path, seeds: Sequence[int], dense_steps: int, steps: int, model: str) -> dict:
    per_seed = [upcycle_seed(work, seed, dense_steps, steps, model) for seed in seeds]
    return upcycle_result(per_seed, model, dense_steps, steps, out)


def upcycle_result(per_seed: Sequence[dict], model: str, dense_steps: int, steps: int, out: Path) -> dict:
    """The part's record from its seeds: final validation losses over seeds, and the plot."""
    finals = {name: [seed["curves"][name][-1]["val_loss"] for seed in per_seed]
              for name in ("dense", "upcycled", "scratch", "scratch_total", "dense_continued")}
    plot_upcycle(per_seed, dense_steps, out / "upcycle_val_loss.png")
    return {"model": model, "dense_model": dense_model(model), "dense_steps": dense_steps, "steps": steps,
            "seeds": [seed["seed"] for seed in per_seed], "final_val_loss": {k: spread(v) for k, v in finals.items()},
            "per_seed": per_seed, "plot": "upcycle_val_loss.png"}


def merge_upcycle(files: Sequence[Path], runs: Sequence[dict], out: Path) -> dict:
    """One upcycle record from several runs of the part with the same settings (e.g. one seed each,
    run side by side): the seeds joined, the summary and the plot redone, each run's provenance kept."""
    model, dense_steps, steps = runs[0]["model"], runs[0]["dense_steps"], runs[0]["steps"]
    result = upcycle_result([seed for r in runs for seed in r["per_seed"]], model, dense_steps, steps, out)
    result["merged_from"] = [{"file": str(f), "seeds": r["seeds"], "commit": r["commit"], "command": r["command"],
                              "machine": r["machine"]} for f, r in zip(files, runs)]
    return result


def merge_main(argv: Sequence[str]) -> int:
    """`merge-upcycle --out DIR A.json B.json ...` -> DIR/upcycle.json and DIR/upcycle_val_loss.png."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.finetune_runs merge-upcycle")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("files", type=Path, nargs="+")
    a = p.parse_args(argv)
    try:
        taken = [f for f in outputs_of(["upcycle"]) if (a.out / f).exists() and (a.out / f) not in a.files]
        if taken and not a.overwrite:
            raise ValueError(f"--out={str(a.out)!r} already has {', '.join(taken)}; add --overwrite to replace them")
        missing = [str(f) for f in a.files if not f.is_file()]
        if missing:
            raise ValueError(f"merge-upcycle: no such file: {', '.join(missing)}")
        runs = read_upcycle_records(a.files)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    result = merge_upcycle(a.files, runs, a.out)
    result["command"] = shlex.join([sys.executable, "-m", "benchmarks.finetune_runs", "merge-upcycle", *argv])
    result["commit"] = git_commit()
    (a.out / "upcycle.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"upcycle: wrote {a.out / 'upcycle.json'} (seeds {result['seeds']})")
    return 0


def router_part(work: Path, source: Path, steps: int, repeats: int, warmup: int = 5) -> dict:
    """Router-only retraining vs full fine-tuning: `repeats` rounds, each running every variant
    once (interleaved, so load changes hit all alike); per-step medians after `warmup` steps."""
    common = [f"train.init_from={source}", f"train.max_steps={steps}", f"train.eval_interval={steps}",
              f"train.ckpt_interval={steps}", f"train.log_interval={steps}"]
    runs = {name: [] for name in ROUTER_VARIANTS}
    for r in range(repeats):
        for name, extra in ROUTER_VARIANTS.items():
            run_dir, out = work / f"router_{name}_r{r}", work / f"router_{name}_r{r}.json"
            argv = [sys.executable, "-m", "benchmarks.finetune_step_worker", str(run_dir), str(out), *common, *extra,
                    "logger=none"]
            cost = run_child(argv, work / f"router_{name}_r{r}.log")
            rec = json.loads(out.read_text())
            rec.update(process=cost, load=machine(f"after {name} r{r}")["loadavg"],
                       step_wall_median_s=statistics.median(rec["step_wall_s"][warmup:]),
                       step_cpu_median_s=statistics.median(rec["step_cpu_s"][warmup:]))
            runs[name].append(rec)
    return {"source": str(source), "steps": steps, "warmup_steps_dropped": warmup, "repeats": repeats,
            "common_overrides": common, "variants": ROUTER_VARIANTS, "summary": router_summary(runs), "runs": runs}


def router_summary(runs: dict) -> dict:
    """Per variant: medians (min-max) over repeats; ratios to full fine-tuning per repeat, then their median."""
    out = {}
    for name, recs in runs.items():
        out[name] = {"step_wall_s": spread([r["step_wall_median_s"] for r in recs]),
                     "step_cpu_s": spread([r["step_cpu_median_s"] for r in recs]),
                     "peak_rss_mb": spread([r["peak_rss_mb"] for r in recs]),
                     "rss_growth_in_training_mb": spread([r["peak_rss_mb"] - r["rss_at_first_step_mb"] for r in recs]),
                     "optimizer_state_bytes": recs[0]["optimizer_state_bytes"],
                     "trainable_params": recs[0]["trainable_params"], "params": recs[0]["params"],
                     "final_val_loss": spread([r["final_val_loss"] for r in recs]),
                     "initial_val_loss": recs[0]["initial_val_loss"]}
        base = runs[BASELINE]
        for key in ("step_wall_median_s", "step_cpu_median_s"):
            out[name][f"{key}_ratio_to_full"] = spread([r[key] / b[key] for r, b in zip(recs, base)])
    return out


# --- the command


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--source", type=Path, default=Path("/work/ckpt/default"))
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--model", choices=sorted(MODEL_SHAPES), default="tiny", help="the upcycle part's MoE")
    p.add_argument("--dense-steps", type=int, default=150)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--router-steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--overwrite", action="store_true", help="replace this command's files in --out")
    return p.parse_args(argv)


def outputs_of(parts: Sequence[str]) -> list[str]:
    extra = {"sft": ["answers/mt_bench_before.jsonl", "answers/mt_bench_after.jsonl"],
             "upcycle": ["upcycle_val_loss.png"], "router": []}
    return [f for part in parts for f in (f"{part}.json", *extra[part])]


def check_args(a: argparse.Namespace) -> tuple[list[str], list[int]]:
    """The parts and seeds; a bad option is a ValueError naming it, before anything runs."""
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"--parts={a.parts!r}: each must be one of {', '.join(PARTS)}")
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds={a.seeds!r} must be integers separated by commas, e.g. 0,1") from None
    if not seeds:
        raise ValueError(f"--seeds={a.seeds!r} names no seed")
    for name in ("dense_steps", "steps", "sft_steps", "router_steps", "repeats"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(a, name)} must be >= 1")
    if "router" in parts and a.router_steps <= 5:
        raise ValueError(f"--router-steps={a.router_steps} must be > 5 (the first 5 steps are not timed)")
    if {"sft", "router"} & set(parts) and not (a.source / "summary.json").is_file():
        raise ValueError(f"--source={str(a.source)!r} is not a finished run directory (no summary.json)")
    if a.work.exists() and any(a.work.iterdir()):
        raise ValueError(f"--work={str(a.work)!r} is not empty; give a new directory")
    taken = [f for f in outputs_of(parts) if (a.out / f).exists()]
    if taken and not a.overwrite:
        raise ValueError(f"--out={str(a.out)!r} already has {', '.join(taken)}; add --overwrite to replace them")
    return parts, seeds


def git_commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def run_part(part: str, a: argparse.Namespace, source: Path, seeds: Sequence[int]) -> dict:
    if part == "sft":
        return sft_part(a.work, a.out, source, a.sft_steps)
    if part == "upcycle":
        return upcycle_part(a.work, a.out, seeds, a.dense_steps, a.steps, a.model)
    return router_part(a.work, source, a.router_steps, a.repeats)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge-upcycle"]:
        return merge_main(argv[1:])
    a = parse_args(argv)
    try:
        parts, seeds = check_args(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    source = a.source.resolve()
    for part in parts:
        before = machine("before")
        try:
            result = run_part(part, a, source, seeds)
        except RunFailed as e:  # a run of the project failed: its log says why; the parts done so far are kept
            print(f"error: {part}: {e}", file=sys.stderr)
            return 1
        result["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                             "load": [before, machine("after")], "omp_num_threads": 1}
        result["commit"] = git_commit()
        result["command"] = shlex.join([sys.executable, "-m", "benchmarks.finetune_runs", *argv])
        (a.out / f"{part}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"{part}: wrote {a.out / f'{part}.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
