"""TruthfulQA v0 from this repository's local data, for the harness's truthfulqa_mc1/mc2 protocol
without the hub: `$MOE_LAB_DATA/truthfulqa/v0/multiple_choice.jsonl` (default ../shared/data
beside the checkout; docs/guides/data.md), the hub's `truthful_qa/multiple_choice` rows,
817 questions in the hub's order, as the `validation` split the harness's tasks read."""

from pathlib import Path

import datasets

from eval.common import SHARED_DATA, EvalError


def load_truthfulqa(**_metadata) -> datasets.DatasetDict:
    path = SHARED_DATA / "truthfulqa" / "v0" / "multiple_choice.jsonl"
    if not Path(path).is_file():
        raise EvalError(f"truthfulqa_*_local: {str(path)!r} does not exist; set MOE_LAB_DATA to the directory "
                        "holding truthfulqa/v0 (docs/guides/data.md)")
    return datasets.DatasetDict({"validation": datasets.Dataset.from_json(str(path))})


def process_results_mc2(doc, results):
    """The harness's truthfulqa_mc2 scoring (lm_eval/tasks/truthfulqa/utils.py, version 3.0)."""
    # lazy: that module imports sacrebleu and rouge_score for the generation task at import time
    from lm_eval.tasks.truthfulqa.utils import process_results_mc2 as harness_mc2

    return harness_mc2(doc, results)
