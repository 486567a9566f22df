"""`--sweep NAME=V1,V2,...` (repeatable): server settings to compare, one server each.

    --sweep 'max_num_seqs=32,64,128,256' --sweep 'max_num_batched_tokens=512,2048'   # 8 settings
    --sweep 'no_prefix_caching=false,true' --sweep 'block_size=16,32'

NAME is an option of `python -m moe.serve` (underscores or dashes: `max_num_seqs` is
`--max-num-seqs`); a flag without a value (`--no-prefix-caching`) takes `true` / `false`. The
settings are the cartesian product of the sweeps, in the order given; each is launched with
`--server-args` plus its own options (which replace the same options in `--server-args`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import subprocess
from pathlib import Path
from typing import Iterator

from benchmarks.serving.server import launch_server
from moe.serve.__main__ import build_parser as server_parser

NOT_SWEPT = {"checkpoint", "host", "port", "api_key", "help", "served_model_name", "log_level", "access_log"}
TRUE, FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


class SweepError(ValueError):
    """A bad --sweep: the message names it and what is allowed."""


def _server_options() -> dict[str, argparse.Action]:
    """The options of `python -m moe.serve` by dest, except those a sweep must not change."""
    # argparse has no public accessor for a parser's actions; `_actions` is stable across versions.
    return {a.dest: a for a in server_parser()._actions if a.option_strings and a.dest not in NOT_SWEPT}


def parse_sweeps(specs: list[str]) -> list[dict]:
    """The settings (dicts of option dest -> value string) of the --sweep specs."""
    options = _server_options()
    axes: list[tuple[str, list[str]]] = []
    for spec in specs:
        name, sep, values = spec.partition("=")
        key = name.strip().replace("-", "_")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not vals:
            raise SweepError(f"--sweep {spec!r}: expected NAME=V1,V2,... e.g. max_num_seqs=32,64")
        if key not in options:
            raise SweepError(f"--sweep {spec!r}: {key!r} is not a server option; choose one of {sorted(options)}")
        if any(key == k for k, _ in axes):
            raise SweepError(f"--sweep {spec!r}: {key} is swept twice")
        action = options[key]
        for v in vals:
            if action.nargs == 0:
                if v.lower() not in TRUE + FALSE:
                    raise SweepError(f"--sweep {spec!r}: {key} is a flag: its values are true or false, not {v!r}")
            elif action.type is not None:
                try:
                    action.type(v)
                except ValueError:
                    raise SweepError(f"--sweep {spec!r}: {v!r} is not a valid {action.type.__name__} for {key}") \
                        from None
        axes.append((key, vals))
    return [dict(zip([k for k, _ in axes], combo)) for combo in itertools.product(*(v for _, v in axes))]


def server_args(base: str, setting: dict) -> str:
    """`base` (the --server-args string) with the options of `setting` replacing their own."""
    options = _server_options()
    flags = {options[k].option_strings[-1]: options[k] for k in setting}
    out, words = [], base.split()
    i = 0
    while i < len(words):
        w = words[i]
        flag = w.split("=", 1)[0]
        if flag in flags:
            i += 1 if (flags[flag].nargs == 0 or "=" in w) else 2  # drop it and its value
            continue
        out.append(w)
        i += 1
    for key, value in setting.items():
        action = options[key]
        if action.nargs == 0:
            if value.lower() in TRUE:
                out.append(action.option_strings[-1])
        else:
            out += [action.option_strings[-1], value]
    return " ".join(out)


@contextlib.contextmanager
def launched(args, setting: dict, log_path: Path) -> Iterator[str]:
    """`python -m moe.serve args.launch` with `setting` on a free loopback port, for the block;
    yields its base URL."""
    a = copy.copy(args)
    a.server_args = server_args(args.server_args, setting)
    proc, url = launch_server(a, log_path)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
