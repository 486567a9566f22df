"""Sharded reading (moe/engine/parallel/shard_load.py), in this process (no rank is spawned: a
rank's shard is built with an unconnected RankGroup): every rank's tensors read in slices equal
`shard_model` applied to the whole loaded model, for a moe-lab checkpoint file and HF directories,
TP and EP experts; and a rank reads about its share of the bytes, never a whole tensor that is
split across ranks."""

from __future__ import annotations

import pytest
import torch

from moe.checkpoint import save_checkpoint
from moe.config import Config, to_dict
from moe.engine.parallel.comm import RankGroup
from moe.engine.parallel.layout import check_layout
from moe.engine.parallel.shard import shard_model
from moe.engine.parallel.shard_load import load_shard, open_source
from moe.errors import ConfigError
from moe.loading import load_model
from tests.engine.conftest import build_model
from tests.engine.parallel.conftest import VOCAB

CPU = torch.device("cpu")
SPLIT = ("qkv_proj", "o_proj.weight", "gate_proj", "up_proj", "down_proj", "experts.", "embed", "lm_head")


def reference_shard(path, rank: int, T: int, ep: bool, dtype=None) -> dict:
    model, _, _ = load_model(path, dtype=dtype)
    shard_model(model, RankGroup(rank, T, CPU), ep)
    return model.state_dict()


def assert_equal_shards(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].shape == t.shape and got[name].dtype == t.dtype, name
        assert torch.equal(got[name], t), name


@pytest.mark.parametrize("ep", [False, True], ids=["tp-experts", "ep-experts"])
def test_each_rank_reads_exactly_its_slices_of_a_checkpoint_file(checkpoint, ep):
    full_bytes = sum(t.numel() * t.element_size() for t in load_model(checkpoint)[0].state_dict().values())
    total = 0
    for rank in (0, 1):
        source = open_source(checkpoint)
        model, tok = load_shard(checkpoint, RankGroup(rank, 2, CPU), ep, CPU, None, source=source)
        assert_equal_shards(model.state_dict(), reference_shard(checkpoint, rank, 2, ep))
        assert not any(p.requires_grad for p in model.parameters())
        # each rank reads about half: the replicated norms and routers are read by both
        assert 0.4 * full_bytes < source.bytes_read < 0.6 * full_bytes, (source.bytes_read, full_bytes)
        total += source.bytes_read
        state = torch.load(checkpoint, mmap=True, weights_only=True)["model"]
        for name, shape in source.reads:
            if any(s in name for s in SPLIT):  # a split tensor is never read whole
                assert torch.Size(shape).numel() < state[name].numel(), (name, shape)
            if ep and "experts." in name:  # rank r reads only its own experts
                assert shape[0] == state[name].shape[0] // 2, (name, shape)
    assert total < 1.1 * full_bytes


def test_an_mla_model_splits_by_heads_and_replicates_the_latent(tmp_path):
    from tests.engine.feature_matrix import MLA
    model = build_model(VOCAB, **MLA)
    assert model.cfg.q_lora_rank is not None  # (q_a_proj replicated, q_b_proj split)
    path = str(save_checkpoint(tmp_path / "step_0000001.pt",
                               {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg))}))
    for rank in (0, 1):
        source = open_source(path)
        shard, _ = load_shard(path, RankGroup(rank, 2, CPU), False, CPU, None, source=source)
        assert_equal_shards(shard.state_dict(), reference_shard(path, rank, 2, False))
        attn, full = shard.layers[0].attn, model.layers[0].attn
        assert attn.n_heads == full.n_heads // 2 and torch.equal(attn.kv_a_proj.weight, full.kv_a_proj.weight)
        assert torch.equal(attn.kv_b_proj.weight, full.kv_b_proj.weight.chunk(2)[rank])
        reads = dict(source.reads)
        assert reads["layers.0.attn.kv_a_proj.weight"] == tuple(full.kv_a_proj.weight.shape)  # the latent: whole
        assert reads["layers.0.attn.q_b_proj.weight"][0] * 2 == full.q_b_proj.weight.shape[0]


def test_a_cast_and_a_tied_head(tmp_path):
    model = build_model(VOCAB, tie_embeddings=True)
    path = str(save_checkpoint(tmp_path / "step_0000001.pt",
                               {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg))}))
    for rank in (0, 1):
        shard, _ = load_shard(path, RankGroup(rank, 2, CPU), False, CPU, torch.bfloat16)
        assert_equal_shards(shard.state_dict(), reference_shard(path, rank, 2, False, torch.bfloat16))
        assert shard.lm_head.weight is shard.embed.weight  # still one tensor


@pytest.fixture(scope="module")
def hf_exports(tmp_path_factory, bpe_tokenizer):
    """HF directories (hub layout: one tensor per expert and projection, q/k/v apart) written by
    `export_hf` in ~30 KB shards, so tensors of one layer span files: qwen2_moe with a dense layer,
    gated shared experts and q/k/v biases; mixtral with a tied LM head."""
    from moe.hf.commands import export_hf
    from tests.hf_fixtures import family_checkpoint

    root = tmp_path_factory.mktemp("hf-tp")
    kinds = {"qwen2_moe": dict(n_shared_experts=1, shared_expert_gate=True, qkv_bias=True, n_dense_layers=1),
             "mixtral": dict(tie_embeddings=True)}
    return {fam: export_hf(family_checkpoint(root / fam, bpe_tokenizer, **kw), root / f"{fam}-hf", model_type=fam,
                           max_shard_size="30KB") for fam, kw in kinds.items()}


@pytest.mark.parametrize("fam, ep", [("qwen2_moe", True), ("qwen2_moe", False), ("mixtral", False)])
def test_hf_directories_load_in_slices(hf_exports, fam, ep):
    directory = hf_exports[fam]
    stored = dict(stored_shapes(directory))
    n_experts = open_source(directory).model_cfg.n_experts
    for rank in (0, 1):
        source = open_source(directory)
        model, tok = load_shard(directory, RankGroup(rank, 2, CPU), ep, CPU, None, source=source)
        assert_equal_shards(model.state_dict(), reference_shard(directory, rank, 2, ep))
        assert tok is not None
        unique = {id(t): t for t in model.state_dict(keep_vars=True).values()}.values()  # (a tied head once)
        assert source.bytes_read == sum(t.numel() * t.element_size() for t in unique)  # exactly the shard, no more
        for name, shape in source.reads:
            if ".experts." in name and ep:  # an HF expert is a tensor of its own: read whole, only by its rank
                assert int(name.split(".experts.")[1].split(".")[0]) // (n_experts // 2) == rank, name
            elif any(k in name for k in ("_proj", "embed_tokens", "w1", "w2", "w3")) and "shared_expert_gate" not in name:
                assert torch.Size(shape).numel() * 2 == torch.Size(stored[name]).numel(), (name, shape)


def stored_shapes(directory):
    from safetensors import safe_open
    from moe.weights import checkpoint_files
    for f in checkpoint_files(directory):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                yield k, tuple(h.get_slice(k).get_shape())


def test_a_quantized_checkpoint_is_refused_naming_both(tmp_path):
    from moe.engine.parallel.launch import start_ranks
    from moe.engine.config import EngineConfig
    from moe.loading import quantize_loaded
    model = quantize_loaded(build_model(VOCAB), None, "int8")
    path = tmp_path / "step_0000001.pt"
    save_checkpoint(path, {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg)),
                           "quantization": model.quant_spec.as_dict()})
    with pytest.raises(ConfigError) as e:
        start_ranks(str(path), EngineConfig(tensor_parallel_size=2, device="cpu"), CPU, None, None)
    assert "quantized weights" in str(e.value) and "tensor_parallel_size=2" in str(e.value), e.value
