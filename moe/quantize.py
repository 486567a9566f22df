"""Quantize a checkpoint and write it as a quantized checkpoint.

    python -m moe.quantize runs/x/checkpoints/step_0000300.pt out/int4.pt --scheme int4 --group-size 128
    python -m moe.quantize runs/x out/awq.pt --scheme awq --calib-path calib.txt --calib-tokens 4096

The output is the single-file checkpoint format (`moe/checkpoint.py`) plus a `quantization` key
(the scheme and its settings); its `model` state holds each quantized module's codes, scales and
zero points (docs/guides/quantization.md). `moe.load_model`, `LLM`, `python -m moe.serve`,
`python -m moe.generate` and `python -m eval` load it quantized with no further option.

Every option is checked before the checkpoint is loaded, and errors name this command's flags.
An existing output is refused unless `--overwrite` (which moves it aside to `<out>.old-<time>`);
the output may not be the input, nor lie in a run's `checkpoints/` directory.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Optional

from moe import cli, outputs
from moe.checkpoint import save_checkpoint, tokenizer_files
from moe.config import to_dict
from moe.errors import ConfigError
from moe.loading import load_model
from moe.quant import NONE, QuantSpec, allowed_schemes, weight_bytes

# QuantSpec's fields as this command spells them (its messages name `quant.<field>` and `quantization=`).
FLAGS = {"quantization": "--scheme", "scheme": "--scheme", "group_size": "--group-size",
         "calib_path": "--calib-path", "calib_tokens": "--calib-tokens", "n_grid": "--n-grid"}


def schemes() -> list[str]:
    """The schemes this command writes (`none` would copy the checkpoint unchanged)."""
    return [s for s in allowed_schemes() if s != NONE]


def in_flag_names(message: str) -> str:
    """A message of moe.quant, with `quant.<field>` / `quantization=` spelled as this command's flags."""
    message = re.sub(r"\bquant\.(\w+)", lambda m: FLAGS.get(m.group(1), m.group(0)), message)
    message = re.sub(r"\bquantization=", "--scheme=", message)
    return message.replace(f"choose one of {allowed_schemes()}", f"choose one of {schemes()}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moe.quantize", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a full-precision checkpoint file, run directory or HF directory")
    p.add_argument("out", help="the quantized checkpoint file to write (a new path)")
    p.add_argument("--scheme", required=True, help=f"one of {schemes()}")
    p.add_argument("--group-size", type=int, help="int4/awq: inputs per scale and zero point (default 128)")
    p.add_argument("--calib-path", help="awq: calibration text file")
    p.add_argument("--calib-tokens", type=int, help="awq: calibration tokens (default 4096)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output: the old file is moved aside to <out>.old-<time>")
    return p


def check_options(args) -> QuantSpec:
    """Every option, before anything is loaded: the scheme and its settings (moe.quant's own
    validation), AWQ's calibration file, and where the output goes."""
    if args.scheme not in schemes():
        raise ConfigError(f"--scheme={args.scheme!r} is unknown; choose one of {schemes()}")
    given = {"group_size": args.group_size, "calib_path": args.calib_path, "calib_tokens": args.calib_tokens}
    spec = QuantSpec(args.scheme, **{k: v for k, v in given.items() if v is not None})  # the scheme refuses what it lacks
    if spec.build().searches_scales:  # AWQ reads its calibration text after the (slow) load: check it now
        if args.calib_path is None:
            raise ConfigError(f"--scheme={args.scheme} needs calibration text: add --calib-path <text file>")
        if not outputs.as_path(args.calib_path).is_file():
            raise ConfigError(f"--calib-path={args.calib_path!r} is not a file")
    if not outputs.as_path(args.checkpoint).exists():
        raise ConfigError(f"checkpoint {args.checkpoint!r} does not exist")
    outputs.refuse_own_input(args.checkpoint, args.out, "out")
    outputs.refuse_checkpoints_dir(args.out, "out")
    outputs.refuse_directory(args.out, "out")
    outputs.check_free(args.out, "--overwrite", args.overwrite)
    return spec


@cli.guarded
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = check_options(args)
        model, tokenizer, cfg = load_model(args.checkpoint, dtype="fp32", quantization=spec)
    except ConfigError as e:
        raise ConfigError(in_flag_names(str(e))) from None
    state = {"model": model.state_dict(), "config": to_dict(cfg), "quantization": spec.as_dict()}
    if tokenizer is not None:
        state["tokenizer"] = tokenizer_files(tokenizer)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    outputs.move_aside(args.out)
    out = save_checkpoint(Path(args.out), state)
    b = weight_bytes(model)
    print(f"wrote {out}: {spec.scheme}, weights {b['total'] / 2**20:.2f} MiB "
          f"({b['quantized'] / 2**20:.2f} MiB quantized, {b['full_precision'] / 2**20:.2f} MiB full precision)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
