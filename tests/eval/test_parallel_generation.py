"""`python -m eval task=mt_bench|structured tensor_parallel_size=2 [expert_parallel=true]` on the
tiny checkpoint: real rank processes (gloo), greedy answers equal to the single-process run's,
the engine built from the checkpoint path with the task's own options, and the whole model never
loaded in the evaluating process. One test, one launch: spawning a rank costs seconds, so the
first multi-rank engine (structured's, the longer context) is kept and lent to mt_bench too; each
task's own engine options are checked as open_engine passes them."""

from __future__ import annotations

import json

import pytest

import eval.__main__ as eval_main
import eval.generation as generation
from eval.tasks.structured import DATA
from moe.engine import LLM
from tests.eval.conftest import compose

STRUCTURED_IDS = [i for i, line in enumerate(l for l in DATA.read_text().splitlines() if l.strip())
                  if json.loads(line)["id"] == "geo"]
TASKS = {  # task: its arguments (structured first: its engine, built with the longer context, is shared)
    "structured": (f"eval.question_ids={STRUCTURED_IDS}", "eval.max_new_tokens=16", "eval.max_string_length=6",
                   "eval.temperature=0", "router.top_k=1"),  # rerouted: every rank must load with it
    "mt_bench": ("judge=none", "eval.question_ids=[81,101]", "eval.max_new_tokens=6", "eval.temperature=0"),
}


class Lent:
    """The shared engine as `open_engine` sees it: its `shutdown` is the test's, at the end."""

    def __init__(self, llm):
        self._llm = llm

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def shutdown(self):
        pass


def _answers(task: str, run_dir) -> list:
    if task == "mt_bench":
        rows = [json.loads(x) for f in (run_dir / "model_answer").glob("*.jsonl") for x in f.read_text().splitlines()]
        return [(r["question_id"], turn, text) for r in rows for turn, text in enumerate(r["choices"][0]["turns"])]
    rows = [json.loads(x) for x in (run_dir / "answers.jsonl").read_text().splitlines()]
    return [(r["mode"], r["id"], r["answer"], r["num_tokens"], r["finish_reason"]) for r in rows]


@pytest.mark.filterwarnings("ignore:max_model_len=")  # structured's schema prompts run past 128 positions
def test_generation_tasks_on_two_ranks_answer_as_one_process(tmp_path, tiny_run, shared_data, one_thread,
                                                             monkeypatch):
    built: list[dict] = []
    shared: list[LLM] = []

    class SpyLLM(LLM):  # records what each multi-rank engine is asked for (from_model builds no __init__)
        def __new__(cls, path=None, **opts):
            if path is None:  # LLM.from_model's cls.__new__(cls)
                return super().__new__(cls)
            built.append({"path": path, **opts})
            if not shared:
                shared.append(LLM(path, **opts))
            return Lent(shared[0])

    monkeypatch.setattr(generation, "LLM", SpyLLM)
    single = {task: eval_main.run_eval(compose(task, f"ckpt={tiny_run}", "logger=none", *args), tmp_path / f"{task}1")
              for task, args in TASKS.items()}
    assert built == []  # one rank: LLM.from_model over the model loaded here

    def no_whole_model(*a, **k):
        raise AssertionError("a multi-rank evaluation loaded the whole model in its own process")

    monkeypatch.setattr(eval_main, "load_model", no_whole_model)
    try:
        for task, args in TASKS.items():
            res = eval_main.run_eval(compose(task, f"ckpt={tiny_run}", "logger=none", "tensor_parallel_size=2",
                                             "expert_parallel=true", *args), tmp_path / f"{task}2")
            opts = built[-1]
            assert opts["path"] == str(tiny_run) and opts["tensor_parallel_size"] == 2 and opts["expert_parallel"]
            assert opts["seed"] == 0 and opts["max_model_len"] >= 128 and opts["device"].type == "cpu", opts
            assert res["checkpoint"]["tensor_parallel_size"] == 2 and res["checkpoint"]["expert_parallel"] is True
            assert res["checkpoint"]["params"] == single[task]["checkpoint"]["params"] > 0  # counted on meta
            one, two = _answers(task, tmp_path / f"{task}1"), _answers(task, tmp_path / f"{task}2")
            assert len(one) == (4 if task == "mt_bench" else 2) and one == two, (task, one, two)
            if task == "mt_bench":  # turn 2's prompt holds turn 1's answer: equal prompt lengths, equal tokens
                lengths = [[(t["prompt_tokens"], t["output_tokens"]) for t in r["generation"]["per_turn"]]
                           for r in (single[task], res)]
                assert lengths[0] == lengths[1], lengths
    finally:
        for llm in shared:
            llm.shutdown()
    assert built[0]["allow_long_context"] is True and built[0]["routing"] == {"top_k": 1}
    assert built[1]["max_num_batched_tokens"] == 2048 and built[1]["routing"] is None
    assert single["mt_bench"]["generation"]["output_tokens"] > 0  # the compared answers are not empty
    assert all(n > 0 for _, _, _, n, _ in _answers("structured", tmp_path / "structured1"))
