"""benchmarks/init_from_load.py: bad --repeats / an existing --json are refused before any work (exit 2,
nothing written); the median (min-max) summary of the repeats."""

from benchmarks.init_from_load import main, spread


def test_bad_repeats_and_an_existing_json_are_refused(tmp_path, capsys):
    assert main(["--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err
    out = tmp_path / "run.json"
    out.write_text("mine", encoding="utf-8")
    assert main(["--json", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text(encoding="utf-8") == "mine"


def test_spread_is_median_with_min_max():
    runs = [{"s": 3.0}, {"s": 1.0}, {"s": 10.0}]
    assert spread(runs, "s") == "3.00 (1.00-10.00)"
    assert spread(runs[:1], "s", 1e-3, "{:.0f}") == "3000"
