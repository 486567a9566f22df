"""Impossible layouts are clear errors, the global batch splits as documented, and the
Hydra group composes. No processes are started here."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moe.config import load_config
from moe.errors import ConfigError
from moe.distributed import init_distributed, local_layout, parallelize
from moe.distributed.setup import check_layout
from tests.conftest import REPO
from tests.distributed.dist_helpers import raw_cfg


def test_experts_must_divide_over_ep_ranks(tmp_path):
    with pytest.raises(ConfigError, match=r"model.n_experts=4 must be divisible by distributed.ep_size=3"):
        load_config(raw_cfg(tmp_path, distributed=dict(name="ep", ep_size=3)))
    with pytest.raises(ConfigError, match="apply to distributed=ep only"):
        load_config(raw_cfg(tmp_path, distributed=dict(name="ddp", ep_size=2)))
    with pytest.raises(ConfigError, match="distributed.name='zero' is not allowed"):
        load_config(raw_cfg(tmp_path, distributed=dict(name="zero")))


def test_world_size_must_fit_the_layout(tmp_path):
    cfg = load_config(raw_cfg(tmp_path, distributed=dict(name="ep", ep_size=2)))
    check_layout(cfg, 4)
    with pytest.raises(ConfigError, match="world size 3 must be divisible by distributed.ep_size=2"):
        check_layout(cfg, 3)
    cfg = load_config(raw_cfg(tmp_path, distributed=dict(name="ddp")))
    with pytest.raises(ConfigError, match=r"train.batch_size=4 is the global batch and must be divisible by the "
                                          r"data-parallel world size 8"):
        check_layout(cfg, 8)


def test_global_batch_split_and_accumulation():
    # (batch_size, grad_accum, ranks) -> (sequences per rank, micro-batches per rank)
    assert local_layout(16, 1, 1) == (16, 1)
    assert local_layout(16, 4, 1) == (16, 4)
    assert local_layout(16, 1, 4) == (4, 1)
    assert local_layout(16, 4, 2) == (8, 2)  # micro-batch of 4 sequences either way
    assert local_layout(16, 2, 4) == (4, 1)
    with pytest.raises(ConfigError, match="3 sequences per rank, not divisible into 2 micro-batches"):
        local_layout(6, 3, 2)  # fine on one process (3 micro-batches of 2), not on 2 ranks


def test_distributed_none_under_torchrun_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = load_config(raw_cfg(tmp_path))
    with pytest.raises(ConfigError, match="WORLD_SIZE=2 .* but distributed=none"):
        init_distributed(cfg, torch.device("cpu"))


def test_none_layout_is_the_single_process_behaviour(tmp_path):
    cfg = load_config(raw_cfg(tmp_path))
    dims = init_distributed(cfg, torch.device("cpu"))
    assert not dims.enabled and dims.is_main and (dims.local_batch, dims.local_accum) == (4, 1)
    assert dims.mean(1.5) == 1.5 and dims.mean(1.0, 2.0) == (1.0, 2.0)
    assert dims.shard([1, 2, 3]) == [1, 2, 3] and dims.on_main(lambda a: a + 1, 1) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        dims.rank = 1  # a description of the layout, never written into
    model = torch.nn.Linear(2, 2)
    par = parallelize(model, dims, cfg)
    assert par.module is model and par.ddp is None and par.fsdp_root is None and not par.expert_params


def test_hydra_group_composes():
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        assert load_config(compose("config")).distributed.name == "none"
        cfg = load_config(compose("config", overrides=["distributed=ep", "distributed.ep_size=4"]))
        assert (cfg.distributed.name, cfg.distributed.ep_size, cfg.distributed.fsdp) == ("ep", 4, False)
        assert load_config(compose("config", overrides=["distributed=fsdp"])).distributed.name == "fsdp"
