"""tests/record.py: silent without MOE_LAB_RECORD_DIR, writes the values with it, never overwrites."""

import json

import pytest

from tests.record import ENV, record_measurement


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert record_measurement("x", {"a": 1}) is None
    assert list(tmp_path.iterdir()) == []


def test_writes_the_values_and_refuses_to_overwrite(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "rec"))
    path = record_measurement("awq", {"rtn_mse": 0.1, "awq_mse": 0.03})
    data = json.loads(path.read_text())
    assert path == tmp_path / "rec" / "awq.json"
    assert data["values"] == {"rtn_mse": 0.1, "awq_mse": 0.03} and data["name"] == "awq"
    assert len(data["load_after"]) == 3 and data["cpus"] >= 1
    with pytest.raises(FileExistsError, match="awq.json exists"):
        record_measurement("awq", {"rtn_mse": 9})
    assert json.loads(path.read_text())["values"]["rtn_mse"] == 0.1  # the first record is intact
