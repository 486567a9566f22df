"""Model weights in safetensors files: read shard by shard into a model built on the meta
device, and written out in shards. Knows no model and no checkpoint family: the caller says,
with a `route`, where each stored tensor goes.

Reading (`load_safetensors_into`): the model is built with `torch.device("meta")` (no random
init, no memory); each target tensor is allocated once, at its final dtype and device, when the
first stored piece of it arrives, and every stored tensor is copied straight into its place
(a whole tensor, or a slice: q/k/v rows of a fused qkv projection, one expert of a stacked
expert tensor). Shards are opened one at a time (`safetensors.safe_open` maps the file; the
pages it touched stay in the process's resident set until the file is closed), so the peak
memory is the model plus about one shard, never two copies of the model. Everything missing,
unexpected, misshapen or written twice is reported together as one CheckpointError.

Writing (`save_safetensors`): greedy shards of at most `max_shard_bytes` named and indexed as
transformers names them (`model.safetensors`, or `model-00001-of-0000N.safetensors` plus
`model.safetensors.index.json`). Partial views (one expert of a stacked tensor, the q rows of
qkv: `safetensors` refuses views sharing a storage) are copied out one shard at a time and freed
before the next; whole tensors are written as they are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from moe.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_STORED_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


@dataclass(frozen=True)
class Placement:
    """Where one stored tensor goes: the model tensor `target` (a `state_dict` name), at
    `index` inside it (`()` = the whole tensor; e.g. `(slice(0, 64),)` = its first 64 rows,
    `(3, slice(0, 16))` = the first 16 rows of expert 3 of a stacked tensor). `transform`, when
    set, turns the stored tensor into the model's layout first (a transpose, a de-interleave)."""

    target: str
    index: tuple = ()
    transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None


# stored name -> its placements; an empty sequence = the model has no use for it (an unexpected
# key, reported); None = deliberately skipped (a tensor the model rebuilds, e.g. rotary tables)
Route = Callable[[str], Optional[Sequence[Placement]]]


def checkpoint_files(path: Any) -> list[Path]:
    """The safetensors files of a model directory: the shards its index names, in name order (or the one file)."""
    p = Path(os.path.expanduser(str(path)))
    index = p / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{str(index)!r} is not a safetensors index (no weight_map): {e}") from None
        files = [p / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{str(index)!r} names shard(s) that are not there: {absent}")
        return files
    if (p / SINGLE_FILE).is_file():
        return [p / SINGLE_FILE]
    others = sorted(f.name for f in p.glob("*.bin")) + sorted(f.name for f in p.glob("*.pt"))
    hint = f" (found {others}: only safetensors weights are read; convert them with transformers' " \
           "save_pretrained(safe_serialization=True))" if others else ""
    raise CheckpointError(f"{str(p)!r} has no {SINGLE_FILE} or {INDEX_FILE}{hint}")


def stored_dtype(files: Sequence[Path]) -> Optional[torch.dtype]:
    """The dtype of the first floating-point tensor stored (read from the header only)."""
    for file in files:
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                dtype = _STORED_DTYPES.get(f.get_slice(key).get_dtype())
                if dtype is not None:
                    return dtype
    return None


def load_safetensors_into(model: torch.nn.Module, files: Iterable[Path], route: Route, *,
                          dtype: Optional[torch.dtype] = None, device: Any = "cpu") -> torch.nn.Module:
    """Fill `model` (built on the meta device) from safetensors `files`, shard by shard.

    Floating-point tensors are allocated in `dtype` (None: each stored tensor's dtype) on
    `device`; tied parameters (one Parameter under several names) stay one Parameter. A stored
    tensor that fills a tensor already filled must equal what is there (a tied copy). Returns
    `model`; raises CheckpointError listing every missing, unexpected, misshapen or
    conflicting tensor. Non-persistent state the model builds itself (rotary tables) follows
    `device` through `model.to(device)` at the end."""
    return load_tensors_into(model, safetensors_pieces(files), route, dtype=dtype, device=device)


def stored_tensor_names(files: Iterable[Path]) -> set[str]:
    """The names of the tensors in `files` (their headers only: no tensor is read)."""
    names: set[str] = set()
    for file in files:
        with safe_open(str(file), "pt") as f:
            names.update(f.keys())
    return names


def safetensors_pieces(files: Iterable[Path]) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """(stored name, a function reading it) of every tensor of `files`, shard by shard; a reader
    is valid only until the generator moves to the next shard."""
    for file in files:
        with safe_open(str(file), "pt") as f:  # closed (unmapped) before the next shard
            for key in f.keys():
                yield key, (lambda f=f, key=key: f.get_tensor(key))


def load_tensors_into(model: torch.nn.Module, pieces: Iterable[tuple[str, Callable[[], torch.Tensor]]],
                      route: Route, *, dtype: Optional[torch.dtype] = None, device: Any = "cpu") -> torch.nn.Module:
    """`load_safetensors_into` for any source: `pieces` yields (stored name, a function that
    reads the tensor), called only for names the route places (e.g. an HF model's `state_dict`
    in memory, `moe.hf.convert.from_hf_model`)."""
    device = torch.device(device)
    targets = model.state_dict(keep_vars=True)
    leader: dict[str, str] = {}  # name -> the first name of its tensor (tied names share one)
    first_name: dict[int, str] = {}
    for name, t in targets.items():
        leader[name] = first_name.setdefault(id(t), name)
    filled: dict[str, torch.Tensor] = {}
    covered: dict[str, int] = {}
    unexpected, mismatched, conflicts = [], [], []
    for key, read in pieces:
        places = route(key)
        if places is None:
            continue
        if not places:
            unexpected.append(key)
            continue
        stored = read()
        for place in places:
            src = stored if place.transform is None else place.transform(stored)
            if place.target not in targets:
                unexpected.append(f"{key} (-> {place.target})")
                continue
            name = leader[place.target]
            meta = targets[name]
            if name not in filled:
                want = dtype if (dtype is not None and meta.is_floating_point()) else src.dtype
                filled[name], covered[name] = torch.empty(meta.shape, dtype=want, device=device), 0
            view = filled[name][place.index]
            if view.shape != src.shape:
                mismatched.append(f"{key}: stored {tuple(src.shape)} vs model {place.target}"
                                  f"{_fmt_index(place.index)} {tuple(view.shape)}")
            elif covered[name] >= meta.numel() and place.index == ():
                if not torch.equal(view, src.to(view.device, view.dtype)):  # a second copy of a tied tensor
                    conflicts.append(f"{key} differs from the tensor already loaded into {place.target}")
            else:
                view.copy_(src)
                covered[name] += src.numel()
            del src
        del stored
    expected = {leader[n] for n in targets}
    missing = sorted(n for n in expected if covered.get(n, 0) < targets[n].numel())
    overfull = sorted(n for n in expected if covered.get(n, 0) > targets[n].numel())
    problems = [(title, items) for title, items in (
        ("missing (or partly missing) tensors", missing), ("unexpected stored tensors", sorted(unexpected)),
        ("shape mismatches", mismatched), ("written more than once", overfull), ("conflicting copies", conflicts))
        if items]
    if problems:
        raise CheckpointError("the stored weights do not fit the model:\n  " + "\n  ".join(
            f"{title} ({len(items)}): " + ", ".join(items[:20]) + (" ..." if len(items) > 20 else "")
            for title, items in problems))
    zero_nonpersistent_buffers(model, device)  # run-time counters no checkpoint holds (aux_free's load_counts)
    _assign(model, targets, leader, filled)
    return model.to(device)


def _assign(model: torch.nn.Module, targets: dict, leader: dict, filled: dict) -> None:
    """Put the filled tensors in place of the meta ones (one Parameter per tied group)."""
    params: dict[str, torch.nn.Parameter] = {}
    for name, meta in targets.items():
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        tensor = filled[leader[name]]
        if isinstance(meta, torch.nn.Parameter):
            if leader[name] not in params:
                params[leader[name]] = torch.nn.Parameter(tensor, requires_grad=meta.requires_grad)
            setattr(module, attr, params[leader[name]])
        else:
            module._buffers[attr] = tensor
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise CheckpointError(f"tensors the checkpoint does not hold and the model does not build: {left}")


def zero_nonpersistent_buffers(model: torch.nn.Module, device: Any = "cpu") -> None:
    """Materialise the non-persistent buffers a meta-device build left on meta (no checkpoint holds
    them) as zeros on `device`. In this codebase they are run-time counters that start at zero
    (aux_free's `load_counts`); state that must survive a save is persistent and loaded."""
    for module in model.modules():
        for name in module._non_persistent_buffers_set:
            b = module._buffers.get(name)
            if b is not None and b.is_meta:
                module._buffers[name] = torch.zeros(b.shape, dtype=b.dtype, device=device)


def _fmt_index(index: tuple) -> str:
    if not index:
        return ""
    parts = [f"{s.start or ''}:{s.stop or ''}" if isinstance(s, slice) else str(s) for s in index]
    return "[" + ", ".join(parts) + "]"


def _own_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` if it is a whole, contiguous tensor; else a copy (safetensors refuses views that
    share a storage, such as the experts of one stacked tensor)."""
    whole = t.is_contiguous() and t.storage_offset() == 0 and \
        t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.contiguous().clone()


def save_safetensors(tensors: dict[str, torch.Tensor], out_dir: Any, max_shard_bytes: int = 5 * 2**30,
                     metadata: Optional[dict[str, str]] = None) -> list[Path]:
    """Write `tensors` (name -> tensor, in the order given) as transformers does: one
    `model.safetensors`, or shards of at most `max_shard_bytes` (a tensor larger than that gets
    a shard of its own) with `model.safetensors.index.json`. Returns the files written.

    Written here rather than with huggingface_hub's `split_torch_state_dict_into_shards`:
    that splitter puts tensors sharing a storage in one shard and counts only the first, so
    per-expert views of one stacked expert tensor would make shards far over the limit."""
    out = Path(os.path.expanduser(str(out_dir)))
    out.mkdir(parents=True, exist_ok=True)
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    n = len(shards)
    names = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for stale in [out / SINGLE_FILE, out / INDEX_FILE, *out.glob("model-*-of-*.safetensors")]:
        if stale.is_file():  # a previous export's shards would otherwise linger next to these
            stale.unlink()
    meta = {"format": "pt", **(metadata or {})}
    for filename, keys in zip(names, shards):
        shard = {k: _own_copy(tensors[k].detach().to("cpu")) for k in keys}
        save_file(shard, str(out / filename), metadata=meta)
        del shard
    if n > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map = {k: filename for filename, keys in zip(names, shards) for k in keys}
        (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                 indent=2, sort_keys=True) + "\n")
    return [out / f for f in names]
