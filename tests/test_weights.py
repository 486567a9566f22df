"""`moe/weights.py`: a meta-device model filled shard by shard from safetensors (placements,
dtypes, ties, every problem listed), sharded writing, and the peak memory of a real load."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from moe.errors import CheckpointError
from moe.weights import (INDEX_FILE, Placement, checkpoint_files, load_safetensors_into, save_safetensors,
                         stored_dtype)


class Tiny(nn.Module):
    """A fused [6, 4] projection, a tied embedding / head, a buffer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.fused = nn.Linear(4, 6, bias=False)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(3))


def stored(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(5, 4, generator=g), "a": torch.randn(2, 4, generator=g),
            "b": torch.randn(4, 4, generator=g), "s": torch.arange(3.0)}


def route(name):
    return {"emb": [Placement("embed.weight")], "a": [Placement("fused.weight", (slice(0, 2),))],
            "b": [Placement("fused.weight", (slice(2, 6),))], "s": [Placement("scale")],
            "head": [Placement("head.weight")], "rot": None}.get(name, [])


def test_sharded_load_places_converts_and_keeps_ties(tmp_path):
    tensors = stored()
    files = save_safetensors(tensors, tmp_path, max_shard_bytes=40)  # every tensor over the limit: one shard each
    assert len(files) == 4 and checkpoint_files(tmp_path) == files
    assert json.loads((tmp_path / INDEX_FILE).read_text())["metadata"]["total_size"] == 4 * (20 + 8 + 16 + 3)
    assert stored_dtype(files) == torch.float32
    with torch.device("meta"):
        model = Tiny()
    load_safetensors_into(model, files, route, dtype=torch.bfloat16)
    assert model.head.weight is model.embed.weight and isinstance(model.embed.weight, nn.Parameter)
    assert model.fused.weight.dtype == torch.bfloat16 and not model.fused.weight.is_meta
    assert torch.equal(model.fused.weight, torch.cat([tensors["a"], tensors["b"]]).to(torch.bfloat16))
    assert torch.equal(model.scale, torch.arange(3.0).to(torch.bfloat16))
    # A second copy of a tied tensor loads when equal (and is checked).
    save_safetensors({**tensors, "head": tensors["emb"].clone(), "rot": torch.zeros(2)}, tmp_path / "x")
    with torch.device("meta"):
        again = Tiny()
    load_safetensors_into(again, checkpoint_files(tmp_path / "x"), route)
    assert again.embed.weight.dtype == torch.float32 and torch.equal(again.head.weight, tensors["emb"])


def test_every_problem_is_listed(tmp_path):
    bad = {"emb": torch.zeros(5, 4), "a": torch.zeros(3, 4), "s": torch.zeros(3), "extra": torch.zeros(1),
           "head": torch.ones(5, 4)}
    save_safetensors(bad, tmp_path)
    with torch.device("meta"):
        model = Tiny()
    with pytest.raises(CheckpointError) as err:
        load_safetensors_into(model, checkpoint_files(tmp_path), route)
    msg = str(err.value)
    assert "missing (or partly missing) tensors (1): fused.weight" in msg
    assert "unexpected stored tensors (1): extra" in msg
    assert "shape mismatches (1): a: stored (3, 4) vs model fused.weight[:2] (2, 4)" in msg
    assert "conflicting copies (1): head differs" in msg or "conflicting copies (1): emb differs" in msg


def test_missing_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        checkpoint_files(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"found \['pytorch_model.bin'\]: only safetensors"):
        checkpoint_files(tmp_path)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="names shard"):
        checkpoint_files(tmp_path)


@pytest.mark.slow
def test_peak_memory_of_a_sharded_load_is_the_weights_plus_about_a_shard(tmp_path):
    """A ~200 MB bf16 Qwen3-MoE checkpoint in 25 MB shards, loaded by `load_model` in a fresh
    interpreter: peak RSS over the post-import baseline <= 1.3x the weights (the weights
    themselves, one mapped shard, one tensor in flight; never two copies of the model)."""
    from benchmarks.load import make_synthetic_checkpoint, measure, weights_bytes

    directory = make_synthetic_checkpoint(tmp_path / "ckpt", size_mb=200, shard_mb=25, random=False)
    assert len(checkpoint_files(directory)) >= 6
    size = weights_bytes(directory)
    result = measure("ours", directory, timeout=300)
    assert result["peak_reset"] and result["dtype"] == "bfloat16"
    assert size <= result["peak_rss_bytes"] <= 1.3 * size, (result["peak_rss_bytes"] / size, result)
