"""benchmarks/routing_records.py on synthetic run folders (and one real checkpoint's bias buffer)."""

import json

import pytest
import torch

from benchmarks.routing_records import aux_free_row, collect, load, main, monitor_row


def make_run(d, *, rate=0.01, router="aux_free", final=4.0, imbalance=(3.0, 2.0), token=(0.99, 0.97),
             dead=(0, 1), alerts=(), steps=(40, 50, 60, 100, 150), bias=None):
    """Two layers; layer 1 carries the worst values (imbalance, dead, lowest load entropy) at every step."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"seed": 0, "model": {"router": {"name": router, "bias_update_rate": rate}}}))
    recs = [{"step": 0, "val/loss": 9.0}]
    for i, step in enumerate(steps):
        hi = imbalance[min(i, len(imbalance) - 1)] + step / 1000
        recs.append({"step": step, "moe/load_imbalance": hi - 0.5, "moe/layer0/load_imbalance": 1.1,
                     "moe/layer1/load_imbalance": hi, "moe/layer0/dead_experts": 0,
                     "moe/layer1/dead_experts": dead[min(i, len(dead) - 1)],
                     "moe/layer0/load_entropy_norm": 0.99, "moe/layer1/load_entropy_norm": 0.9 - step / 10000,
                     "moe/layer0/token_entropy_norm": token[min(i, len(token) - 1)],
                     "moe/layer1/token_entropy_norm": 0.5})
    recs.append({"step": steps[-1], "val/loss": final})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.json").write_text(json.dumps({"routing_alerts": list(alerts)}))
    if bias is not None:
        (d / "checkpoints").mkdir()
        model = {f"layers.{i}.moe.router.e_score_correction_bias": torch.tensor(b) for i, b in enumerate(bias)}
        model["layers.0.attn.wq.weight"] = torch.zeros(2, 2)
        torch.save({"model": model, "step": steps[-1]}, d / "checkpoints" / "step_0000150.pt")
        torch.save({"model": {}, "step": 100}, d / "checkpoints" / "step_0000100.pt")  # not the last one
    return d


def test_monitor_row_takes_the_worst_layer_from_the_start_step(tmp_path):
    run = load(make_run(tmp_path / "r", imbalance=(9.0, 2.0, 1.5), token=(0.999, 0.98, 0.97, 0.96, 0.95), dead=(5, 1, 0),
                        alerts=("step 70: load_imbalance (layer 1)", "step 80: dead_experts (layer 1)",
                                "step 90: load_imbalance (layer 0)")))
    row = monitor_row(run)
    # step 40 (imbalance 9.04, 5 dead, token 0.999) is before the monitor's start step 50
    assert row["imbalance"] == pytest.approx(2.05) and row["dead"] == 1
    assert row["load_entropy"] == pytest.approx(0.9 - 0.015) and row["token_entropy"] == [0.95, 0.98]
    assert row["alerts"] == "dead_experts, load_imbalance (3)" and row["steps"] == 150 and row["final_val_loss"] == 4.0
    assert monitor_row(run, start_step=0)["dead"] == 5
    assert monitor_row(load(make_run(tmp_path / "h")))["alerts"] == "none"


def test_aux_free_row_over_seeds_and_bias_spread(tmp_path):
    a = make_run(tmp_path / "a", final=3.8, imbalance=(3.0, 2.0), bias=[[0.1, -0.1, 0.0], [0.3, -0.2, 0.0]])
    b = make_run(tmp_path / "b", final=4.0, imbalance=(1.0,))
    for run in (a, b):
        collect(run, tmp_path / "rec" / run.name)
    assert not (tmp_path / "rec" / "b" / "router_bias.json").exists()  # no checkpoint: no bias file
    assert json.loads((tmp_path / "rec" / "a" / "router_bias.json").read_text())["step"] == 150
    row = aux_free_row([load(tmp_path / "rec" / "a"), load(tmp_path / "rec" / "b")])
    assert row["val_loss_mean"] == pytest.approx(3.9) and row["val_loss_std"] == pytest.approx(0.1414, abs=1e-4)
    # the layer-average imbalance (moe/load_imbalance = worst layer - 0.5 here), averaged over the two runs
    assert row["imbalance_at_60"] == pytest.approx(((2.06 - 0.5) + (1.06 - 0.5)) / 2)
    assert row["imbalance_at_150"] == pytest.approx(((2.15 - 0.5) + (1.15 - 0.5)) / 2)
    assert row["imbalance_tail"] == pytest.approx((row["imbalance_at_100"] + row["imbalance_at_150"]) / 2)  # ceil(5 / 4) = 2
    assert row["bias_spread"] == pytest.approx(0.5)  # layer 1 of run a: 0.3 - (-0.2)


def test_tail_averages_the_last_quarter_of_log_steps(tmp_path):
    run = load(make_run(tmp_path / "r", steps=tuple(range(10, 160, 10)), imbalance=(2.0,)))
    values = [2.0 + s / 1000 - 0.5 for s in range(10, 160, 10)]
    assert aux_free_row([run])["imbalance_tail"] == pytest.approx(sum(values[-4:]) / 4)  # ceil(15 / 4) = 4


def test_cli(tmp_path, capsys):
    runs = [make_run(tmp_path / f"r{i}", rate=rate, final=3.9 + i / 10) for i, rate in enumerate((0.01, 0.01, 0.1))]
    runs.append(make_run(tmp_path / "t", router="topk", final=3.85))
    assert main(["aux-free", *map(str, runs), "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("| 0.01 | 2 | 3.9500 ± 0.0707 |") and out[3].startswith("| 0.1 | 1 |")
    assert out[4].startswith("| topk | 1 | 3.8500") and out[4].endswith("| - |")
    assert set(json.loads((tmp_path / "t.json").read_text())["rows"]) == {"0.01", "0.1", "topk"}
    assert main(["monitor", str(runs[0])]) == 0
    assert capsys.readouterr().out.splitlines()[2].startswith("| r0 | 150 | 3.900 | 2.15 | 1 | 0.885 | 0.970-0.970 | none |")
    # bad input: one line naming the field, nothing written
    assert main(["monitor", str(tmp_path / "nope")]) == 2
    assert "paths: no metrics.jsonl in" in capsys.readouterr().err
    assert main(["monitor", str(runs[0]), "--json", str(tmp_path / "t.json")]) == 2
    assert "--json:" in capsys.readouterr().err
    assert main(["collect", str(runs[0])]) == 2
    collect(runs[0], tmp_path / "c")
    with pytest.raises(FileExistsError):
        collect(runs[0], tmp_path / "c")
