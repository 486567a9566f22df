"""Quantize a checkpoint and write it as a quantized checkpoint.

    python -m moe.quantize runs/x/checkpoints/step_0000300.pt out/int4.pt --scheme int4 --group-size 128
    python -m moe.quantize runs/x out/awq.pt --scheme awq --calib-path calib.txt --calib-tokens 4096

The output is the single-file checkpoint format (`moe/checkpoint.py`) plus a `quantization` key
(the scheme and its settings); its `model` state holds each quantized module's codes, scales and
zero points (docs/quantization.md). `moe.load_model`, `LLM`, `python -m moe.serve`,
`python -m moe.generate` and `python -m eval` load it quantized with no further option.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from moe import cli
from moe.checkpoint import save_checkpoint, tokenizer_files
from moe.config import to_dict
from moe.errors import ConfigError
from moe.loading import load_model
from moe.quant import QuantSpec, allowed_schemes, weight_bytes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moe.quantize", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a full-precision checkpoint file, run directory or HF directory")
    p.add_argument("out", help="the quantized checkpoint file to write")
    p.add_argument("--scheme", required=True, help=f"one of {allowed_schemes()[1:]}")
    p.add_argument("--group-size", type=int, help="int4/awq: inputs per scale and zero point (default 128)")
    p.add_argument("--calib-path", help="awq: calibration text file")
    p.add_argument("--calib-tokens", type=int, help="awq: calibration tokens (default 4096)")
    return p


@cli.guarded
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    given = {"group_size": args.group_size, "calib_path": args.calib_path, "calib_tokens": args.calib_tokens}
    spec = QuantSpec(args.scheme, **{k: v for k, v in given.items() if v is not None})  # the scheme refuses what it lacks
    if not spec.enabled:
        raise ConfigError(f"--scheme={args.scheme!r}: choose one of {allowed_schemes()[1:]}")
    model, tokenizer, cfg = load_model(args.checkpoint, dtype="fp32", quantization=spec)
    state = {"model": model.state_dict(), "config": to_dict(cfg), "quantization": spec.as_dict()}
    if tokenizer is not None:
        state["tokenizer"] = tokenizer_files(tokenizer)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    out = save_checkpoint(Path(args.out), state)
    b = weight_bytes(model)
    print(f"wrote {out}: {spec.scheme}, weights {b['total'] / 2**20:.2f} MiB "
          f"({b['quantized'] / 2**20:.2f} MiB quantized, {b['full_precision'] / 2**20:.2f} MiB full precision)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
