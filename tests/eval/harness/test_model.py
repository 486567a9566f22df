"""The `moe_lab` back-end equals the harness's `hf` back-end on the same exported model, document by
document: log-likelihoods within 1e-4, greedy generations identical (also when `until` cuts them),
task metrics equal; and the chat template renders as the tokenizer's."""

from __future__ import annotations

import math

import pytest
import torch

from tests.eval.harness.conftest import TASKS

TOL = 1e-4


def _evaluate(model: str, model_args: str, manager):
    import lm_eval

    import eval.harness.model  # noqa: F401  (registers moe_lab)
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=TASKS, task_manager=manager,
                                   device="cpu", batch_size=4, log_samples=True, random_seed=0)


@pytest.fixture(scope="module")
def both(harness_hf, local_tasks):
    torch.set_num_threads(1)
    args = f"pretrained={harness_hf},max_length=48"
    return _evaluate("moe_lab", args, local_tasks), _evaluate("hf", args + ",dtype=float32", local_tasks)


def _numbers(resps) -> list[float]:
    """The log-likelihood(s) of one sample's responses (multiple choice: (ll, greedy) per choice)."""
    return [float(r[0][0]) if isinstance(r[0], (tuple, list)) else float(r[0]) for r in resps]


def test_loglikelihoods_equal_the_hf_backend_per_document(both):
    ours, hf = both
    for task in ("moe_lab_mc", "moe_lab_rolling"):
        a, b = ours["samples"][task], hf["samples"][task]
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            assert x["doc_id"] == y["doc_id"]
            assert _numbers(x["resps"]) == pytest.approx(_numbers(y["resps"]), abs=TOL), (task, x["doc_id"])
        if task == "moe_lab_mc":  # the greedy flags too
            assert [[r[0][1] for r in x["resps"]] for x in a] == [[r[0][1] for r in y["resps"]] for y in b]


def test_greedy_generations_are_identical(both):
    ours, hf = both
    a, b = ours["samples"]["moe_lab_gen"], hf["samples"]["moe_lab_gen"]
    assert [x["resps"] for x in a] == [y["resps"] for y in b]
    assert any(x["resps"][0][0] for x in a)  # something was generated


def test_task_metrics_are_equal(both):
    ours, hf = both
    for task in TASKS:
        for key, value in hf["results"][task].items():
            if isinstance(value, float) and "," in key:
                assert math.isclose(ours["results"][task][key], value, rel_tol=1e-5, abs_tol=1e-6), (task, key)


def test_until_strings_cut_generations_as_hf_does(harness_hf):
    """A stop string taken from the middle of an uncut generation cuts both back-ends' text at the same place."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    import eval.harness.model  # noqa: F401
    ours = get_model("moe_lab")(pretrained=str(harness_hf), max_length=48)
    hf = get_model("hf")(pretrained=str(harness_hf), max_length=48, dtype="float32", device="cpu")

    def generate(lm, until):
        reqs = [Instance("generate_until", {}, (p, {"until": until, "max_gen_toks": 10, "do_sample": False}), i)
                for i, p in enumerate(["the quick brown fox", "a cat sat on"])]
        return lm.generate_until(reqs)

    uncut = generate(hf, [])
    assert generate(ours, []) == uncut
    stop = uncut[0][3:5]
    assert stop and stop in uncut[0]
    cut = generate(hf, [stop])
    assert cut[0] == uncut[0].split(stop)[0]
    assert generate(ours, [stop]) == cut


def test_chat_template_is_the_tokenizers(harness_hf):
    from lm_eval.api.registry import get_model

    import eval.harness.model  # noqa: F401
    from moe.data.tokenizer import CHAT_TEMPLATE
    lm = get_model("moe_lab")(pretrained=str(harness_hf))
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the dog"}]
    assert lm.chat_template(True) == CHAT_TEMPLATE and lm.chat_template(False) is None
    assert lm.apply_chat_template(chat[:1]) == "<|bos|><|user|>\nhi<|end|>\n<|assistant|>\n"
    assert lm.apply_chat_template(chat, add_generation_prompt=False).endswith("<|assistant|>\nthe dog")
    assert lm.tokenizer_name.startswith("moe_lab__")
