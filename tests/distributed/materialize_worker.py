"""Worker of tests/distributed/test_materialize.py, run under torchrun (2 gloo processes).

For each layout it builds the model as the trainer does (`build_model`: rank 0 initialises, the
others build on meta) and lays it out with `parallelize`, watching every tensor allocated on this
rank while it does; then it writes, per rank, what a test needs to judge it:

    meta_after_build   every parameter and buffer was on the meta device after build_model (ranks > 0)
    largest_storage    the largest storage (bytes) of any non-meta tensor created during build + parallelize
    largest_full       the largest full parameter / buffer (bytes)
    local_bytes        bytes of this rank's parameters after parallelize (shards, slices, replicas)
    rng_equal          this rank's CPU RNG state after build_model equals one process's after init
    tied               the LM head is still the embedding's Parameter after parallelize
    weights            max |difference| between the model reassembled from the ranks and one process's
                       freshly initialised model, per tensor (gathered on rank 0)

    python -m torch.distributed.run --nproc_per_node=2 tests/distributed/materialize_worker.py out.json

The test suite runs it inside the shared launch of tests/distributed/dist_worker.py (a
`{"materialize": "out.json"}` job after the training jobs: `write_results` in the open group), so it
costs no torchrun start of its own; `main` runs it alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from moe.config import load_config  # noqa: E402
from moe.distributed import build_model, init_distributed, parallelize  # noqa: E402
from moe.model import Transformer  # noqa: E402
from moe.train.resume import seed_everything  # noqa: E402
from tests.distributed.dist_helpers import MODES, raw_cfg  # noqa: E402

# Larger than the parity runs' model so that a full tensor is far larger than anything else
# a rank allocates (64 x 512 embedding, experts 8 x 256 x 64); the embedding and LM head are tied
# (the parity runs' are not), so the tie must survive materialising on the meta ranks.
MODEL = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=8, expert_hidden=128, max_seq_len=64,
             vocab_size=512, tie_embeddings=True)


class LargestStorage(TorchDispatchMode):
    """The largest storage of any non-meta tensor an operator returns (views share their base's)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta and type(t) is torch.Tensor:
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def _gathered(model, par) -> dict:
    """The full tensors reassembled from the ranks (on every rank)."""
    from torch.distributed.tensor import DTensor
    held = {n for n, _ in par.expert_params}
    out = {}
    for name, t in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items():
        t = t.detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()
        elif name in held and par.dims.ep_size > 1:
            parts = [torch.empty_like(t) for _ in range(par.dims.ep_size)]
            dist.all_gather(parts, t.contiguous(), group=par.ep_group)
            t = torch.cat(parts)
        out[name] = t
    return out


def run(mode: str, tmp: Path) -> dict:
    raw = raw_cfg(tmp, distributed=MODES[mode])
    raw["model"] = MODEL
    cfg = load_config(raw)
    dims = init_distributed(cfg, torch.device("cpu"))
    seed_everything(cfg.seed)
    reference = Transformer(cfg.model)  # what one process initialises (same seed)
    reference_rng = torch.get_rng_state()
    seed_everything(cfg.seed)
    watch = LargestStorage()
    with watch:
        model = build_model(lambda: Transformer(cfg.model), dims)
        meta = all(t.is_meta for t in [*model.parameters(), *model.buffers()])
        rng_equal = torch.equal(torch.get_rng_state(), reference_rng)
        par = parallelize(model, dims, cfg)
    local_bytes = sum(p.to_local().nbytes if hasattr(p, "to_local") else p.nbytes for p in model.parameters())
    tied = model.lm_head.weight is model.embed.weight
    full = _gathered(model, par)
    ref = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    weights = {n: float((full[n].float() - ref[n].detach().float()).abs().max()) if full[n].numel() else 0.0
               for n in ref}
    assert sorted(full) == sorted(ref), (sorted(full), sorted(ref))
    largest_full = max(t.untyped_storage().nbytes() for t in ref.values())
    return {"meta_after_build": meta, "largest_storage": watch.largest, "largest_full": largest_full,
            "local_bytes": local_bytes, "full_bytes": sum(p.nbytes for p in reference.parameters()),
            "rng_equal": rng_equal, "weights": weights, "tied": tied}


def write_results(out: Path) -> None:
    """Every layout's checks on this rank, written to `<out stem>.rank<r>.json` (the group is open)."""
    results = {mode: run(mode, out.parent) for mode in ["ddp", "fsdp", "ep", "ep_fsdp"]}
    (out.parent / f"{out.stem}.rank{dist.get_rank()}.json").write_text(json.dumps(results))


def main() -> None:
    dist.init_process_group("gloo")
    write_results(Path(sys.argv[1]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
