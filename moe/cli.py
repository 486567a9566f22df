"""What every command-line entry point shares: a user error is one line and exit status 2, and a
misspelled Hydra override is caught before Hydra composes the config, with a suggestion.

    @cli.guarded                      # argparse CLIs: UserError -> `error: ...` on stderr, return 2
    def main(argv=None) -> int: ...

    if __name__ == "__main__":        # Hydra CLIs (train.py, python -m eval)
        cli.check_hydra_overrides(CONFIG_DIR, "config")
        main()

Hydra's own report of a bad override is several lines ending in "use +key=value to append"
(which would only move the typo into a config error) and exit status 1. `check_hydra_overrides`
composes the command line's group choices with Hydra itself, so the keys it checks against are
the ones the user can type: `router.top_k`, not `model.router.top_k`, even though the model
config owns the router once `moe.config.load_config` has nested it.
"""

from __future__ import annotations

import difflib
import functools
import sys
from pathlib import Path
from typing import Callable, NoReturn, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from moe.errors import ConfigError, UserError

EXIT_USER_ERROR = 2


def one_line(error: BaseException | str) -> str:
    """The message as one line (a message listing several fields keeps them, joined by '; ')."""
    parts = [p.strip() for p in str(error).splitlines() if p.strip()]
    return "; ".join(parts) if parts else type(error).__name__


def fail(error: BaseException | str) -> NoReturn:
    """Print `error: <message>` on stderr and exit with status 2 (a user error, not a bug)."""
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def guarded(main: Callable[..., Optional[int]]) -> Callable[..., int]:
    """Decorate a CLI's `main`: a `UserError` (bad config, missing checkpoint, bad request,
    unavailable variant) becomes one line on stderr and return value 2; anything else is a bug
    and keeps its traceback."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs) or 0
        except UserError as e:
            print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
            return EXIT_USER_ERROR

    return wrapper


# ------------------------------------------------------------------------------------ Hydra

def _suggest(word: str, candidates: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(word, list(candidates), n=3, cutoff=0.6)


def _did_you_mean(suggestions: Sequence[str]) -> str:
    return f"did you mean {' or '.join(f'`{s}`' for s in suggestions)}? " if suggestions else ""


def group_options(config_dir: Path, group: str) -> Optional[list[str]]:
    """The options of config group `group` (its yaml files), or None if it is not a group."""
    folder = Path(config_dir) / group
    if not folder.is_dir():
        return None
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of `node`, sections included."""
    keys = []
    for k in node.keys():
        child = node._get_node(k)
        keys.append(f"{prefix}{k}")
        if isinstance(child, DictConfig):
            keys.extend(_keys(child, f"{prefix}{k}."))
    return keys


def check_key(composed: DictConfig, key: str, config_dir: Optional[Path] = None) -> None:
    """Raise a ConfigError when `key` (dotted, as typed on the command line) is not in `composed`;
    `config_dir` lets the message name another option of the group that has the key."""
    node, done = composed, []
    for part in key.split("."):
        if isinstance(node, ListConfig):  # a list index: nothing more to check
            return
        if node is None:
            raise ConfigError(f"`{key}`: `{'.'.join(done)}` is a value, not a section; "
                              f"set it with `{'.'.join(done)}=...`")
        if part in node.keys():  # (`in node` is False for a mandatory `???` value)
            child = node._get_node(part)  # the node itself: no interpolation is resolved
            node = child if isinstance(child, (DictConfig, ListConfig)) else None
            done.append(part)
            continue
        where = ".".join(done)
        siblings = [str(k) for k in node.keys()]
        close = [f"{where}.{s}" if where else s for s in _suggest(part, siblings)]
        if not close:  # the right field in another section (`model.top_k` -> `router.top_k`)
            leaf = key.rsplit(".", 1)[-1]
            everything = [k for k in _keys(composed) if not isinstance(OmegaConf.select(composed, k), DictConfig)]
            close = [k for k in everything if k.rsplit(".", 1)[-1] == leaf][:3] or _suggest(key, everything)
        elsewhere = _options_with_key(config_dir, key) if config_dir is not None else []
        if elsewhere:
            raise ConfigError(f"`{key}` is a key of {' and '.join(f'`{o}`' for o in elsewhere)}, not of the chosen "
                              f"option; choose it first: `{elsewhere[0]} {key}=...`")
        scope = f"of `{where}`" if where else "at the top level"
        raise ConfigError(f"unknown config key `{key}`; {_did_you_mean(close)}valid keys {scope}: "
                          f"{', '.join(siblings)}")


def _package(path: Path, group: str) -> str:
    """Where a group option's keys land: its `# @package` header, else the group's name."""
    for line in path.read_text().splitlines():
        if line.startswith("# @package "):
            return line.split(None, 2)[2].strip()
        if line.strip() and not line.startswith("#"):
            break
    return group


def _has_key(node, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node.keys():
            return False
        node = node._get_node(part)
    return True


def _options_with_key(config_dir: Path, key: str) -> list[str]:
    """`group=option` choices (of any group) whose config has `key`."""
    found = []
    for folder in sorted(p for p in Path(config_dir).iterdir() if p.is_dir()):
        for path in sorted(folder.glob("*.yaml")):
            pkg = _package(path, folder.name)
            if key.startswith(pkg + ".") and _has_key(OmegaConf.load(path), key[len(pkg) + 1:]):
                found.append(f"{folder.name}={path.stem}")
    return found


def _check_option(config_dir: Path, group: str, option: str, options: list[str]) -> None:
    if option in options:
        return
    raise ConfigError(f"`{group}={option}`: no such option of the `{group}` group; "
                      f"{_did_you_mean([f'{group}={s}' for s in _suggest(option, options)])}"
                      f"options: {', '.join(options)}")


def check_hydra_overrides(config_dir: Path, config_name: str, argv: Optional[Sequence[str]] = None,
                          program: Optional[str] = None) -> None:
    """Check the command line's overrides against the configs they would compose; on a typo, or a
    config group the entry point does not take, print one line with a suggestion and the valid
    keys or options, and exit 2. Anything this check cannot judge (syntax errors, `+key=`,
    `~key`, `hydra.*`) is left to Hydra. `program` names the command in messages."""
    try:
        _check_hydra_overrides(Path(config_dir), config_name, sys.argv[1:] if argv is None else list(argv),
                               program)
    except ConfigError as e:
        fail(e)


# Where the options of a config group go, for the entry points that do not take the group
# (train.py, python -m moe.data.prepare: configs/config.yaml; python -m eval: configs/eval.yaml).
GROUP_ELSEWHERE = {
    "quant": "weight quantization applies to a trained checkpoint: `python -m eval quant=...`, "
             "`python -m moe.quantize`, or `python -m moe.serve --quantization ...`",
    "task": "evaluation tasks run with `python -m eval task=... ckpt=...`",
    "judge": "the MT-Bench judge is chosen with `python -m eval task=mt_bench judge=...`",
    "router": "it evaluates the checkpoint's own router; change its routing with router.top_k, "
              "router.drop_experts or router.renormalize",
    "model": "the model (and its router, attention and experts) is the checkpoint's: ckpt=...",
    "data": "an evaluation reads the data its task names: eval.data_path=... (see configs/task/)",
}
TRAINING_GROUP = "a training option (`python train.py ...`); an evaluation takes the model as the checkpoint has it"
PROGRAMS = {"config": "train.py", "eval": "python -m eval"}


def used_groups(config_dir: Path, config_name: str) -> list[str]:
    """The config groups `config_name`'s defaults list chooses (Hydra's own `hydra/...` aside):
    the groups its entry point takes."""
    defaults = OmegaConf.load(Path(config_dir) / f"{config_name}.yaml").get("defaults") or []
    groups = []
    for entry in defaults:
        if isinstance(entry, str):
            continue  # `_self_`, or a config (not a group) of the primary's folder
        for key in entry:
            name = str(key).replace("optional ", "").replace("override ", "").strip().split("@")[0]
            if name.split("/")[0] != "hydra":
                groups.append(name)
    return groups


def config_groups(config_dir: Path) -> list[str]:
    """Every group Hydra's `--help` lists: each folder of `config_dir` but Hydra's own."""
    return sorted(p.name for p in Path(config_dir).iterdir() if p.is_dir() and p.name != "hydra")


def _unused_group(config_name: str, group: str, override: str, used: Sequence[str],
                  program: Optional[str]) -> ConfigError:
    program = program or PROGRAMS.get(config_name, config_name)
    where = GROUP_ELSEWHERE.get(group, TRAINING_GROUP if config_name == "eval" else "")
    return ConfigError(f"{program} does not take `{override}`{': ' + where if where else ''} "
                       f"(its config groups: {', '.join(used)})")


def _check_group(config_name: str, o, used: Sequence[str], program: Optional[str]) -> None:
    """A group override (`group=option`, `+group=option`) of a group the entry point does not
    take, or an append of one it already chooses: a ConfigError saying what to type instead."""
    from hydra.core.override_parser.types import OverrideType

    name = o.key_or_group
    if name not in used:
        raise _unused_group(config_name, name.split("/")[0], o.input_line, used, program)
    if o.type in (OverrideType.ADD, OverrideType.FORCE_ADD):
        raise ConfigError(f"`{o.input_line}`: `{name}` is already chosen by default; pick an option with "
                          f"`{o.input_line.lstrip('+')}`")


def _check_hydra_overrides(config_dir: Path, config_name: str, argv: list[str], program: Optional[str] = None) -> None:
    # Hydra's own command-line parser and override grammar: we read the command line exactly as it will.
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    try:
        args = get_args_parser().parse_args(argv)
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except (SystemExit, Exception):  # noqa: BLE001 - Hydra reports bad syntax in its own words
        return
    group_choices, keys = [], []
    used = used_groups(config_dir, config_name)
    for o in overrides:
        name = o.key_or_group
        if name.split(".")[0].split("/")[0] == "hydra":
            continue
        options = group_options(config_dir, name)
        if options is not None and o.type in (OverrideType.CHANGE, OverrideType.ADD, OverrideType.FORCE_ADD):
            _check_group(config_name, o, used, program)
        if o.type != OverrideType.CHANGE:
            continue
        if options is None:
            keys.append(name)
            continue
        try:
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        except Exception:  # noqa: BLE001 - glob / range sweeps of a group: Hydra expands and checks them
            continue
        for v in values:
            _check_option(config_dir, name, v, options)
        pkg = f"@{o.package}" if o.package else ""
        group_choices.append(f"{name}{pkg}={values[0]}")
    if not keys:
        return
    composed = compose(config_dir, config_name, group_choices)
    for key in keys:
        head = key.split(".")[0]
        if head not in composed.keys() and head in config_groups(config_dir) and head not in used:
            raise _unused_group(config_name, head, key, used, program)  # `quant.scheme=...` to train.py
        check_key(composed, key, config_dir)


def compose(config_dir: Path, config_name: str, overrides: Sequence[str]) -> DictConfig:
    """The config Hydra composes from `config_dir` with `overrides` (group choices), hydra section left out."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def composed_choices(config_dir: Path, config_name: str, overrides: Sequence[str]) -> dict:
    """{group: option} of what Hydra composes from `overrides` (its `hydra.runtime.choices`)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.runtime.choices)


# ------------------------------------------------------------------------------------ engine commands

def engine_settings(llm, routing: dict) -> str:
    """One line of what an engine command (`moe.serve`, `moe.generate`) runs with: weight
    quantization, KV cache dtype, routing (and whether the command line changed it), dtype and
    device. Printed at start-up, so a flag that changed nothing would show here. `llm` is a
    `moe.engine.LLM` (read by attribute: this module sits below the engine)."""
    model, config = llm.model, llm.config
    spec = getattr(model, "quant_spec", None)
    quant = spec.scheme if spec is not None and spec.enabled else "none"
    dtype = str(config.dtype or next(model.parameters()).dtype).replace("torch.", "")
    kv = f"{config.kv_cache_dtype} ({dtype})" if config.kv_cache_dtype == "auto" else config.kv_cache_dtype
    r = model.cfg.router  # (read by name: the fields a router variant has differ)
    route = " ".join(f"{k}={getattr(r, k)}" for k in ("top_k", "drop_experts", "renormalize")
                     if getattr(r, k, None) not in (None, [], ()))
    changed = ", ".join(f"{k}={v}" for k, v in routing.items())
    route = f"{getattr(r, 'name', '?')} {route} ({'changed by the command line: ' + changed if changed else 'as trained'})"
    return (f"engine: quantization {quant}; KV cache {kv}; routing {route}; "
            f"{dtype} on {config.device or next(model.parameters()).device}")
