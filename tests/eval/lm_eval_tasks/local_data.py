"""The datasets of the local test tasks: a JSONL file next to this module, as a `datasets.DatasetDict`
with one `test` split (the harness calls `custom_dataset(**metadata, **dataset_kwargs)`; a path
relative to this folder keeps the tasks independent of the working directory, and nothing is
fetched)."""

from pathlib import Path

import datasets


def load_jsonl(data_file: str, **_metadata) -> datasets.DatasetDict:
    path = Path(__file__).resolve().parent / data_file
    return datasets.DatasetDict({"test": datasets.Dataset.from_json(str(path))})
