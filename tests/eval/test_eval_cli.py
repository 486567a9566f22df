"""`python -m eval` (eval/__main__.py) on the command line: a misspelled override is one line
with a suggestion, exit 2. (Its other exits: the tasks' tests, e.g. missing MT-Bench judgments
exit 1 in tests/eval/tasks/test_mt_bench.py.)"""

from __future__ import annotations

import subprocess
import sys

from tests.eval.conftest import REPO


def test_eval_cli_typo_is_one_line_and_exit_2():
    p = subprocess.run([sys.executable, "-m", "eval", "task=truthfulqa", "eval.limt=5", "ckpt=x"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "error: unknown config key `eval.limt`; did you mean `eval.limit`? valid keys of `eval`: task, data_path, "
        "version, hub_name, limit, categories, question_ids, shuffle, seed, batch_size, max_length, mc2_split, "
        "on_truncation, overwrite"]
