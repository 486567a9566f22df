"""benchmarks/decode_floor.py: the step's GEMMs are every 2-D weight of the step once (the routed experts
each once, on the rows routed to them), a run times every arm every round and writes its record, a compiled
output that differs from the eager engine's fails the run, and bad input exits 2 naming the field."""

import json
import time
import types

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


def micro_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=64, max_seq_len=64, router=router_config(top_k=2), **MICRO)).eval()


def test_the_step_matmuls_feed_every_dense_weight_and_the_head_the_whole_batch():
    # the dense GEMMs (projections, routers, LM head) each see all B rows; only an expert sees fewer (its routed rows)
    model = micro_model()
    routes = [torch.tensor([[0, 2], [2, 3], [0, 2]]), torch.tensor([[1, 3], [3, 1], [1, 3]])]
    pairs = df.step_matmuls(model, routes, 3)
    dense = {p.data_ptr() for n, p in model.named_parameters() if p.dim() == 2 and "experts" not in n}
    rows = [x.shape for x, w in pairs if w.data_ptr() in dense]
    assert len(rows) == len(dense) - 1  # every one but the embedding
    assert all(x.shape == (3, w.shape[1]) for x, w in pairs if w.data_ptr() in dense), rows


def test_routed_experts_are_one_decode_steps_choices_and_leave_no_hooks():
    # one tensor per MoE layer, of the decode step's B tokens (not the prefill's B x prompt tokens), and the
    # routers' hooks removed (left on, every later eager step would clone its routing: the eager arm's timings)
    from moe.engine import LLM
    model = micro_model()
    llm = LLM.from_model(model, None, max_num_seqs=3, max_num_batched_tokens=8192, collect_routing_stats=False)
    prompts = torch.randint(3, 64, (3, 5), generator=torch.Generator().manual_seed(1)).tolist()
    routes = df.routed_experts(llm, prompts)
    assert [r.shape for r in routes] == [(3, 2)] * 2
    assert all((r >= 0).all() and (r < 4).all() for r in routes)
    assert all(not b.ffn.router._forward_hooks for b in model.layers)
    assert not llm.has_unfinished_requests()


def test_decode_step_times_are_the_wall_and_cpu_of_the_steps_after_prefill_and_warmup():
    # the first timed step is the (1 + warmup + 1)-th call of `step` (after the prefill and the warm-up): it sleeps
    # 0.2 s (wall clock, no CPU), so with one timed step the wall median is >= 0.2 s and the CPU one well under
    from moe.engine import LLM, SamplingParams
    model = micro_model()
    llm = LLM.from_model(model, None, max_num_seqs=2, max_num_batched_tokens=8192, collect_routing_stats=False)
    prompts = torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(2)).tolist()
    want = [o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))]
    real, calls = llm.step, []

    def step():
        calls.append(len(calls))
        if len(calls) == 1 + 2 + 1:
            time.sleep(0.2)
        return real()
    llm.step = step
    wall, cpu, toks = df.decode_step_times(llm, prompts, steps=1, warmup=2)
    assert wall >= 0.2 and cpu < 0.15, (wall, cpu)
    assert len(calls) == 1 + 2 + 1 and toks == want  # prefill, warm-up, timed: 4 tokens each, in prompt order


def test_floors_are_the_gemms_then_the_reads_after_one_untimed_pass(monkeypatch):
    # a GEMM that sleeps 10 ms: the matmul floor (first) is >= three of them, the stream floor (second) is not
    calls = []

    def slow_linear(x, w):
        calls.append(w.shape)
        time.sleep(0.01)
        return x @ w.T
    monkeypatch.setattr(df, "F", types.SimpleNamespace(linear=slow_linear))
    pairs = [(torch.randn(2, 8), torch.randn(4, 8)) for _ in range(3)]
    mm, stream = df.floors(pairs, 3)
    assert mm >= 0.03 and stream < 0.01, (mm, stream)
    assert len(calls) == 3 * (1 + 3)


def test_each_ratio_and_bandwidth_is_of_its_own_arms(micro, monkeypatch, tmp_path):
    # decode steps and floors of fixed times (eager 4 ms wall / 3 ms CPU, compiled 2 / 1.5, floors 0.02 / 0.01 ms):
    # every arm, ratio and bandwidth in the record is the one its name says; the floors take `--steps` passes
    passes, got = [], {}
    real_matmuls = df.step_matmuls

    def fake_times(llm, prompts, steps, warmup):
        comp = llm.runner.__class__.__name__ == "CompiledModelRunner"
        return (0.002, 0.0015, [[1]] * len(prompts)) if comp else (0.004, 0.003, [[1]] * len(prompts))

    def fake_floors(pairs, n):
        passes.append(n)
        return 2e-5, 1e-5

    def matmuls(*a):
        got["pairs"] = real_matmuls(*a)
        return got["pairs"]
    monkeypatch.setattr(df, "decode_step_times", fake_times)
    monkeypatch.setattr(df, "floors", fake_floors)
    monkeypatch.setattr(df, "step_matmuls", matmuls)
    out = tmp_path / "floor.json"
    assert df.main(micro + ["--batches", "1", "--steps", "3", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert passes == [3, 3]
    for arm, ms in (("eager_ms", 4), ("eager_cpu_ms", 3), ("compiled_ms", 2), ("compiled_cpu_ms", 1.5),
                    ("matmul_floor_ms", 0.02), ("stream_floor_ms", 0.01)):
        assert row[arm]["all"] == pytest.approx([ms] * 2, rel=1e-3), arm
    for ratio, want in (("compiled_over_eager", 2), ("compiled_over_eager_cpu", 2), ("eager_over_matmul_floor", 200),
                        ("compiled_over_matmul_floor", 100)):
        assert row[ratio]["all"] == pytest.approx([want] * 2, rel=1e-3), ratio
    mb = sum(w.numel() * w.element_size() for _, w in got["pairs"]) / 1e6
    assert row["weight_mb_per_step"] == round(mb, 1)
    assert row["matmul_floor_gb_s"] == round(mb / 1e3 / 2e-5, 2)
    assert row["stream_floor_gb_s"] == round(mb / 1e3 / 1e-5, 2)


@pytest.mark.parametrize("argv,field,value", [(["--batches", "2", "0"], "--batches", 0),
                                              (["--prompt-len", "0"], "--prompt-len", 0)])
def test_bad_input_in_any_batch_or_the_prompt_length_exits_2(argv, field, value, capsys):
    assert df.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"error: {field} must be >= 1 (got {value})"


def test_the_threads_are_set_before_any_measurement(monkeypatch, tmp_path):
    # `--threads n`: torch's intra-op threads are n while each row is measured, and the record says n
    before, seen = torch.get_num_threads(), []
    n = 2 if before != 2 else 1
    stat = {"median": 1.0, "min": 1.0, "max": 1.0, "all": [1.0]}

    def fake_measure(name, B, args):
        seen.append(torch.get_num_threads())
        return {"weight_mb_per_step": 1.0, **{k: stat for k in ("eager_ms", "compiled_ms", "matmul_floor_ms",
                "stream_floor_ms", "compiled_over_eager", "eager_over_matmul_floor", "compiled_over_matmul_floor")}}, 0
    monkeypatch.setattr(df, "measure", fake_measure)
    out = tmp_path / "floor.json"
    try:
        assert df.main(["--models", "tiny", "--batches", "1", "--threads", str(n), "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [n] and json.loads(out.read_text())["threads"] == n
