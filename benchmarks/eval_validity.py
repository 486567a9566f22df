"""Our evaluations against the references on the same model: TruthfulQA MC1/MC2 against
lm-evaluation-harness (its Python API, its own truthfulqa_mc1 / truthfulqa_mc2 task files pointed
at the local copy of the data, no hub access) and `task=perplexity` against a plain HF
transformers loop, question by question and number by number.

    python -m benchmarks.eval_validity outputs/runs/x                       # a moe-lab run: exported first
    python -m benchmarks.eval_validity ~/models/OLMoE-1B-7B-0924 --limit 100 --text ../shared/data/corpus/tinyshakespeare.txt

Prints a Markdown table (ours, the reference, the difference) and the largest per-question
difference; exits 1 when a score differs by more than --atol. `--json PATH` also writes the rows, the
per-question worst differences, the times (wall and CPU), the versions and the load before and after
(refused if PATH exists: it never overwrites). Recorded: docs/results/eval_validity/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eval.__main__ import run_eval  # noqa: E402
from eval.common import SHARED_DATA, read_jsonl  # noqa: E402
from eval.tasks.perplexity import perplexity  # noqa: E402
from moe.hf.commands import export_hf  # noqa: E402
from moe.hf.layout import is_hf_dir  # noqa: E402
from moe.loading import load_model  # noqa: E402
from moe.report import markdown_table  # noqa: E402

TRUTHFULQA_V0 = SHARED_DATA / "truthfulqa" / "v0"


# ---------------------------------------------------------------------------- lm-evaluation-harness

def harness_task_dir(out: Path, data_file: Path) -> list[str]:
    """The harness's own truthfulqa_mc1 / truthfulqa_mc2 task files, renamed and pointed at a local
    HF-schema `multiple_choice.jsonl` (dataset `json`) instead of the hub; their prompt, choices
    and metrics unchanged. Returns the task names."""
    import lm_eval  # lazy: the `dev` extra; only this comparison needs it

    src = Path(lm_eval.__file__).parent / "tasks" / "truthfulqa"
    mc1 = (src / "truthfulqa_mc1.yaml").read_text()
    mc2 = (src / "truthfulqa_mc2.yaml").read_text()
    edits = [
        (mc1, "tag:\n  - truthfulqa\n", ""),
        (mc1, "task: truthfulqa_mc1\n", "task: moe_truthfulqa_mc1\n"),
        (mc1, "dataset_path: truthfulqa/truthful_qa\ndataset_name: multiple_choice\n",
         f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    validation: {json.dumps(str(data_file))}\n"),
        (mc2, "include: truthfulqa_mc1.yaml\n", "include: moe_truthfulqa_mc1.yaml\n"),
        (mc2, "task: truthfulqa_mc2\n", "task: moe_truthfulqa_mc2\n"),
    ]
    texts = {"mc1": mc1, "mc2": mc2}
    for text, old, new in edits:
        key = "mc1" if text is mc1 else "mc2"
        if old not in texts[key]:
            raise RuntimeError(f"lm-eval {lm_eval.__version__}: {key} task file has no {old!r}; update harness_task_dir")
        texts[key] = texts[key].replace(old, new)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_truthfulqa_mc1.yaml").write_text(texts["mc1"])
    (out / "moe_truthfulqa_mc2.yaml").write_text(texts["mc2"])
    (out / "utils.py").write_text((src / "utils.py").read_text())  # process_results_mc2
    return ["moe_truthfulqa_mc1", "moe_truthfulqa_mc2"]


def harness_truthfulqa(hf_dir, limit: Optional[int] = None, batch_size: int = 16, data_dir=TRUTHFULQA_V0) -> dict:
    """MC1, MC2 and per-question scores from lm-evaluation-harness's HFLM on `hf_dir` (fp32, CPU)."""
    from lm_eval import simple_evaluate  # lazy: the `dev` extra; only this comparison needs it
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory() as tmp:
        tasks = harness_task_dir(Path(tmp), Path(data_dir) / "multiple_choice.jsonl")
        res = simple_evaluate(model="hf", model_args={"pretrained": str(hf_dir), "dtype": "float32"},
                              tasks=tasks, limit=limit, batch_size=batch_size, device="cpu",
                              task_manager=TaskManager(include_path=tmp), log_samples=True)
    per_doc = {name: {s["doc_id"]: float(s["acc"]) for s in res["samples"][f"moe_truthfulqa_{name}"]}
               for name in ("mc1", "mc2")}
    return {"mc1": res["results"]["moe_truthfulqa_mc1"]["acc,none"],
            "mc2": res["results"]["moe_truthfulqa_mc2"]["acc,none"], "per_doc": per_doc}


def ours_truthfulqa(ckpt, limit: Optional[int] = None, data_dir=TRUTHFULQA_V0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        res = run_eval({"ckpt": str(ckpt), "eval": {"task": "truthfulqa", "limit": limit, "data_path": str(data_dir)},
                        "logger": {"name": "none"}}, Path(tmp))
        rows = read_jsonl(Path(tmp) / "samples.jsonl")
    per_doc = {name: {r["index"]: float(r[name]) for r in rows} for name in ("mc1", "mc2")}
    return {"mc1": res["scores"]["mc1"], "mc2": res["scores"]["mc2"], "per_doc": per_doc}


# ---------------------------------------------------------------------------- perplexity

@torch.no_grad()
def hf_loop_perplexity(hf_dir, text: str, max_length: int, stride: int) -> dict:
    """HF's "perplexity of fixed-length models" loop on `transformers` alone (after the same start
    token as ours), counting the labels each window's mean loss covers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy, as lm_eval: only the references need it

    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    seq = torch.tensor([[start] + tok.encode(text, add_special_tokens=False)])
    nll, n, prev_end = 0.0, 0, 0
    for begin in range(0, seq.shape[1], stride):
        end = min(begin + max_length, seq.shape[1])
        labels = seq[:, begin:end].clone()
        labels[:, : (end - begin) - (end - prev_end)] = -100
        loss = model(input_ids=seq[:, begin:end], labels=labels).loss
        count = int((labels[:, 1:] != -100).sum())
        nll, n, prev_end = nll + float(loss) * count, n + count, end
        if end == seq.shape[1]:
            break
    return {"token_perplexity": math.exp(nll / n), "byte_perplexity": math.exp(nll / len(text.encode("utf-8"))),
            "tokens": n}


# ---------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", help="a moe-lab checkpoint or run dir (exported to HF first), or an HF directory")
    ap.add_argument("--limit", type=int, default=None, help="the first N TruthfulQA questions (default: all 817)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--text", default=str(SHARED_DATA / "corpus" / "tinystories_valid_head.txt"))
    ap.add_argument("--max-tokens", type=int, default=20000, help="perplexity over the first N tokens")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--stride", type=int, default=128)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--json", default=None, help="also write the record (rows, times, versions, load) here; must not exist")
    args = ap.parse_args(argv)
    if args.json and Path(args.json).exists():
        print(f"--json: {args.json} exists; choose a new path (this command never overwrites)", file=sys.stderr)
        return 2
    load_before, cpu0 = os.getloadavg(), cpu_seconds()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(args.ckpt) if is_hf_dir(args.ckpt) else export_hf(args.ckpt, Path(tmp) / "hf")
        t0 = time.perf_counter()
        ours = ours_truthfulqa(hf_dir, args.limit)
        t1 = time.perf_counter()
        ref = harness_truthfulqa(hf_dir, args.limit, args.batch_size)
        t2 = time.perf_counter()
        model, tok, _ = load_model(hf_dir)
        body = tok.encode(Path(args.text).read_text(encoding="utf-8"))[: args.max_tokens]
        text = tok.decode(body, skip_special_tokens=False)
        ppl = perplexity(model, tok, text, args.max_length, args.stride)
        ppl_ref = hf_loop_perplexity(hf_dir, text, args.max_length, args.stride)
    worst = {k: max(abs(ours["per_doc"][k][i] - ref["per_doc"][k][i]) for i in ref["per_doc"][k]) for k in ("mc1", "mc2")}
    n = len(ref["per_doc"]["mc1"])
    rows = [[f"TruthfulQA MC1 ({n} q)", ours["mc1"], ref["mc1"], abs(ours["mc1"] - ref["mc1"]), worst["mc1"]],
            [f"TruthfulQA MC2 ({n} q)", ours["mc2"], ref["mc2"], abs(ours["mc2"] - ref["mc2"]), worst["mc2"]],
            [f"token perplexity ({ppl['tokens']} tokens)", ppl["token_perplexity"], ppl_ref["token_perplexity"],
             abs(ppl["token_perplexity"] - ppl_ref["token_perplexity"]), None],
            ["byte perplexity", ppl["byte_perplexity"], ppl_ref["byte_perplexity"],
             abs(ppl["byte_perplexity"] - ppl_ref["byte_perplexity"]), None]]
    print(markdown_table(["score", "ours", "reference", "|difference|", "largest per-question |difference|"],
                         rows, float_fmt="{:.6f}"))
    print(f"ours: TruthfulQA {t1 - t0:.0f}s; lm-evaluation-harness: {t2 - t1:.0f}s; "
          f"references: lm-evaluation-harness for TruthfulQA, a plain transformers loop for perplexity")
    ok = all(r[3] <= args.atol * max(1.0, abs(r[2])) for r in rows) and max(worst.values()) <= args.atol
    if args.json:
        write_record(Path(args.json), args, rows, worst, {"ours_truthfulqa_s": t1 - t0, "harness_truthfulqa_s": t2 - t1,
                     "total_wall_s": time.perf_counter() - t0, "total_cpu_s": cpu_seconds() - cpu0}, load_before, ok)
    return 0 if ok else 1


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def write_record(path: Path, args, rows: list, worst: dict, times: dict, load_before, ok: bool) -> None:
    """The run as JSON: what the table prints, plus the times, versions and machine load."""
    import lm_eval  # lazy: an optional reference, imported only when a record is written
    import transformers

    record = {"args": vars(args), "ok": ok,
              "rows": [dict(zip(["score", "ours", "reference", "abs_difference", "largest_per_question"], r)) for r in rows],
              "largest_per_question": worst, "times": times,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "lm_eval": getattr(lm_eval, "__version__", "?"), "python": platform.python_version()},
              "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                          "load_before": load_before, "load_after": os.getloadavg()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
