"""`task=routing_ablation` (`eval/tasks/routing_ablation.py`) sweeps the routing of one loaded
model (and restores it), and `router.*` on `python -m eval` reroutes the model it loads: the same
numbers as the sweep's rows."""

from __future__ import annotations

from eval.__main__ import run_eval

def test_routing_ablation_and_router_overrides(hf_dirs, text_file, tmp_path):
    directory, _ = hf_dirs("qwen3-headdim-mlponly")
    common = {"data_path": str(text_file), "max_length": 24, "stride": 12, "max_tokens": 120}
    res = run_eval({"ckpt": str(directory), "eval": {"task": "routing_ablation", "top_ks": [1, 2],
                                                     "drop_experts": [[], [0]], **common,
                                                     "truthfulqa": True, "truthfulqa_limit": 2},
                    "logger": {"name": "none"}}, tmp_path / "abl")
    rows = res["rows"]
    assert [(r["top_k"], r["drop_experts"]) for r in rows] == [(1, []), (1, [0]), (2, []), (2, [0])]
    assert rows[0]["active_params"] == rows[1]["active_params"] < rows[2]["active_params"]
    assert all(0 <= r["mc1"] <= 1 and 0 <= r["mc2"] <= 1 and r["token_perplexity"] > 1 for r in rows)
    assert len({r["token_perplexity"] for r in rows}) == 4  # every setting changes the model's outputs
    assert res["model_routing"] == {"top_k": 2, "drop_experts": [], "renormalize": True}
    table = (tmp_path / "abl" / "ablation.md").read_text()
    assert table.count("\n") == 2 + len(rows) and "| mc2 |" in table
    assert (tmp_path / "abl" / "ablation.png").stat().st_size > 10_000
    # The model's own routing, and `router.*` on the command line, give the same numbers.
    own = run_eval({"ckpt": str(directory), "eval": {"task": "perplexity", **common}, "logger": {"name": "none"}},
                   tmp_path / "own")
    assert own["scores"]["token_perplexity"] == rows[2]["token_perplexity"]
    routed = run_eval({"ckpt": str(directory), "router": {"top_k": 1, "drop_experts": [0]},
                       "eval": {"task": "perplexity", **common}, "logger": {"name": "none"}}, tmp_path / "routed")
    assert routed["scores"]["token_perplexity"] == rows[1]["token_perplexity"]
    assert routed["routing"]["top_k"] == 1 and routed["checkpoint"]["routing"] == {"top_k": 1, "drop_experts": [0]}
    assert routed["routing"]["active_params"] == rows[1]["active_params"]
