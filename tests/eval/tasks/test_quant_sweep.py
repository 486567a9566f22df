"""`task=quant_sweep` (`eval/tasks/quant_sweep.py`) on a tiny checkpoint: a row per scheme with
its deltas to the full-precision model, and `quant=<scheme>` on `python -m eval` loads the model
quantized (the same perplexity as the sweep's row)."""

from __future__ import annotations

import pytest

from eval.__main__ import run_eval
from moe.errors import ConfigError
from tests.hf_fixtures import family_checkpoint


@pytest.mark.slow
def test_quant_sweep_and_quant_override(bpe_tokenizer, text_file, tmp_path):
    ckpt = family_checkpoint(tmp_path / "run", bpe_tokenizer, d_model=64, max_seq_len=512)
    common = {"data_path": str(text_file), "max_length": 24, "stride": 12, "max_tokens": 120}
    calib = tmp_path / "calib.txt"
    calib.write_text("the quick brown fox jumps over the lazy dog " * 40)
    quant = {"schemes": ["none", "int8", "awq"], "calib_path": str(calib), "calib_tokens": 128, "group_size": 32}
    res = run_eval({"ckpt": str(ckpt), "quant": quant, "logger": {"name": "none"},
                    "eval": {"task": "quant_sweep", **common, "truthfulqa": True, "truthfulqa_limit": 2,
                             "engine_prompts": 2, "engine_prompt_tokens": 8, "engine_max_tokens": 3}},
                   tmp_path / "sweep")
    rows = {r["scheme"]: r for r in res["rows"]}
    assert list(rows) == ["none", "int8", "awq"]
    ref = rows["none"]
    assert ref["d_token_perplexity"] == 0 and ref["d_mc1"] == 0 and ref["weight_bytes_ratio"] == 1
    for s in ("int8", "awq"):
        r = rows[s]
        assert r["d_token_perplexity"] == pytest.approx(r["token_perplexity"] - ref["token_perplexity"])
        assert r["d_token_perplexity"] != 0  # quantization changed the outputs
        assert r["weight_bytes"] < ref["weight_bytes"] and r["engine_tokens"] == 6
        assert r["d_mc2_stderr"] is not None and 0 <= r["mc2"] <= 1
    assert rows["awq"]["weight_bytes"] < rows["int8"]["weight_bytes"]
    assert rows["int8"]["kv_bytes_per_token"] == ref["kv_bytes_per_token"] > 0
    table = (tmp_path / "sweep" / "quant_sweep.md").read_text()
    assert table.count("\n") == 2 + 3 and "| d_mc2_stderr |" in table
    assert (tmp_path / "sweep" / "quant_sweep.png").stat().st_size > 10_000
    one = run_eval({"ckpt": str(ckpt), "quant": {"scheme": "int8"}, "eval": {"task": "perplexity", **common},
                    "logger": {"name": "none"}}, tmp_path / "int8")
    assert one["scores"]["token_perplexity"] == rows["int8"]["token_perplexity"]
    assert one["checkpoint"]["quantization"]["scheme"] == "int8"
    with pytest.raises(ConfigError, match="is the perplexity text"):
        run_eval({"ckpt": str(ckpt), "quant": {**quant, "calib_path": str(text_file)}, "logger": {"name": "none"},
                  "eval": {"task": "quant_sweep", **common}}, tmp_path / "bad")
    with pytest.raises(ConfigError, match=r"quantization='int3' is unknown"):
        run_eval({"ckpt": str(ckpt), "quant": {"schemes": ["none", "int3"]}, "logger": {"name": "none"},
                  "eval": {"task": "quant_sweep", **common}}, tmp_path / "bad2")
