"""`task=perplexity` (`eval/tasks/perplexity.py`) on an HF directory equals a plain HF transformers
loop on the same model and text (token- and byte-level), from a .txt file and from .jsonl rows."""

from __future__ import annotations

import json
import math

import pytest
import torch

from eval.__main__ import run_eval

def hf_loop_nll(hf, ids: list[int], max_length: int, stride: int) -> tuple[float, int]:
    """HF's "perplexity of fixed-length models" loop, with its labels and its loss, counting the
    tokens each window's loss averages over (the labels left after the shift)."""
    seq = torch.tensor([ids])
    nll, n, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + max_length, len(ids))
        trg_len = end - prev_end
        input_ids = seq[:, begin:end]
        labels = input_ids.clone()
        labels[:, :-trg_len] = -100
        with torch.no_grad():
            loss = hf(input_ids=input_ids, labels=labels).loss
        count = int((labels[:, 1:] != -100).sum())
        nll += float(loss) * count
        n += count
        prev_end = end
        if end == len(ids):
            break
    return nll, n

@pytest.mark.parametrize("case", ["olmoe-tied-renorm", "qwen3-headdim-mlponly"])
def test_perplexity_equals_a_plain_hf_loop(case, hf_dirs, text_file, tmp_path):
    from transformers import AutoTokenizer

    directory, hf = hf_dirs(case)
    res = run_eval({"ckpt": str(directory), "eval": {"task": "perplexity", "data_path": str(text_file),
                                                     "max_length": 24, "stride": 10, "batch_size": 3},
                    "logger": {"name": "none"}}, tmp_path / "ppl")
    tok = AutoTokenizer.from_pretrained(str(directory))
    text = text_file.read_text(encoding="utf-8")
    ids = [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)
    nll, n = hf_loop_nll(hf, ids, 24, 10)
    s = res["scores"]
    assert s["tokens"] == n == len(ids) - 1 and s["windows"] > 5 and s["bytes"] == len(text.encode())
    assert s["token_perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    assert s["byte_perplexity"] == pytest.approx(math.exp(nll / len(text.encode())), rel=1e-5)
    assert s["bits_per_byte"] == pytest.approx(nll / len(text.encode()) / math.log(2), rel=1e-5)
    assert json.loads((tmp_path / "ppl" / "results.json").read_text())["scores"] == s
    # The same text as rows of a .jsonl file, through `datasets`: the same number.
    rows = text.split("\n\n")
    jsonl = tmp_path / "doc.jsonl"
    jsonl.write_text("".join(json.dumps({"body": r}) + "\n" for r in rows))
    again = run_eval({"ckpt": str(directory), "eval": {"task": "perplexity", "data_path": str(jsonl),
                                                       "text_field": "body", "max_length": 24, "stride": 10},
                      "logger": {"name": "none"}}, tmp_path / "ppl2")
    assert again["scores"]["token_perplexity"] == pytest.approx(s["token_perplexity"], rel=1e-6)
    assert again["data"]["documents"] == len(rows)
