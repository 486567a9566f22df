"""Wall and CPU time of lm-evaluation-harness's `hf` back-end and this project's `moe_lab` back-end on the
same exported model and the same multiple-choice tasks; exits 1 if their outputs differ.

    python -m benchmarks.lm_eval_speed --out docs/results/lm_eval/speed.json            # defaults below
    python -m benchmarks.lm_eval_speed --d-model 256 --layers 4 --limit 20 --repeats 3 --threads 2

The model is a randomly initialised moe-lab MoE (byte-level BPE tokenizer trained on a few lines),
saved and exported with `python -m moe.hf export`'s function; both back-ends load that HF directory
(moe_lab through `moe.load_model`). Tasks: the tests' local multiple-choice task (`moe_lab_mc`, short
contexts) and TruthfulQA MC2 over the local data (`truthfulqa_mc2_local`, a long context shared by
each question's choices). Each repeat runs `simple_evaluate` on an already-built back-end (loading is
not timed). Outputs are compared per document: log-likelihoods within --tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Offline before the harness and datasets read these: every task here is local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import lm_eval  # noqa: E402
import torch  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

import eval.harness.model  # noqa: E402,F401  (registers moe_lab)
from eval.harness.run import task_manager  # noqa: E402
from moe.checkpoint import checkpoint_path, save_checkpoint, tokenizer_files  # noqa: E402
from moe.config import Config, ModelConfig, TrainConfig, to_dict  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402
from moe.data import Tokenizer  # noqa: E402
from moe.hf.commands import export_hf  # noqa: E402
from moe.model import Transformer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LOCAL_TASKS = REPO / "tests" / "eval" / "lm_eval_tasks"
CORPUS = "the quick brown fox jumps over the lazy dog. a cat sat on the mat and the dog ran to the park.\n"


def make_model(out: Path, d_model: int, layers: int, experts: int, seq_len: int) -> Path:
    """A random moe-lab checkpoint exported as an HF directory (the same weights for both back-ends)."""
    tok = Tokenizer.train([CORPUS * 40], vocab_size=512)
    cfg = Config(model=ModelConfig(vocab_size=len(tok), d_model=d_model, n_layers=layers, n_heads=d_model // 32,
                                   n_kv_heads=max(1, d_model // 64), n_experts=experts, expert_hidden=d_model,
                                   max_seq_len=seq_len, router=router_config("topk", top_k=2)),
                 train=TrainConfig(seq_len=min(seq_len, 256)))
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    ckpt = save_checkpoint(checkpoint_path(out / "run", 1), {"model": model.state_dict(), "config": to_dict(cfg),
                                                            "tokenizer": tokenizer_files(tok), "step": 1})
    return export_hf(ckpt, out / "hf")


def responses(result: dict) -> dict:
    """{task: [per document: [log-likelihood per choice]]}."""
    return {t: [[float(r[0][0]) for r in s["resps"]] for s in rows] for t, rows in result["samples"].items()}


def max_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for task in b:
        if len(a[task]) != len(b[task]):
            return float("inf")
        for x, y in zip(a[task], b[task]):
            if len(x) != len(y):
                return float("inf")
            worst = max([worst] + [abs(p - q) for p, q in zip(x, y)])
    return worst


def time_backend(lm, tasks: list[str], manager, limit: int, repeats: int) -> tuple[list[dict], dict]:
    runs, result = [], None
    # An untimed warm-up: the first evaluation of a process imports the tasks' metric code (TruthfulQA's
    # rouge_score -> nltk -> scipy, ~3.6 s of wall on this CPU), which would otherwise land in the timed
    # repeats of whichever back-end runs first.
    lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=2, random_seed=0)
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit, log_samples=True,
                                         random_seed=0)
        runs.append({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu})
    return runs, result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["moe_lab_mc", "truthfulqa_mc2_local"])
    p.add_argument("--limit", type=int, default=20, help="documents per task")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="both back-ends' batch size")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024, help="the model's context (TruthfulQA needs ~400 tokens)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--out", type=Path, default=None, help="write the JSON record here (else stdout only)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = make_model(Path(tmp), a.d_model, a.layers, a.experts, a.seq_len)
        manager = task_manager([str(LOCAL_TASKS)], include_defaults=False)
        backends = {"moe_lab": get_model("moe_lab")(pretrained=str(hf_dir), batch_size=a.batch_size, device="cpu"),
                    "hf": get_model("hf")(pretrained=str(hf_dir), batch_size=a.batch_size, device="cpu",
                                          dtype="float32")}
        timings, outputs = {}, {}
        for name, lm in backends.items():
            timings[name], result = time_backend(lm, a.tasks, manager, a.limit, a.repeats)
            outputs[name] = responses(result)
            print(f"{name}: wall {[round(r['wall_s'], 2) for r in timings[name]]} s", flush=True)
    diff = max_difference(outputs["moe_lab"], outputs["hf"])
    best = {n: min(r["wall_s"] for r in runs) for n, runs in timings.items()}
    record = {"command": " ".join([Path(sys.executable).name, "-m", "benchmarks.lm_eval_speed", *sys.argv[1:]]),
              "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                       text=True).stdout.strip(),
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpu_count": os.cpu_count(), "torch_threads": a.threads, "torch": torch.__version__},
              "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
              "args": {k: str(v) for k, v in vars(a).items()},
              "timings": timings, "best_wall_s": best, "speedup_best_wall": best["hf"] / best["moe_lab"],
              "max_abs_loglik_difference": diff, "outputs_equal": diff <= a.tolerance,
              "backend_stats": backends["moe_lab"].stats}
    text = json.dumps(record, indent=2)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    if diff > a.tolerance:
        print(f"error: the back-ends' log-likelihoods differ by {diff:.3g} > {a.tolerance}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
