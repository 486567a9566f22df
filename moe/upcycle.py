"""Sparse upcycling: a dense model -> an MoE whose experts start as copies of its FFN.

    python -m moe.upcycle <dense source> <out> --experts 8 --top-k 2 [--granularity G]
                          [--router topk|aux_free|...] [--noise 0.0] [--seed 0] [--overwrite]

The source is a run directory / checkpoint of this project whose layers are all dense, or an HF
Llama / Qwen2 / Qwen3 / Mistral directory (`moe/hf/dense.py`). Every dense FFN becomes an MoE
layer (Komatsuzaki et al., 2022): each expert a copy of the FFN; with granularity G (He et al.,
2024) each copy is cut into G slices of the intermediate dimension, so there are experts x G
experts of width intermediate / G and top-k x G of them are chosen per token. The router's rows
are random and shared by the G slices of a copy, so a token picks whole copies; the weights are
renormalised (softmax, then top-k, then divided by their sum), and the slices' down projections
are scaled by G so the picked slices add up to the FFN. With --noise 0 the upcycled model's
logits equal the dense model's; --noise s adds s x std(weight) Gaussian noise to each expert to
break the symmetry. Attention, norms and embeddings are copied unchanged.

The output is an ordinary run directory (`checkpoints/step_0000000.pt`, `config.json`,
`tokenizer/`) that `moe.load_model` reads and `train.init_from` starts from. An existing output is
refused unless --overwrite (which moves it aside); nothing is written when a check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from moe import cli, outputs
from moe.checkpoint import checkpoint_path, save_checkpoint, tokenizer_files
from moe.config import Config, ModelConfig, to_dict, validate_model
from moe.errors import ConfigError
from moe.hf.dense import dense_model_type, load_dense_hf
from moe.hf.io import load_tokenizer
from moe.loading import load_model
from moe.model import Transformer
from moe.routing.routers import ROUTERS, router_config


@dataclasses.dataclass(frozen=True)
class UpcycleSpec:
    experts: int
    top_k: int
    granularity: int = 1
    router: str = "topk"
    noise: float = 0.0
    seed: int = 0

    def check(self) -> None:
        for flag, value in (("--experts", self.experts), ("--top-k", self.top_k), ("--granularity", self.granularity)):
            if value < 1:
                raise ConfigError(f"{flag}={value} must be >= 1")
        if self.top_k > self.experts:
            raise ConfigError(f"--top-k={self.top_k} must be <= --experts={self.experts}")
        if not self.noise >= 0:
            raise ConfigError(f"--noise={self.noise} must be >= 0")
        ROUTERS.lookup(self.router)


def upcycled_config(dense: ModelConfig, spec: UpcycleSpec) -> ModelConfig:
    """The MoE config of dense config `dense`: every layer MoE, experts x G experts of width H / G."""
    moe_layers = [i for i in range(dense.n_layers) if dense.is_moe_layer(i)]
    if moe_layers:
        raise ConfigError(f"the source has MoE layers {moe_layers}; upcycling needs a dense model (every layer dense)")
    hidden = dense.dense_hidden or dense.expert_hidden * dense.router.top_k  # the dense FFN's width (model.Block)
    if hidden % spec.granularity:
        raise ConfigError(f"--granularity={spec.granularity} must divide the FFN's intermediate size {hidden}")
    router = router_config(spec.router, top_k=spec.top_k * spec.granularity, renormalize=True)
    cfg = dataclasses.replace(dense, n_dense_layers=0, dense_layers=[], dense_hidden=None,
                              n_experts=spec.experts * spec.granularity, expert_hidden=hidden // spec.granularity,
                              router=router)
    validate_model(cfg)
    return cfg


@torch.no_grad()
def upcycle(dense: Transformer, spec: UpcycleSpec) -> Transformer:
    """The upcycled MoE of `dense` (fp32, on the CPU); `dense` is left unchanged."""
    cfg = upcycled_config(dense.cfg, spec)
    gen = torch.Generator().manual_seed(spec.seed)
    moe = Transformer(cfg)  # attention, norms, embeddings are overwritten below; routers keep fresh buffers
    state = {k: v for k, v in dense.state_dict().items() if ".ffn." not in k}
    moe.load_state_dict(state, strict=False)
    G, h = spec.granularity, cfg.expert_hidden
    for block, dense_block in zip(moe.layers, dense.layers):
        ffn, experts = dense_block.ffn, block.ffn.experts
        gate_HD, up_HD, down_DH = ffn.gate_proj.weight.float(), ffn.up_proj.weight.float(), ffn.down_proj.weight.float()
        for e in range(cfg.n_experts):
            g = e % G  # expert e is slice g of copy e // G
            rows = slice(g * h, (g + 1) * h)
            experts.gate_up_proj[e, :h] = _noisy(gate_HD[rows], spec.noise, gen)
            experts.gate_up_proj[e, h:] = _noisy(up_HD[rows], spec.noise, gen)
            experts.down_proj[e] = _noisy(down_DH[:, rows], spec.noise, gen) * G
        router_CD = torch.randn(spec.experts, cfg.d_model, generator=gen) * cfg.init_std
        block.ffn.router.weight.copy_(router_CD.repeat_interleave(G, dim=0))  # a copy's slices score alike
    return moe.eval()


def _noisy(w: torch.Tensor, noise: float, gen: torch.Generator) -> torch.Tensor:
    if noise == 0:
        return w
    return w + noise * w.std() * torch.randn(w.shape, generator=gen)


def load_dense_source(source: Any) -> tuple[Transformer, Any, Config]:
    """(model, tokenizer, config) of a dense HF directory or a moe-lab checkpoint / run directory."""
    if dense_model_type(source) is not None:
        model = load_dense_hf(source)
        cfg = Config()
        cfg.model = model.cfg
        cfg.train.seq_len = min(cfg.train.seq_len, model.cfg.max_seq_len)
        return model, load_tokenizer(outputs.as_path(source)), cfg
    return load_model(source, dtype="fp32")


def write_run(out: Path, model: Transformer, tokenizer: Any, cfg: Config, provenance: dict) -> Path:
    """The run directory, built in a temporary sibling and renamed into place (nothing half-written)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        state = {"model": model.state_dict(), "config": to_dict(cfg), "step": 0, "upcycled_from": provenance}
        if tokenizer is not None:
            state["tokenizer"] = tokenizer_files(tokenizer)
            tokenizer.save(tmp / "tokenizer")
        save_checkpoint(checkpoint_path(tmp, 0), state)
        (tmp / "config.json").write_text(json.dumps({**to_dict(cfg), "upcycled_from": provenance}, indent=2))
        outputs.move_aside(out)
        if out.is_dir():  # an empty directory is left in place by move_aside
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moe.upcycle", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a dense moe-lab run directory / checkpoint, or an HF Llama/Qwen2/Qwen3/Mistral dir")
    p.add_argument("out", help="the run directory to write (a new path)")
    p.add_argument("--experts", type=int, required=True, help="copies of the FFN per layer")
    p.add_argument("--top-k", type=int, required=True, help="copies each token uses")
    p.add_argument("--granularity", type=int, default=1, help="slices of each copy (experts x G experts, top-k x G)")
    p.add_argument("--router", default="topk", help="router variant (a registered name: topk, aux_free, ...)")
    p.add_argument("--noise", type=float, default=0.0, help="Gaussian noise on the experts, x std(weight)")
    p.add_argument("--seed", type=int, default=0, help="seed of the router init and the noise")
    p.add_argument("--overwrite", action="store_true", help="move an existing output aside to <out>.old-<time>")
    return p


@cli.guarded
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    spec = UpcycleSpec(args.experts, args.top_k, args.granularity, args.router, args.noise, args.seed)
    spec.check()
    if not outputs.as_path(args.source).exists():
        raise ConfigError(f"source {args.source!r} does not exist")
    outputs.refuse_own_input(args.source, args.out, "out")
    outputs.refuse_checkpoints_dir(args.out, "out")
    outputs.check_free(args.out, "--overwrite", args.overwrite)
    dense, tokenizer, cfg = load_dense_source(args.source)
    model = upcycle(dense, spec)
    cfg.model = model.cfg
    provenance = {"source": str(outputs.as_path(args.source).resolve()), **dataclasses.asdict(spec)}
    out = write_run(outputs.as_path(args.out), model, tokenizer, cfg, provenance)
    print(f"wrote {out}: {model.cfg.n_layers} MoE layers of {model.cfg.n_experts} experts (top-{model.cfg.router.top_k}"
          f"), {model.num_params() / 1e6:.2f}M parameters, {model.num_params(active=True) / 1e6:.2f}M active")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
