"""TruthfulQA's wiring that the first mutation run's tests never reached (docs/results/mutation/rerun1b, the
lead's continuation): the questions a routing ablation or a quantization sweep adds are checked before
anything loads (`check_added_questions`), and `evaluate` and the task run the model on the device and in the
batches they are given (a dropped device is invisible on a CPU-only machine unless a test gives another)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from eval.__main__ import run_eval
from eval.common import EvalError
from eval.tasks import truthfulqa
from eval.tasks.base import EvalContext
from eval.tasks.quant_sweep import QuantSweepConfig
from eval.tasks.routing_ablation import RoutingAblationConfig
from eval.tasks.truthfulqa import Doc, TruthfulQA, TruthfulQAConfig, evaluate

from tests.eval.conftest import TRUTHFULQA, compose


# ---------------------------------------------------------------------------- added questions

@pytest.mark.parametrize("config", [RoutingAblationConfig, QuantSweepConfig])
def test_added_questions_are_checked_only_when_asked_for_and_local(config, tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(EvalError) as e:
        truthfulqa.check_added_questions(config(truthfulqa=True, truthfulqa_data_path=str(missing)))
    # the field the user set, and the path it names (not the shared default, not the task's own eval.data_path)
    assert str(e.value) == f"eval.truthfulqa_data_path (TruthfulQA): {str(missing)!r} does not exist"
    a_file = tmp_path / "questions.json"
    a_file.write_text("{}")
    with pytest.raises(EvalError, match=r"^eval.truthfulqa_data_path \(TruthfulQA\): .* is not a directory$"):
        truthfulqa.check_added_questions(config(truthfulqa=True, truthfulqa_data_path=str(a_file)))
    # not asked for: a wrong path is not this task's business; the hub is not a local path
    assert truthfulqa.check_added_questions(config(truthfulqa=False, truthfulqa_data_path=str(missing))) is None
    assert truthfulqa.check_added_questions(config(truthfulqa=True, truthfulqa_data_path="hub")) is None
    assert truthfulqa.check_added_questions(config(truthfulqa=False, truthfulqa_data_path="hub")) is None


def test_added_questions_default_to_the_shared_copy(monkeypatch, tmp_path):
    monkeypatch.setattr(truthfulqa, "SHARED_DATA", tmp_path / "nowhere")
    with pytest.raises(EvalError) as e:
        truthfulqa.check_added_questions(RoutingAblationConfig(truthfulqa=True))
    msg = str(e.value)
    assert msg.startswith("eval.truthfulqa_data_path (TruthfulQA): the default ") and "\n" not in msg
    assert str(tmp_path / "nowhere") in msg and "give eval.truthfulqa_data_path=<dir>" in msg
    assert "or eval.truthfulqa_data_path=hub (the HF dataset truthfulqa/truthful_qa" in msg


@pytest.mark.parametrize("task, extra", [("routing_ablation", []), ("quant_sweep", ["quant.schemes=[int8]"])])
def test_a_task_adding_questions_refuses_a_missing_copy_before_the_checkpoint_loads(task, extra, tmp_path,
                                                                                   shared_data):
    fake = tmp_path / "fake.pt"
    fake.write_bytes(b"not a checkpoint")  # a check that passes it ran before loading
    missing = tmp_path / "no_such_dir"
    cfg = compose(task, f"ckpt={fake}", "logger=none", "eval.truthfulqa=true", f"eval.truthfulqa_data_path={missing}",
                  *extra)
    with pytest.raises(EvalError, match=r"^eval.truthfulqa_data_path \(TruthfulQA\): .*no_such_dir' does not exist$"):
        run_eval(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_task_checks_a_local_copy_before_loading_and_not_the_hub(tmp_path):
    task = TruthfulQA()
    assert task.check_inputs(SimpleNamespace(eval=TruthfulQAConfig(data_path="hub"))) is None  # (no "hub" dir here)
    with pytest.raises(EvalError, match=r"^eval.data_path \(TruthfulQA\): .*no_such_dir' does not exist$"):
        task.check_inputs(SimpleNamespace(eval=TruthfulQAConfig(data_path=str(tmp_path / "no_such_dir"))))


# ---------------------------------------------------------------------------- device and batches

class _OnMeta(Exception):
    """A batch reached the meta device (where a CPU model cannot compute): the run stops here."""


class _Recorder(torch.nn.Module):
    """The model, recording the device and the number of rows of every batch it is called on."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.cfg, self.calls = model, model.cfg, []

    def forward(self, ids):
        self.calls.append((ids.device.type, ids.shape[0]))
        if ids.device.type == "meta":
            raise _OnMeta
        return self.inner(ids)


def _doc():
    return Doc(3, "Is it?", "Health", ["Yes.", "No."], [1, 0], ["It is.", "No.", "Yes, it is."], [1, 0, 1])


def test_evaluate_runs_on_the_device_it_is_given(tiny):
    model, tok, _ = tiny
    rec = _Recorder(model)
    with pytest.raises(_OnMeta):
        evaluate(rec, tok, [_doc()], TruthfulQAConfig(), device=torch.device("meta"))
    assert rec.calls == [("meta", 4)]  # the four distinct (question, answer) requests ("No." twice) in one batch


@pytest.mark.parametrize("batch_size, rows", [(3, [3, 1]), (1, [1] * 4), (32, [4])])
def test_evaluate_batches_by_eval_batch_size(tiny, batch_size, rows):
    model, tok, _ = tiny
    rec = _Recorder(model)
    res = evaluate(rec, tok, [_doc()], TruthfulQAConfig(batch_size=batch_size))
    assert rec.calls == [("cpu", n) for n in rows]
    assert res["stats"]["unique_requests"] == 4
    plain = evaluate(model, tok, [_doc()], TruthfulQAConfig())  # batching changes no score
    assert res["rows"][0]["mc1"] == plain["rows"][0]["mc1"]
    assert res["rows"][0]["mc2"] == pytest.approx(plain["rows"][0]["mc2"], abs=1e-6)


def test_the_task_runs_the_model_on_the_run_device(tiny, tmp_path):
    if not (TRUTHFULQA / "v0").is_dir():
        pytest.skip(f"shared TruthfulQA data not found at {TRUTHFULQA}")
    model, tok, _ = tiny
    rec = _Recorder(model)
    ctx = EvalContext(cfg=SimpleNamespace(eval=TruthfulQAConfig(limit=1)), config={}, run_dir=tmp_path, model=rec,
                      tokenizer=tok, checkpoint={}, logger=None, device=torch.device("meta"))
    with pytest.raises(_OnMeta):
        TruthfulQA().run(ctx)
    assert [d for d, _ in rec.calls] == ["meta"]
