"""benchmarks/prefill_attention_ab.py: runs at tiny sizes, times both paths every round, names the path the
backend takes (spied, then restored), and exits 1 when the loop's output differs from the padded reference."""

import json

import moe.attention.paged_torch as pt
from benchmarks import prefill_attention_ab as ab


def test_both_paths_are_timed_and_the_backends_choice_is_named(tmp_path):
    saved = pt.paged_attention_prefill_torch, pt.paged_attention_prefill_sdpa
    out = tmp_path / "ab.json"
    assert ab.main(["--cases", "1:5:5:0:0", "6:1:1:3:9", "--rounds", "2", "--calls", "1", "--json", str(out)]) == 0
    one, many = json.loads(out.read_text())["results"]
    assert (one["queries"], many["queries"]) == (5, 6)
    assert (one["backend_takes"], many["backend_takes"]) == ("loop", "padded")  # one sequence; 1 query a sequence
    assert all(set(r["us_per_call"]) == {"padded", "loop"} and all(len(v) == 2 for v in r["us_per_call"].values())
               for r in (one, many))
    assert (pt.paged_attention_prefill_torch, pt.paged_attention_prefill_sdpa) == saved


def test_a_wrong_loop_output_fails_the_run(monkeypatch, capsys):
    real = ab.paged_attention_prefill_sdpa
    monkeypatch.setattr(ab, "paged_attention_prefill_sdpa", lambda *a: real(*a) * 1.001)
    assert ab.main(["--cases", "2:4:9:0:5", "--rounds", "1", "--calls", "1"]) == 1
    assert "FAILED: the loop differs from the padded reference" in capsys.readouterr().err
