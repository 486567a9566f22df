"""moe/cluster/sweep_state.py on known answers, one process: the file layout, the merge, the
fallbacks; what the sixth mutation run found untested (docs/results/mutation/run6_mutX/README.md).
tests/cluster/test_sweep_state.py covers concurrent writers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from moe.cluster import sweep_state as ss


def test_the_files_live_where_the_launcher_and_the_report_look(tmp_path):
    assert ss.JOBS_DIR == ".sweep" and ss.SWEEP_FILE == "sweep.json" and ss.SUBMISSION_FILE == "submission.json"
    assert ss.job_file(tmp_path, 3) == tmp_path / ".sweep" / "job_3.json"
    assert ss.job_file(str(tmp_path), "7") == tmp_path / ".sweep" / "job_7.json"  # str dir, str number
    assert ss.STATES == ("pending", "running", "requeued", "done", "failed")
    assert ss.FINAL_STATES == ("done", "failed")


def test_an_atomic_write_makes_its_folder_and_leaves_only_the_file(tmp_path):
    path = tmp_path / "a" / "b" / "x.json"
    obj = {"n": 1, "list": [1, 2], "nested": {"k": "v"}}
    ss.write_json_atomic(path, obj)
    assert path.read_text() == json.dumps(obj, indent=2)  # readable by hand, as the README shows it
    ss.write_json_atomic(str(path), {"n": 2})  # replaced whole
    assert json.loads(path.read_text()) == {"n": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.json"]


def test_a_job_without_a_readable_record_reads_as_empty(tmp_path):
    assert ss.read_job(tmp_path, 0) == {}
    ss.job_file(tmp_path, 0).parent.mkdir(parents=True)
    ss.job_file(tmp_path, 0).write_text("{half")
    assert ss.read_job(tmp_path, 0) == {}
    ss.job_file(tmp_path, 0).write_text('{"num": 0, "state": "done"}')
    assert ss.read_job(tmp_path, 0) == {"num": 0, "state": "done"}


def test_update_merges_fields_stamps_the_time_and_refreshes_unless_told_not_to(tmp_path):
    t0 = time.time()
    rec = ss.update_job(tmp_path, "2", refresh=False, state="pending", overrides=["a=1"])
    assert rec["num"] == 2 and isinstance(rec["num"], int) and rec["state"] == "pending"
    assert t0 <= rec["updated"] <= time.time()
    assert json.loads(ss.job_file(tmp_path, 2).read_text()) == rec
    assert not (tmp_path / "sweep.json").exists()  # refresh=False: the caller refreshes once
    rec = ss.update_job(tmp_path, 2, attempts=1)  # no state: kept; the default refreshes
    assert rec["state"] == "pending" and rec["overrides"] == ["a=1"] and rec["attempts"] == 1
    assert json.loads((tmp_path / "sweep.json").read_text())["jobs"] == [rec]
    for state in ss.STATES:  # every state is accepted
        assert ss.update_job(tmp_path, 2, refresh=False, state=state)["state"] == state
    with pytest.raises(ValueError, match=r"job state 'finished' is not one of \('pending'"):
        ss.update_job(tmp_path, 2, state="finished")
    assert ss.read_job(tmp_path, 2)["state"] == "failed"  # a refused update writes nothing


def test_read_jobs_orders_by_number_and_skips_what_it_cannot_read(tmp_path):
    assert ss.read_jobs(tmp_path) == []  # no .sweep folder at all
    for num in (10, 2, 1):
        ss.update_job(tmp_path, num, refresh=False, state="pending")
    (tmp_path / ".sweep" / "job_5.json").write_text("not json")
    (tmp_path / ".sweep" / "other.json").write_text('{"num": 0}')  # not a job file
    assert [r["num"] for r in ss.read_jobs(tmp_path)] == [1, 2, 10]  # numbers, not names, order them


def test_an_unreadable_job_file_listed_first_hides_none_after_it(tmp_path, monkeypatch):
    for num in (2, 1):
        ss.update_job(tmp_path, num, refresh=False, state="pending")
    (tmp_path / ".sweep" / "job_0.json").write_text("{half")
    glob = Path.glob
    # whatever order the directory lists its files in: here the broken one first
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter(sorted(glob(self, pattern))))
    assert [r["num"] for r in ss.read_jobs(tmp_path)] == [1, 2]


def test_a_record_without_its_number_sorts_first(tmp_path):
    ss.update_job(tmp_path, 0, refresh=False, state="done")
    ss.update_job(tmp_path, 2, refresh=False, state="done")
    (tmp_path / ".sweep" / "job_1.json").write_text('{"state": "pending"}')  # written by hand, no "num"
    assert [r.get("num") for r in ss.read_jobs(tmp_path)] == [None, 0, 2]


def test_merge_counts_every_state_and_carries_the_submission(tmp_path):
    jobs = [{"num": 0, "state": "done"}, {"num": 1, "state": "done"}, {"num": 2, "state": "failed"},
            {"num": 3, "state": "running"}, {"num": 4}]
    merged = ss.merge(tmp_path, jobs)
    assert merged == {"sweep_dir": str(tmp_path), "jobs": jobs,
                      "counts": {"pending": 0, "running": 1, "requeued": 0, "done": 2, "failed": 1}}
    assert ss.read_submission(tmp_path) is None
    ss.write_submission(tmp_path, {"executor": "slurm", "job_ids": ["4242_0", "4242_1"]})
    assert (tmp_path / ".sweep" / "submission.json").is_file()
    assert ss.read_submission(tmp_path) == {"executor": "slurm", "job_ids": ["4242_0", "4242_1"]}
    assert ss.merge(tmp_path, jobs)["submission"] == {"executor": "slurm", "job_ids": ["4242_0", "4242_1"]}
    (tmp_path / ".sweep" / "submission.json").write_text("{half")
    assert ss.read_submission(tmp_path) is None and "submission" not in ss.merge(tmp_path, jobs)


def test_read_sweep_prefers_the_job_files_then_sweep_json(tmp_path):
    ss.update_job(tmp_path, 0, state="done")
    ss.update_job(tmp_path, 1, state="requeued")
    merged = ss.read_sweep(tmp_path)
    assert merged["counts"]["done"] == 1 and merged["counts"]["requeued"] == 1
    assert merged == json.loads((tmp_path / "sweep.json").read_text())
    ss.update_job(tmp_path, 1, refresh=False, state="done")  # sweep.json now behind: the job files win
    assert ss.read_sweep(tmp_path)["counts"]["done"] == 2
    merged = ss.refresh_sweep_json(tmp_path)
    for p in (tmp_path / ".sweep").glob("job_*.json"):  # job files gone: sweep.json stands in
        p.unlink()
    assert ss.read_sweep(tmp_path) == merged
    (tmp_path / "sweep.json").write_text("{half")
    assert ss.read_sweep(tmp_path) is None


def test_refresh_writes_the_merge_it_returns(tmp_path):
    ss.update_job(tmp_path, 4, refresh=False, state="running")
    out = ss.refresh_sweep_json(tmp_path)
    assert out == json.loads((tmp_path / "sweep.json").read_text()) == ss.merge(tmp_path, ss.read_jobs(tmp_path))
    assert out["jobs"][0]["num"] == 4 and out["counts"]["running"] == 1
    assert ss.refresh_sweep_json(Path(tmp_path / "empty"))["jobs"] == []


def test_refresh_rewrites_while_jobs_overtake_it_and_gives_up_after_50_rounds(tmp_path, monkeypatch):
    writes = []
    monkeypatch.setattr(ss, "write_json_atomic", lambda path, obj: writes.append(obj))
    # quiet: one write, nothing newer on the re-read
    monkeypatch.setattr(ss, "read_jobs", lambda d: [{"num": 0, "state": "done"}])
    assert ss.refresh_sweep_json(tmp_path)["jobs"] == [{"num": 0, "state": "done"}] and len(writes) == 1
    # another job's change lands after each of the first two writes: three writes, the last one complete
    reads = iter([[{"num": 0, "state": "running"}], [{"num": 0, "state": "done"}],
                  [{"num": 0, "state": "done"}, {"num": 1, "state": "done"}]])
    last = [{"num": 0, "state": "done"}, {"num": 1, "state": "done"}]
    monkeypatch.setattr(ss, "read_jobs", lambda d: next(reads, last))
    writes.clear()
    out = ss.refresh_sweep_json(tmp_path)
    assert [w["counts"]["done"] for w in writes] == [0, 1, 2] and out["jobs"] == last
    # never quiet (a job changing on every read): it stops after max_rounds writes, 50 by default
    count = iter(range(10**6))
    monkeypatch.setattr(ss, "read_jobs", lambda d: [{"num": 0, "state": "running", "step": next(count)}])
    writes.clear()
    out = ss.refresh_sweep_json(tmp_path)
    assert len(writes) == 50 and out["jobs"][0]["step"] == 50  # the newest read, not a stale or empty one
