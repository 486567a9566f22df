"""benchmarks/sweep_report.py on synthetic Hydra multirun directories."""

import json
import math
import subprocess
import sys

import pytest

from benchmarks.sweep_report import find_run_dirs, group_runs, load_run, main, summarize_run, write_report
from tests.conftest import REPO


def make_run(d, router, seed, val_losses, imbalance, top_k=2, tok_s=1000.0, extra_log=None):
    d.mkdir(parents=True)
    cfg = {"seed": seed, "router": {"name": router, "top_k": top_k}, "model": {"n_experts": 8},
           "logger": {"name": "none", "tags": [f"router={router}"]}}
    (d / "config.json").write_text(json.dumps(cfg))
    recs = [{"step": 0, "val/loss": val_losses[0]}]
    for i, step in enumerate(range(10, 10 * len(imbalance) + 1, 10)):
        rec = {"step": step, "train/loss": 5.0, "perf/tokens_per_s": tok_s + i, "moe/load_imbalance": imbalance[i],
               "moe/token_entropy_norm": 0.9, "moe/load_entropy_norm": 0.95, "moe/dropped_frac": 0.0,
               "moe/dead_experts": 0, "moe/train_eval_overlap": 1.0, **(extra_log or {})}
        if step % 20 == 0:
            rec["val/loss"] = val_losses[step // 20]
            rec["moe/routing_stability"] = 0.5 + step / 100
        recs.append(rec)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "multirun"
    job = 0
    for router, finals in [("topk", (4.0, 4.2)), ("aux_free", (3.9, 3.95))]:
        for seed, final in enumerate(finals):
            make_run(root / str(job), router, seed, [6.0, 5.0, final], [3.0, 2.0, 1.6, 1.2], tok_s=1000 * (job + 1))
            job += 1
    (root / "multirun.yaml").write_text("hydra: {}\n")
    (root / "10" / ".hydra").mkdir(parents=True)  # a folder without run files is ignored
    return root


def test_run_summary_and_grouping(sweep):
    dirs = find_run_dirs(sweep)
    assert [d.name for d in dirs] == ["0", "1", "2", "3"]
    run = load_run(dirs[0])
    s = summarize_run(run, tail=0.5)
    assert s["final_val_loss"] == 4.0 and s["final_step"] == 40
    assert s["load_imbalance"] == pytest.approx((1.6 + 1.2) / 2)  # last half of the log steps
    assert s["tokens_per_s"] == pytest.approx(1001.5) and s["routing_stability"] == pytest.approx(0.9)
    groups = group_runs([load_run(d) for d in dirs])
    assert list(groups) == ["topk", "aux_free"] and [len(v) for v in groups.values()] == [2, 2]


def test_job_numbers_sort_as_numbers_beside_other_folder_names(tmp_path):
    for name in ("10", "2", "b/1", "2s", "a"):
        make_run(tmp_path / name, "topk", 0, [6, 5, 4], [2, 2])
    assert [str(d.relative_to(tmp_path)) for d in find_run_dirs(tmp_path)] == ["2", "10", "2s", "a", "b/1"]


def test_other_varying_keys_are_not_averaged_as_seeds(tmp_path):
    make_run(tmp_path / "0", "topk", 0, [6, 5, 4], [2, 2], top_k=1)
    make_run(tmp_path / "1", "topk", 0, [6, 5, 4], [2, 2], top_k=2)
    make_run(tmp_path / "2", "switch", 0, [6, 5, 4], [2, 2], top_k=1)  # its own default: not a label
    groups = group_runs([load_run(d) for d in find_run_dirs(tmp_path)])
    assert list(groups) == ["topk (router.top_k=1)", "topk (router.top_k=2)", "switch"]


def test_report_table_and_png(sweep, tmp_path):
    out = tmp_path / "docs"
    md, png, table = write_report(sweep, out, command="python train.py -m router=topk,aux_free seed=0,1")
    rows = table.splitlines()
    assert rows[0].startswith("| variant | runs | final val loss | tokens/s | load imbalance")
    topk = next(r for r in rows if r.startswith("| `topk`"))
    aux = next(r for r in rows if r.startswith("| `aux_free`"))
    # mean ± sample std over the two seeds; the best variant in bold
    assert f"4.1000 ± {math.sqrt(0.02):.4f}" in topk and "**3.9250 ± 0.0354**" in aux
    assert "| 2 |" in topk
    text = md.read_text()
    assert table in text and "python train.py -m router=topk,aux_free" in text and "sweep_curves.png" in text
    assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
    data = json.loads((out / "sweep_report.json").read_text())  # the numbers behind the table, per run and variant
    assert data["command"] == "python train.py -m router=topk,aux_free seed=0,1" and data["tail"] == 0.25
    assert [(r["run"], r["variant"], r["seed"], r["final_val_loss"]) for r in data["runs"]] == [
        ("0", "topk", 0, 4.0), ("1", "topk", 1, 4.2), ("2", "aux_free", 0, 3.9), ("3", "aux_free", 1, 3.95)]
    topk_json = data["variants"]["topk"]
    assert topk_json["runs"] == 2 and topk_json["seeds"] == [0, 1]
    assert topk_json["final_val_loss"] == {"mean": pytest.approx(4.1), "std": pytest.approx(math.sqrt(0.02)), "n": 2}
    assert topk_json["load_imbalance"]["mean"] == pytest.approx(1.2)  # last 25% of 4 log steps: the last one
    assert data["variants"]["aux_free"]["tokens_per_s"]["mean"] == pytest.approx((3001.5 + 4001.5) / 2)  # medians of 3000..3003 and 4000..4003


def test_report_json_has_null_for_a_metric_no_run_logged(tmp_path):
    make_run(tmp_path / "runs" / "0", "topk", 0, [6, 5, 4], [2, 2])
    lines = (tmp_path / "runs" / "0" / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "runs" / "0" / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in json.loads(x).items() if k != "moe/train_eval_overlap"}) + "\n" for x in lines))
    write_report(tmp_path / "runs", tmp_path / "out")
    data = json.loads((tmp_path / "out" / "sweep_report.json").read_text())  # strict JSON: no NaN
    assert data["runs"][0]["train_eval_overlap"] is None and data["runs"][0]["final_val_loss"] == 5  # step 20
    assert data["variants"]["topk"]["final_val_loss"] == {"mean": 5, "std": None, "n": 1}  # one seed: no std


def test_cli(sweep, tmp_path, capsys):
    assert main([str(sweep), "--out", str(tmp_path / "o")]) == 0
    assert "| `aux_free` | 2 |" in capsys.readouterr().out
    assert main([str(tmp_path / "empty_does_not_exist"), "--out", str(tmp_path / "o2")]) == 2
    p = subprocess.run([sys.executable, "-m", "benchmarks.sweep_report", str(sweep), "--out", str(tmp_path / "o3")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o3" / "sweep_report.md").is_file()


def test_cli_writes_into_the_sweep_by_default(sweep, capsys):
    """Without --out the report goes to <sweep>/report, never over the repository's docs/results/sweep/."""
    committed = (REPO / "docs" / "results" / "sweep" / "sweep_report.md").read_bytes()
    assert main([str(sweep)]) == 0
    assert (sweep / "report" / "sweep_report.md").is_file() and (sweep / "report" / "sweep_curves.png").is_file()
    assert f"wrote {sweep / 'report' / 'sweep_report.md'}" in capsys.readouterr().out
    assert (REPO / "docs" / "results" / "sweep" / "sweep_report.md").read_bytes() == committed
    # the report folder holds no run files, so a second report of the same sweep sees the same runs
    assert [d.name for d in find_run_dirs(sweep)] == ["0", "1", "2", "3"]


def test_an_existing_report_is_refused_unless_overwrite_which_moves_it_aside(sweep, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "sweep_report.md").write_text("an older report")
    assert main([str(sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out / "sweep_report.md") in err and "--overwrite" in err
    assert (out / "sweep_report.md").read_text() == "an older report" and not (out / "sweep_curves.png").exists()
    assert main([str(sweep), "--out", str(out), "--overwrite"]) == 0
    (old,) = out.glob("sweep_report.md.old-*")
    assert old.read_text() == "an older report" and "| `aux_free` | 2 |" in (out / "sweep_report.md").read_text()
