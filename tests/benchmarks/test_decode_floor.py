"""benchmarks/decode_floor.py: the step's GEMMs are every 2-D weight of the step once (the routed experts
each once, on the rows routed to them), a run times every arm every round and writes its record, a compiled
output that differs from the eager engine's fails the run, and bad input exits 2 naming the field."""

import json

import pytest
import torch

from benchmarks import decode_floor as df
from moe.config import ModelConfig
from moe.model import Transformer
from moe.routing.routers import router_config

MICRO = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=48)


@pytest.fixture
def micro(monkeypatch):
    monkeypatch.setitem(df.MODELS, "micro", MICRO)
    return ["--models", "micro", "--vocab", "64", "--prompt-len", "5", "--steps", "2", "--warmup", "1",
            "--repeats", "2", "--threads", "1"]


def test_the_step_matmuls_read_each_weight_once():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, max_seq_len=64, router=router_config(top_k=2), **MICRO)).eval()
    routes = [torch.tensor([[0, 2], [2, 3], [0, 2]]), torch.tensor([[1, 3], [3, 1], [1, 3]])]
    pairs = df.step_matmuls(model, routes, 3)
    experts = [b.ffn.experts for b in model.layers]
    for layer, (ex, chosen) in enumerate(zip(experts, ({0: 2, 2: 3, 3: 1}, {1: 3, 3: 3}))):
        for e, rows in chosen.items():  # each chosen expert's two weights once, on its routed rows
            got = [x.shape[0] for x, w in pairs if w.data_ptr() in (ex.gate_up_proj[e].data_ptr(),
                                                                     ex.down_proj[e].data_ptr())]
            assert got == [rows, rows], (layer, e, got)
        assert not any(w.data_ptr() == ex.gate_up_proj[e].data_ptr() for e in set(range(4)) - set(chosen)
                       for _, w in pairs)
    dense = [p for n, p in model.named_parameters() if p.dim() == 2 and "experts" not in n and "embed" not in n]
    assert {w.data_ptr() for _, w in pairs} >= {p.data_ptr() for p in dense}  # projections, routers, head
    assert pairs[-1][1].data_ptr() == model.lm_head.weight.data_ptr() and pairs[-1][0].shape == (3, 32)
    per_expert = (experts[0].gate_up_proj[0].numel() + experts[0].down_proj[0].numel()) * 4
    assert sum(w.numel() * 4 for _, w in pairs) == sum(p.numel() * 4 for p in dense) + per_expert * (3 + 2)


def test_a_run_times_every_arm_every_round_and_writes_its_record(micro, tmp_path):
    out = tmp_path / "floor.json"
    assert df.main(micro + ["--batches", "2", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    (row,) = rec["rows"]
    assert row["model"] == "micro" and row["batch"] == 2 and row["wrong_outputs"] == 0 and rec["threads"] == 1
    for arm in ("eager_ms", "compiled_ms", "matmul_floor_ms", "stream_floor_ms", "compiled_over_eager"):
        assert len(row[arm]["all"]) == 2 and all(v > 0 for v in row[arm]["all"]), arm
    ratios = [e / c for e, c in zip(row["eager_ms"]["all"], row["compiled_ms"]["all"])]  # per round, then the median
    assert row["compiled_over_eager"]["all"] == pytest.approx(ratios, rel=2e-3)
    assert row["compiled_over_eager"]["median"] == pytest.approx(sorted(ratios)[1] if len(ratios) == 3 else
                                                                 sum(ratios) / 2, rel=2e-3)
    assert row["weight_mb_per_step"] > 0 and "decode_floor" in rec["command"] and rec["load_after"]


def test_a_compiled_output_that_differs_fails_the_run(micro, monkeypatch, capsys):
    real = df.decode_step_times

    def off_by_one(llm, *a):
        wall, cpu, toks = real(llm, *a)
        return wall, cpu, ([t[:-1] + [t[-1] + 1] for t in toks] if llm.runner.__class__.__name__ ==
                           "CompiledModelRunner" else toks)
    monkeypatch.setattr(df, "decode_step_times", off_by_one)
    assert df.main(micro + ["--batches", "1", "--repeats", "1"]) == 1
    assert "micro batch 1: 1 compiled output(s) differ" in capsys.readouterr().err


@pytest.mark.parametrize("field,value", [("--batches", "0"), ("--steps", "0"), ("--repeats", "0")])
def test_bad_input_exits_2_naming_the_field(field, value, capsys):
    assert df.main([field, value]) == 2
    assert capsys.readouterr().err.strip() == f"error: {field} must be >= 1 (got {value})"
