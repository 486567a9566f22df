"""Load one rank's shard of a checkpoint reading only its slices (`load_shard`).

The model is built on the meta device and split there by `shard_model` (shapes and modules, no
memory); then each stored tensor the rank needs is read in the parts `shard_plan.selection` keeps:
from an HF directory with safetensors' `safe_open(...).get_slice` (bytes of other ranks' slices
are not read), from a moe-lab checkpoint file through its memory map (`torch.load(mmap=True)`:
only the pages of the slices are touched, then given back). The peak host memory of a rank is its
shard plus the slice being copied, not the whole model.

Stored tensors map onto ours through the same routes the full loaders use (an HF expert is
`gate_up_proj[e, :H]`; HF q, k, v are row ranges of our `qkv_proj`): `_copy_piece` intersects a
stored tensor's region of our full tensor with the rank's selection and reads only that.
A checkpoint that cannot be read in slices (a distributed checkpoint directory) is loaded whole,
then split (`shard_model` on real tensors), as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from moe.checkpoint import is_dcp_checkpoint, page_releaser, read_checkpoint, resolve_checkpoint
from moe.engine.parallel.comm import RankGroup
from moe.engine.parallel.layout import check_not_quantized, check_plain_modules
from moe.engine.parallel.shard import shard_model
from moe.engine.parallel.shard_plan import Selection, selection
from moe.errors import CheckpointError
from moe.hf.families import family
from moe.hf.io import checkpoint_dtype, load_tokenizer, read_hf_config
from moe.hf.layout import is_hf_dir
from moe.hf.tensor_map import load_route
from moe.loading import load_model, read_any_checkpoint, tokenizer_from_files
from moe.meta import meta_device
from moe.model import Transformer
from moe.quant import QuantSpec
from moe.routing.options import check_routing
from moe.variants import from_dict
from moe.weights import Placement, checkpoint_files, stored_tensor_names, zero_nonpersistent_buffers

# a stored tensor: (name, shape, dtype, read(index) -> the tensor's part at `index`, a tuple of slices)
Piece = tuple[str, tuple, torch.dtype, Callable[[tuple], torch.Tensor]]


class ShardSource:
    """A checkpoint opened for reading in slices: its model config, tokenizer, stored-name route
    and stored tensors. `bytes_read` counts what the pieces returned (tests check a rank reads
    only its share)."""

    def __init__(self, model_cfg, tokenizer, route, pieces: Callable[[], Iterator[Piece]],
                 quantized: Optional[str] = None, dtype: Optional[torch.dtype] = None):
        self.model_cfg, self.tokenizer, self.route, self._pieces = model_cfg, tokenizer, route, pieces
        self.quantized = quantized  # the scheme a checkpoint is stored quantized in (refused), or None
        self.dtype = dtype  # the dtype to load in when none is asked (an HF directory's), None: as stored
        self.bytes_read = 0
        self.reads: list[tuple[str, tuple]] = []  # (stored name, shape of what was read)

    def pieces(self) -> Iterator[Piece]:
        for name, shape, dtype, read in self._pieces():
            yield name, shape, dtype, self._counted(name, read)

    def _counted(self, name: str, read):
        def counted(index: tuple) -> torch.Tensor:
            t = read(index)
            self.bytes_read += t.numel() * t.element_size()
            self.reads.append((name, tuple(t.shape)))
            return t
        return counted


def open_source(path: Any) -> Optional[ShardSource]:
    """`path` opened for sliced reading, or None when its format cannot be read in slices."""
    if is_hf_dir(path):
        return _hf_source(Path(os.path.expanduser(str(path))))
    ckpt = resolve_checkpoint(path)
    return None if is_dcp_checkpoint(ckpt) else _file_source(ckpt)


def _file_source(ckpt: Path) -> ShardSource:

    state = read_checkpoint(ckpt)  # memory-mapped: nothing is read until sliced
    cfg = from_dict(state["config"])
    stored = QuantSpec.from_record(state.get("quantization"))
    tokenizer = tokenizer_from_files(state["tokenizer"]) if state.get("tokenizer") else None
    sd = state["model"]

    release = page_releaser(ckpt)

    def pieces():
        for name, t in sd.items():
            yield name, tuple(t.shape), t.dtype, (lambda index, t=t: t[index])
            release(t)  # the mapped pages this rank touched (its slices: rows of other ranks' too, at the edges)

    return ShardSource(cfg.model, tokenizer, lambda name: [Placement(name)], pieces,
                       quantized=stored.scheme if stored.enabled else None)


def _hf_source(p: Path) -> ShardSource:
    import dataclasses

    from safetensors import safe_open


    hf_config = read_hf_config(p)
    fam = family(hf_config.model_type)
    cfg = fam.model_config(hf_config, attention="sdpa", experts="sorted")
    files = checkpoint_files(p)
    mtp_depth = fam.stored_mtp_depth(hf_config, stored_tensor_names(files))
    if mtp_depth:
        cfg = dataclasses.replace(cfg, mtp_depth=mtp_depth)

    def pieces():
        for file in files:
            with safe_open(str(file), "pt") as f:  # closed (unmapped) before the next file
                for key in f.keys():
                    sl = f.get_slice(key)
                    yield key, tuple(sl.get_shape()), _ST_DTYPES[sl.get_dtype()], \
                        (lambda index, sl=sl: sl[index] if index else sl[:])

    return ShardSource(cfg, load_tokenizer(p), load_route(cfg, fam), pieces, dtype=checkpoint_dtype(hf_config, files))


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def model_config_of(path: Any):
    """The model config of a checkpoint (read from its header / config; no tensor is read)."""
    source = open_source(path)
    if source is None:
        return from_dict(read_any_checkpoint(resolve_checkpoint(path), model_only=True)["config"]).model, None
    return source.model_cfg, source.quantized


def load_shard(path: Any, group: RankGroup, expert_parallel: bool, device: Any, dtype: Optional[torch.dtype],
               routing: Optional[dict] = None, source: Optional[ShardSource] = None):
    """(this rank's shard of the model at `path`, its tokenizer); `source` (default: `open_source(path)`)."""
    source = source or open_source(path)
    if source is None:  # not readable in slices: whole, then split
        model, tokenizer, _ = load_model(path, device=device, dtype=dtype, routing=routing)
        check_plain_modules(model, group.size)
        shard_model(model, group, expert_parallel)
        return model, tokenizer
    check_not_quantized(source.quantized, group.size)
    dtype = dtype or source.dtype
    with meta_device():
        model = Transformer(source.model_cfg)
    full = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    shard_model(model, group, expert_parallel)  # on meta: the shard's modules and shapes
    fill_shard(model, source, full, group.rank, group.size, expert_parallel, dtype, torch.device(device))
    model.eval()
    if routing:
        model.set_routing(**check_routing(routing))
    return model, source.tokenizer


def fill_shard(model: torch.nn.Module, source: ShardSource, full: dict, r: int, T: int, expert_parallel: bool,
               dtype: Optional[torch.dtype], device: torch.device) -> None:
    """Give every parameter and buffer of the meta shard `model` its values, read in slices."""
    targets = model.state_dict(keep_vars=True)
    leader, first = {}, {}
    for name, t in targets.items():
        leader[name] = first.setdefault(id(t), name)  # tied names (embedding and LM head) share one tensor
    cfg = source.model_cfg
    sels = {n: selection(n, full[n], cfg, r, T, expert_parallel) for n in targets if leader[n] == n}
    filled, covered, problems = {}, {}, []
    for n, sel in sels.items():
        meta = targets[n]
        want = dtype if (dtype is not None and meta.is_floating_point()) else None
        filled[n] = (want, meta)  # allocated at the first stored piece (its dtype when `want` is None)
        covered[n] = 0
    for key, shape, stored_dtype, read in source.pieces():
        places = source.route(key)
        if places is None:
            continue
        for place in places:
            n = leader.get(place.target)
            if n is None or place.index == () and covered[n] >= _expected(targets[n], sels[n]) > 0:
                continue  # not on this rank (MTP layers), or a second whole copy (a tied LM head, MTP's copies)
            if isinstance(filled[n], tuple):
                want, meta = filled[n]
                filled[n] = torch.zeros(meta.shape, dtype=want or stored_dtype, device=device)
            if place.transform is not None:  # a stored layout of another family: whole, converted
                stored = place.transform(read(()))
                covered[n] += _copy_piece(filled[n], sels[n], place.index, stored.shape, lambda i: stored[i])
            else:
                covered[n] += _copy_piece(filled[n], sels[n], place.index, shape, read)
    for n, sel in sels.items():
        if sel.zero and isinstance(filled[n], tuple):
            want, meta = filled[n]
            filled[n] = torch.zeros(meta.shape, dtype=want or torch.float32, device=device)
        if covered[n] != _expected(targets[n], sel):
            problems.append(f"{n} ({covered[n]} of {_expected(targets[n], sel)} values)")
    if problems:
        raise CheckpointError("the stored weights do not fill this rank's shard: " + ", ".join(problems[:10]))
    _assign(model, targets, leader, filled)
    zero_nonpersistent_buffers(model, device)
    model.to(device)


def _expected(meta: torch.Tensor, sel: Selection) -> int:
    """The values of the shard read from the checkpoint (all but zero padding / zero tensors)."""
    if sel.zero:
        return 0
    if meta.dim() == 0:
        return 1
    return meta.numel() // sel.size * sel.kept


def _copy_piece(dst: torch.Tensor, sel: Selection, index: tuple, shape: tuple, read) -> int:
    """Copy the part of one stored tensor that this rank keeps into its shard `dst`; returns the
    values copied. The stored tensor fills `full[index]` of our full tensor (`index`: ints and
    slices, leading dims); the rank keeps `sel.ranges` of dim `sel.dim`, placed one after another."""
    if sel.zero:
        return 0
    if dst.dim() == 0:
        dst.copy_(read(()))
        return 1
    region, piece_dim = [], {}  # per full dim: (lo, hi, int-indexed?), and the stored dim of a kept one
    k = 0
    for j in range(dst.dim()):
        ix = index[j] if j < len(index) else slice(None)
        if isinstance(ix, int):
            region.append((ix, ix + 1, True))
            continue
        n = shape[k]
        lo = 0 if ix.start is None else ix.start
        region.append((lo, lo + n, False))
        piece_dim[j] = k
        k += 1
    d = sel.dim
    p0, p1, fixed = region[d]
    done, off = 0, 0
    for lo, hi in sel.ranges:
        a, b = max(lo, p0), min(hi, p1)
        if a < b:
            dst_ix, src_ix = [], [slice(None)] * len(shape)
            for j, (r0, r1, is_int) in enumerate(region):
                if j == d:
                    dst_ix.append(off + a - lo if is_int else slice(off + a - lo, off + b - lo))
                    if not is_int:
                        src_ix[piece_dim[j]] = slice(a - p0, b - p0)
                else:
                    dst_ix.append(r0 if is_int else slice(r0, r1))
            src = read(tuple(src_ix))
            view = dst[tuple(dst_ix)]
            if view.shape != src.shape:
                raise CheckpointError(f"stored tensor of shape {tuple(shape)} does not fit {tuple(view.shape)}")
            view.copy_(src)
            done += src.numel()
            del src
        off += hi - lo
    return done


def _assign(model: torch.nn.Module, targets: dict, leader: dict, filled: dict) -> None:
    """Put the filled tensors into the modules (Parameters stay Parameters; tied names one object)."""
    made: dict[str, torch.Tensor] = {}
    for name in targets:
        src = leader[name]
        if src not in made:
            t = filled[src]
            made[src] = torch.nn.Parameter(t, requires_grad=False) if isinstance(targets[src], torch.nn.Parameter) \
                else t
        mod_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(mod_name) if mod_name else model
        if leaf in module._parameters:
            module._parameters[leaf] = made[src]
        else:
            module._buffers[leaf] = made[src]
