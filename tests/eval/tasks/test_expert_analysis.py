"""The expert_analysis task end to end on the tiny checkpoint: every section against a direct
computation or a known answer (a checkpoint against itself: overlap 1.0; a router with negated
weights: top-2 of 4 becomes the complement, overlap 0.0; the top-1 self inside the top-2 set:
overlap 1.0 at the first MoE layer; the engine routes the tokens it runs as the forward does),
the figures are real PNGs, the cost is bounded, and bad options are clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from PIL import Image

from eval.analysis.collect import domain_tokens, windows_of
from eval.tasks.expert_analysis import ExpertAnalysis
from moe.checkpoint import read_checkpoint, save_checkpoint
from moe.errors import ConfigError
from tests.eval.conftest import SHARED_DATA, compose

STORIES = SHARED_DATA / "corpus" / "tinystories_valid_head.txt"
PLAYS = SHARED_DATA / "corpus" / "tinyshakespeare.txt"
MAX_TOKENS, SEQ_LEN = 256, 64


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory, tiny_run):
    """A run directory keeping steps 2, 4, 8: step 8 is the tiny checkpoint, step 4 a copy of it,
    step 2 the same with the first MoE layer's router weights negated."""
    run = tmp_path_factory.mktemp("saturation") / "run"
    (run / "checkpoints").mkdir(parents=True)
    final = tiny_run / "checkpoints" / "step_0000008.pt"
    shutil.copy(final, run / "checkpoints" / "step_0000008.pt")
    shutil.copy(final, run / "checkpoints" / "step_0000004.pt")
    state = read_checkpoint(final)
    state["model"]["layers.0.ffn.router.weight"] = -state["model"]["layers.0.ffn.router.weight"]
    save_checkpoint(run / "checkpoints" / "step_0000002.pt", {k: v for k, v in state.items() if k != "format_version"})
    return run


@pytest.fixture(scope="module")
def analysis(tmp_path_factory, three_checkpoints):
    from eval.__main__ import run_eval

    out = tmp_path_factory.mktemp("analysis") / "out"
    res = run_eval(compose("expert_analysis", f"ckpt={three_checkpoints}", "logger=none",
                           f"eval.domains={{code:pystdlib,stories:'{STORIES}',plays:'{PLAYS}'}}",
                           f"eval.max_tokens={MAX_TOKENS}", f"eval.seq_len={SEQ_LEN}", "eval.probe_tokens=128",
                           "eval.compare_top_k=1", "eval.gen_prompts=2", "eval.gen_prompt_tokens=8",
                           "eval.gen_new_tokens=4"), out)
    return res, out


def test_domain_fractions_equal_the_models_own_expert_counts(analysis, tiny):
    res, _ = analysis
    model, tok, _ = tiny
    dom = res["domain_specialization"]
    assert dom["domains"] == ["code", "stories", "plays"] and dom["uniform"] == 0.5
    assert dom["tokens"] == {"code": MAX_TOKENS, "stories": MAX_TOKENS, "plays": MAX_TOKENS}  # the budget holds
    assert res["tokens_analysed"] == 3 * MAX_TOKENS and res["model"]["moe_layers"] == [0, 1]
    for d, source in enumerate(["pystdlib", str(STORIES), str(PLAYS)]):
        counts = torch.zeros(2, 4)
        for w in windows_of(domain_tokens(source, tok, MAX_TOKENS), SEQ_LEN):
            with torch.no_grad():
                records = model(torch.tensor([w])).moe_records
            counts += torch.stack([r.counts_E.float() for r in records])
        for li in range(2):
            assert dom["layers"][li]["fractions"][d] == pytest.approx((counts[li] / MAX_TOKENS).tolist())
    for L in dom["layers"]:
        scores = [s for s in L["specialization"] if s is not None]
        assert all(1 / 3 - 1e-9 <= s <= 1 for s in scores) and L["top_domain"][0] in dom["domains"]


def test_vocabulary_and_coactivation_sections(analysis):
    res, _ = analysis
    voc, co = res["vocabulary"], res["coactivation"]
    for L in voc["layers"]:
        assert sum(ex["tokens"] for ex in L["experts"]) == 2 * res["tokens_analysed"]  # k assignments per token
        for ex in L["experts"]:
            assert len(ex["top_tokens"]) <= 8 and all(t["freq"] >= 5 and isinstance(t["text"], str)
                                                      for t in ex["top_tokens"])
            shares = [t["share"] for t in ex["top_tokens"]]
            assert shares == sorted(shares, reverse=True)
    assert co["uniform_lift"] == pytest.approx(2 / 3)
    for L in co["layers"]:
        joint = torch.tensor(L["joint"])
        assert torch.allclose(joint, joint.T) and float(joint.diagonal().sum()) == pytest.approx(2.0)  # sum P(i) = k


def test_router_saturation_and_agreement_known_answers(analysis):
    res, _ = analysis
    sat = res["saturation"]
    assert [p["step"] for p in sat["checkpoints"]] == [2, 4, 8] and sat["reference_step"] == 8
    assert sat["checkpoints"][1]["overlap"] == [1.0, 1.0] and sat["checkpoints"][2]["exact"] == [1.0, 1.0]
    assert sat["checkpoints"][0]["overlap"][0] == 0.0  # negated router: top-2 of 4 is the other two experts
    agr = res["agreement"]
    assert agr["other"]["top_k"] == 1 and agr["probe_tokens"] == 3 * 128
    assert agr["layers"][0]["overlap"] == 1.0 and agr["layers"][0]["exact"] == 0.0  # top-1 inside top-2, never equal


def test_generation_routing_equals_the_forward_on_the_same_tokens(analysis):
    res, _ = analysis
    gen = res["generation"]
    assert gen["engine"]["preemptions"] == 0 and gen["engine"]["generation_tokens"] == 3 * 2 * 4
    assert gen["engine"]["tokens_routed"] == gen["teacher_forced_tokens"] == 3 * 2 * (8 + 3)
    assert gen["max_tv_engine_vs_teacher_forced"] < 0.02 and set(gen["samples"]) == {"code", "stories", "plays"}
    for L in gen["layers"]:
        for row in L["engine_fractions"]:
            assert sum(row) == pytest.approx(2.0)


def test_outputs_pngs_report_and_results(analysis):
    res, out = analysis
    assert set(res["plots"]) == {"domain_specialization", "specialization_scores", "vocabulary", "coactivation",
                                 "router_saturation", "routing_agreement", "generation"}
    report = (out / "report.md").read_text()
    for name, path in res["plots"].items():
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size[0] >= 400 and im.size[1] >= 250, (name, im.size)
        assert f"]({name}.png)" in report
    for heading in ("Domain specialisation", "Vocabulary specialisation", "Co-activation", "Router saturation",
                    "Routing agreement", "Expert usage under generation"):
        assert heading in report
    assert json.loads((out / "results.json").read_text()) == res


def test_self_comparison_one_checkpoint_wandb_and_progress(tmp_path, tiny_run, monkeypatch, capsys):
    import eval.__main__ as entry

    logged: dict = {"images": {}, "summary": {}}

    class Recorder:
        def __init__(self, *args):
            pass

        def image(self, key, path):
            logged["images"][key] = path

        def table(self, key, columns, rows):
            logged[key] = rows

        def summary(self, values):
            logged["summary"].update(values)

        def close(self):
            pass

    monkeypatch.setattr(entry, "EvalLogger", Recorder)
    res = entry.run_eval({"ckpt": str(tiny_run), "logger": {"name": "wandb"},
                          "eval": {"task": "expert_analysis", "domains": {"stories": str(STORIES)}, "max_tokens": 128,
                                   "probe_tokens": 64, "compare": str(tiny_run), "generate": False}}, tmp_path)
    assert "keep_last" in res["saturation"]["skipped"] and res["generation"] == {"skipped": "eval.generate=false"}
    assert [L["overlap"] for L in res["agreement"]["layers"]] == [1.0, 1.0]  # a checkpoint against itself
    assert [L["exact"] for L in res["agreement"]["layers"]] == [1.0, 1.0]
    assert all(s in (1.0, None) for L in res["domain_specialization"]["layers"] for s in L["specialization"])
    assert set(logged["images"]) == {f"expert_analysis/{k}" for k in res["plots"]}
    assert "router_saturation" not in res["plots"] and "generation" not in res["plots"]
    assert len(logged["expert_analysis/specialization"]) == 2 * 4
    assert logged["summary"]["expert_analysis/agreement_mean_overlap"] == 1.0
    assert "routing" in capsys.readouterr().err  # the progress bar


@pytest.mark.parametrize("eval_cfg, message", [
    ({"domains": {"plays": "/no/such/file.txt"}}, r"eval.domains.plays='/no/such/file.txt' must be 'pystdlib' or an"),
    ({"domains": {}}, r"eval.domains=\{\} must be a mapping"),
    ({"max_tokens": 0}, r"eval.max_tokens=0 must be > 0"),
    ({"limit": 3}, r"eval.limit does not apply to task=expert_analysis"),
    ({"compare_dtype": "fp8"}, r"eval.compare_dtype='fp8' is not one of"),
    ({"temperature": -1}, r"eval.temperature=-1.0 must be >= 0"),
    ({"max_tokenz": 5}, r"unknown config key 'eval.max_tokenz'"),
])
def test_bad_options_name_the_field(tmp_path, eval_cfg, message):
    from eval.__main__ import run_eval

    with pytest.raises(ConfigError, match=message):
        run_eval({"ckpt": "unused", "logger": {"name": "none"}, "eval": {"task": "expert_analysis", **eval_cfg}},
                 tmp_path)
    assert ExpertAnalysis.Config().domains is None  # null = the three default domains
