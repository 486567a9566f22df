"""benchmarks/finetune_runs.py and finetune_step_worker.py on synthetic run directories: what
they read from the runs, how they summarise them, and what they refuse (no training here)."""

import json
import sys
from types import SimpleNamespace

import pytest
import torch

from benchmarks import finetune_runs as fr
from benchmarks.finetune_step_worker import optimizer_state_bytes, proc_status_mb


def make_run(d, val, batch=4, seq=8, tokenizer=b"{}"):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"train": {"batch_size": batch, "seq_len": seq}}))
    recs = [{"step": s, "val/loss": v} for s, v in val] + [{"step": 3, "train/loss": 1.0}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sorted(recs, key=lambda r: r["step"])))
    (d / "tokenizer").mkdir()
    (d / "tokenizer" / "tokenizer.json").write_bytes(tokenizer)
    return d


def test_val_curve_reads_only_validation_records_in_tokens(tmp_path):
    d = make_run(tmp_path / "r", [(0, 8.0), (5, 6.5), (10, 6.0)], batch=4, seq=8)
    assert fr.val_curve(d) == [{"step": 0, "tokens": 0, "val_loss": 8.0}, {"step": 5, "tokens": 160, "val_loss": 6.5},
                               {"step": 10, "tokens": 320, "val_loss": 6.0}]


def test_same_tokenizer(tmp_path):
    a, b = make_run(tmp_path / "a", [(0, 1.0)]), make_run(tmp_path / "b", [(0, 1.0)])
    c = make_run(tmp_path / "c", [(0, 1.0)], tokenizer=b'{"other": 1}')
    assert fr.same_tokenizer([a, b]) is True
    assert fr.same_tokenizer([a, b, c]) is False


def answers(*turn_texts):
    return [{"question_id": i, "choices": [{"index": 0, "turns": list(t)}]} for i, t in enumerate(turn_texts)]


def test_answer_stats_counts_stops_code_and_empty_answers():
    per_turn = [{"finish_reason": f} for f in ("stop", "length", "stop", "stop")]
    results = {"generation": {"per_turn": per_turn, "mean_output_tokens": 12.5, "max_new_tokens": 64,
                              "truncated_prompts": 1, "finish_reasons": {"stop": 3, "length": 1}}}
    rows = answers(["def f(x):\n    return x", "16 plus 2 is 18."], ["", "import os"])
    s = fr.answer_stats(results, rows)
    assert s["answers"] == 4 and s["stopped_at_end_of_turn"] == 3 and s["stop_fraction"] == 0.75
    assert s["answers_with_code_markers"] == 2  # "def "/"return " and "import ", not the sentence or ""
    assert s["empty_answers"] == 1
    assert (s["mean_output_tokens"], s["truncated_prompts"]) == (12.5, 1)


def router_rec(wall, cpu, peak=900.0, first=850.0, opt=100, val=5.0):
    return {"step_wall_median_s": wall, "step_cpu_median_s": cpu, "peak_rss_mb": peak, "rss_at_first_step_mb": first,
            "optimizer_state_bytes": opt, "trainable_params": opt // 8, "params": 1000, "final_val_loss": val,
            "initial_val_loss": 5.1}


def test_router_summary_medians_and_per_repeat_ratios():
    runs = {"full_aux_free": [router_rec(1.0, 0.5), router_rec(2.0, 0.4), router_rec(1.5, 0.6)],
            "router_only_aux_free": [router_rec(0.5, 0.25, peak=870.0, opt=8), router_rec(0.5, 0.3, opt=8),
                                     router_rec(3.0, 0.3, opt=8)]}
    s = fr.router_summary(runs)
    full, ro = s["full_aux_free"], s["router_only_aux_free"]
    assert full["step_wall_s"] == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 3}
    assert full["step_cpu_median_s_ratio_to_full"]["median"] == 1.0
    # ratios are taken within a repeat (interleaved runs), then the median: 0.5/1, 0.5/2, 3/1.5
    assert ro["step_wall_median_s_ratio_to_full"] == {"median": 0.5, "min": 0.25, "max": 2.0, "n": 3}
    assert ro["step_cpu_median_s_ratio_to_full"]["median"] == pytest.approx(0.5)
    assert ro["rss_growth_in_training_mb"]["median"] == 50.0 and ro["peak_rss_mb"]["min"] == 870.0
    assert (ro["optimizer_state_bytes"], full["optimizer_state_bytes"]) == (8, 100)


def test_optimizer_state_bytes_counts_every_state_tensor():
    # AdamW's state as torch keeps it, set by hand: building a torch optimizer imports torch._dynamo (~10 s
    # on the loaded test machine), and the function reads only `.state`
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(5, 2)
    b.requires_grad_(False)
    opt = SimpleNamespace(state={})
    assert optimizer_state_bytes(opt) == 0  # AdamW makes its state at the first step
    for p in a.parameters():
        opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p),
                        "note": 3}  # a plain number holds no tensor memory
    n = 4 * 3 + 3  # a's weight and bias; b is frozen and has no state
    assert optimizer_state_bytes(opt) == 2 * n * 4 + 2 * 4  # two fp32 moments, two fp32 step counters
    opt.state[a.weight]["exp_avg"] = torch.zeros(4, 3, dtype=torch.bfloat16)
    assert optimizer_state_bytes(opt) == 2 * n * 4 + 2 * 4 - 12 * 2


def test_proc_status_reads_memory():
    rss, hwm = proc_status_mb("VmRSS"), proc_status_mb("VmHWM")
    assert 0 < rss <= hwm
    with pytest.raises(RuntimeError, match="NoSuchField"):
        proc_status_mb("NoSuchField")


def test_run_child_costs_and_failure(tmp_path):
    ok = fr.run_child([sys.executable, "-c", "x = bytearray(64 << 20); print('hi')"], tmp_path / "ok.log")
    assert (tmp_path / "ok.log").read_text() == "hi\n"
    assert ok["max_rss_mb"] >= 64 and ok["cpu_s"] > 0 and ok["wall_s"] >= ok["cpu_s"] * 0.1
    with pytest.raises(fr.RunFailed, match=r"exited with 3; its output is in .*bad\.log"):
        fr.run_child([sys.executable, "-c", "import sys; print('why'); sys.exit(3)"], tmp_path / "bad.log")
    assert "why" in (tmp_path / "bad.log").read_text()


@pytest.fixture
def source(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    (d / "summary.json").write_text("{}")
    return d


@pytest.mark.parametrize("args, message", [
    (["--parts", "sft,eval"], "--parts='sft,eval': each must be one of sft, upcycle, router"),
    (["--parts", ","], "--parts=',': each must be one of"),
    (["--seeds", "0,x"], "--seeds='0,x' must be integers"),
    (["--seeds", ","], "--seeds=',' names no seed"),
    (["--steps", "0"], "--steps=0 must be >= 1"),
    (["--router-steps", "5"], "--router-steps=5 must be > 5"),
])
def test_bad_options_are_one_line_exit_2_and_write_nothing(tmp_path, source, capsys, args, message):
    out, work = tmp_path / "out", tmp_path / "work"
    rc = fr.main(["--out", str(out), "--work", str(work), "--source", str(source), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists() and not work.exists()


def test_refuses_a_source_that_is_no_run(tmp_path, capsys):
    rc = fr.main(["--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"), "--parts", "router",
                  "--source", str(tmp_path)])
    assert rc == 2 and "is not a finished run directory" in capsys.readouterr().err
    # the upcycle part needs no source
    a = fr.parse_args(["--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"), "--parts", "upcycle",
                       "--source", str(tmp_path)])
    assert fr.check_args(a) == (["upcycle"], [0, 1])


def test_never_overwrites_what_it_did_not_create(tmp_path, source, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    (out / "answers").mkdir(parents=True)
    (out / "answers" / "mt_bench_after.jsonl").write_text("mine\n")
    rc = fr.main(["--out", str(out), "--work", str(work), "--source", str(source), "--parts", "sft"])
    assert rc == 2 and "already has answers/mt_bench_after.jsonl; add --overwrite" in capsys.readouterr().err
    assert (out / "answers" / "mt_bench_after.jsonl").read_text() == "mine\n" and not work.exists()
    # files of another part are not in the way; a non-empty --work is
    a = fr.parse_args(["--out", str(out), "--work", str(work), "--source", str(source), "--parts", "router"])
    assert fr.check_args(a)[0] == ["router"]
    work.mkdir()
    (work / "x").write_text("")
    with pytest.raises(ValueError, match="--work=.* is not empty"):
        fr.check_args(a)
    a.overwrite = True
    a.work = tmp_path / "work2"
    a.parts = "sft"
    assert fr.check_args(a)[0] == ["sft"]


def upcycle_record(path, seeds, steps=4, final=5.0):
    def curve(v0, v1, span):
        return [{"step": 0, "tokens": 0, "val_loss": v0}, {"step": span, "tokens": span * 10, "val_loss": v1}]
    per_seed = [{"seed": s, "curves": {"dense": curve(8, 6, steps), "upcycled": curve(6, final + s, steps),
                                       "scratch": curve(8, 6.5, steps), "scratch_total": curve(8, 5.5, 2 * steps),
                                       "dense_continued": curve(6, 5.6, steps)}} for s in seeds]
    rec = {"model": "tiny", "dense_steps": steps, "steps": steps, "seeds": list(seeds), "per_seed": per_seed,
           "commit": "abc", "command": "x", "machine": {"load": []}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


def test_merge_upcycle_joins_seeds_and_redoes_the_summary(tmp_path, capsys):
    a = upcycle_record(tmp_path / "a" / "upcycle.json", [0], final=5.0)
    b = upcycle_record(tmp_path / "b" / "upcycle.json", [1], final=5.0)  # seed 1's final: 6.0
    out = tmp_path / "out"
    assert fr.main(["merge-upcycle", "--out", str(out), str(a), str(b)]) == 0
    m = json.loads((out / "upcycle.json").read_text())
    assert m["seeds"] == [0, 1] and [s["seed"] for s in m["per_seed"]] == [0, 1]
    assert m["final_val_loss"]["upcycled"] == {"median": 5.5, "min": 5.0, "max": 6.0, "n": 2}
    assert m["final_val_loss"]["scratch_total"]["median"] == 5.5
    assert [x["file"] for x in m["merged_from"]] == [str(a), str(b)]
    assert (out / "upcycle_val_loss.png").read_bytes()[:4] == b"\x89PNG"
    # a second merge into the same folder would replace the plot: refused without --overwrite
    assert fr.main(["merge-upcycle", "--out", str(out), str(a), str(b)]) == 2
    assert "already has upcycle.json, upcycle_val_loss.png; add --overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("second, message", [
    (dict(seeds=[0]), "a seed is in more than one file: [0, 0]"),
    (dict(seeds=[1], steps=8), "the files differ in (model, dense_steps, steps)"),
])
def test_merge_upcycle_refuses_records_that_do_not_fit(tmp_path, capsys, second, message):
    a = upcycle_record(tmp_path / "a.json", [0])
    b = upcycle_record(tmp_path / "b.json", **second)
    out = tmp_path / "out"
    assert fr.main(["merge-upcycle", "--out", str(out), str(a), str(b)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert fr.main(["merge-upcycle", "--out", str(out), str(a), str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
