"""Every Hydra entry point takes each config group that `--help` lists as `group=option`, or
refuses it in one line naming what to type instead, exit 2 (moe/cli.py): train.py and
`python -m moe.data.prepare` (configs/config.yaml) and `python -m eval` (configs/eval.yaml)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from moe import cli
from tests.conftest import REPO

CONFIGS = REPO / "configs"
ENTRY_POINTS = [("config", "train.py"), ("config", "python -m moe.data.prepare"), ("eval", "python -m eval")]
GROUPS = cli.config_groups(CONFIGS)


def test_the_groups_checked_are_the_ones_help_lists():
    p = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    listed = re.search(r"== Configuration groups ==\n.*?\n\n(.*?)\n\n", p.stdout, re.S).group(1)
    assert sorted(line.split(":")[0] for line in listed.splitlines()) == GROUPS
    assert set(cli.used_groups(CONFIGS, "config")) | set(cli.used_groups(CONFIGS, "eval")) == set(GROUPS)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("config_name, program", ENTRY_POINTS)
def test_each_group_is_taken_or_refused_in_one_line(config_name, program, group, capsys):
    option = cli.group_options(CONFIGS, group)[-1]
    if group in cli.used_groups(CONFIGS, config_name):
        cli._check_hydra_overrides(CONFIGS, config_name, [f"{group}={option}"], program)
        choices = cli.composed_choices(CONFIGS, config_name, [f"{group}={option}"])
        assert choices[group] == option  # Hydra composes it
        with pytest.raises(SystemExit) as e:  # Hydra's `+group=` suggestion: already chosen, say what to type
            cli.check_hydra_overrides(CONFIGS, config_name, [f"+{group}={option}"], program)
        assert e.value.code == 2
        assert capsys.readouterr().err == (f"error: `+{group}={option}`: `{group}` is already chosen by default; "
                                           f"pick an option with `{group}={option}`\n")
        return
    own_keys = OmegaConf.load(CONFIGS / f"{config_name}.yaml").keys()  # eval's `router.*` is its own section
    dotted = [] if group in own_keys else [f"{group}.x=1"]
    for override in (f"{group}={option}", f"+{group}={option}", *dotted):
        with pytest.raises(SystemExit) as e:
            cli.check_hydra_overrides(CONFIGS, config_name, [override], program)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {program} does not take `{override.split('=')[0]}")
        assert "its config groups: " in err and "Traceback" not in err


def test_eval_names_its_routing_overrides_and_train_the_quantization_commands():
    with pytest.raises(Exception, match=r"python -m eval does not take `router=topk`: .*router\.top_k, "
                                        r"router\.drop_experts or router\.renormalize"):
        cli._check_hydra_overrides(CONFIGS, "eval", ["router=topk"])
    cli._check_hydra_overrides(CONFIGS, "eval", ["router.top_k=1"])  # the eval's own routing key
    with pytest.raises(Exception, match=r"train.py does not take `quant=int4`: .*python -m moe.quantize"):
        cli._check_hydra_overrides(CONFIGS, "config", ["quant=int4"])


@pytest.mark.parametrize("argv, expected", [
    (["train.py", "quant=int4"], "error: train.py does not take `quant=int4`"),
    (["-m", "eval", "ckpt=x", "router=topk"], "error: python -m eval does not take `router=topk`"),
])
def test_the_commands_exit_2_with_one_line(argv, expected):
    p = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith(expected), p.stderr
