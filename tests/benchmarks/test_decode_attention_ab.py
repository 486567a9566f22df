"""benchmarks/decode_attention_ab.py: both modes run at tiny sizes, check every branch against the
reference (they raise otherwise), time each branch every round, and leave the module's bound as found."""

import json

import moe.attention.paged_torch_decode as ptd
from benchmarks import decode_attention_ab as ab


def test_branches_mode_times_both_branches_and_restores_the_bound(tmp_path):
    bound = ptd.SDPA_MAX_GATHERED
    out = tmp_path / "ab.json"
    assert ab.main(["--shapes", "3:5:40", "--rounds", "2", "--calls", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["batch"] == 3 and set(row["us_per_call"]) == {"sdpa", "copy"}
    assert all(len(v) == 2 and min(v) >= 0 for v in row["us_per_call"].values())
    assert ptd.SDPA_MAX_GATHERED == bound


def test_contiguous_mode_compares_the_previous_view_decode(tmp_path):
    out = tmp_path / "c.json"
    assert ab.main(["--contiguous", "--contexts", "1", "17", "--rounds", "1", "--calls", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["context"] for r in rows] == [1, 17]
    assert all(set(r["median_us"]) == {"view_matmul", "view_sdpa"} for r in rows)
