"""Distributed fine-tuning from an HF directory: ddp and fsdp (2 gloo processes) start from the
source's weights (rank 0 reads them, the other rank receives its shards: moe/distributed/
materialize.py) and train as one process does. One torchrun launch for both layouts."""

from __future__ import annotations

import json

import pytest

from tests.distributed.dist_helpers import torchrun
from tests.train.finetune_helpers import finetune_args, run, word_corpus

WORKER = "tests/train/init_from_worker.py"
STEPS = 4
MODES = ["ddp", "fsdp"]


def losses(run_dir) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], k): r[k] for r in records for k in ("train/loss", "val/loss") if k in r}


@pytest.mark.slow  # a torchrun launch of 2 processes (~40 s on 2 shared cores)
def test_ddp_and_fsdp_start_from_the_source_and_train_as_one_process(hf_dirs, tmp_path):
    src, _ = hf_dirs("qwen3-headdim-mlponly")
    args = finetune_args(src, word_corpus(tmp_path), tmp_path / "cache", "router.jitter=0", "distributed.timeout_s=120",
                         steps=STEPS)
    run(args, tmp_path / "single")  # also prepares the data (distributed ranks only read prepared data)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"jobs": [{"args": [*args, f"distributed={m}"], "run_dir": str(tmp_path / m)}
                                         for m in MODES]}))
    p = torchrun([WORKER, str(spec)], tmp_path)
    assert p.returncode == 0, p.stderr[-6000:]
    ref = losses(tmp_path / "single")
    assert (0, "val/loss") in ref and (STEPS, "train/loss") in ref
    for mode in MODES:
        got = losses(tmp_path / mode)
        assert sorted(got) == sorted(ref), mode
        for key, value in ref.items():
            assert abs(got[key] - value) <= 1e-5 * abs(value), (mode, key, got[key], value)
        record = json.loads((tmp_path / mode / "config.json").read_text())["run"]
        assert record["init_from"]["family"] == "qwen3_moe"
