"""The planner's KV per layer group (moe.engine.memory.plan_groups): full layers at full length, window
layers at the blocks their window holds; the engine's own counting beside it (per-group tables in
blocks of the largest group's layer count; one table under tensor parallelism), checked against a
real engine; the fit, the exit code and the multi-device plan follow `--kv-groups`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from moe.config.schema import ModelConfig
from moe.engine.memory.kv_groups import engine_window
from moe.engine.memory.plan import groups_of, main, plan_model
from moe.engine.memory.plan_groups import kv_groups_plan
from moe.engine.memory.plan_parallel import model_bytes, parallel_report
from moe.errors import ConfigError
from tests.hf_fixtures import hf_config

BASE = dict(vocab_size=512, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=96,
            max_seq_len=32768)
LAYER_BLOCK = 2 * 16 * 2 * 16 * 2  # K and V x 16 tokens x 2 kv heads x head_dim 16 x bf16: one layer's block
HELD = math.ceil((128 - 1 + 512 + 15) / 16)  # a 128 window and a 512-token step: 41 blocks


def groups(cfg, accounting="engine", dtype=torch.bfloat16, kv_cache_dtype="auto"):
    plan = plan_model(cfg, 8 * 2**30, dtype, 512, 8, kv_cache_dtype=kv_cache_dtype)
    return plan, groups_of(cfg, plan, dtype, kv_cache_dtype, accounting)


def test_hybrid_counts_full_layers_at_full_length_and_window_layers_at_the_window():
    hybrid = ModelConfig(**BASE, sliding_window=128, layer_types=["sliding", "full"] * 2)
    _, g = groups(hybrid, "per-group")
    assert [(x.window, x.n_layers, x.blocks) for x in g.groups] == [(None, 2, 2048), (128, 2, HELD)]
    assert g.per_group_bytes == LAYER_BLOCK * (2 * 2048 + 2 * HELD)
    assert g.engine_bytes == g.per_group_bytes  # equal groups: the engine's layout pads nothing
    assert g.sequence_bytes == g.per_group_bytes
    all_full = LAYER_BLOCK * 4 * 2048  # the same model with every layer full
    assert g.per_group_bytes / all_full == pytest.approx(0.51, abs=0.005)  # about half at 32k
    assert groups(hybrid)[1].sequence_bytes == g.engine_bytes  # the default counts what the engine does


@pytest.mark.parametrize("window", [None, 128])
def test_one_group_models_count_the_same_either_way(window):
    _, g = groups(ModelConfig(**BASE, sliding_window=window), "per-group")
    blocks = 2048 if window is None else HELD
    assert g.per_group_bytes == g.engine_bytes == LAYER_BLOCK * 4 * blocks and not g.hybrid
    plan, _ = groups(ModelConfig(**BASE, sliding_window=window))
    assert g.engine_bytes == plan.blocks_per_sequence * plan.kv_bytes_per_block  # the plan's own counting


def test_fp8_kv_and_fp32_per_group_are_the_layers_share():
    hybrid = ModelConfig(**BASE, sliding_window=128, layer_types=["full", "sliding", "sliding", "sliding"])
    for dtype, kv in ((torch.float32, "auto"), (torch.bfloat16, "fp8_e4m3")):
        plan, g = groups(hybrid, "per-group", dtype, kv)
        per_layer = plan.kv_bytes_per_block // 4
        assert g.per_group_bytes == per_layer * (1 * 2048 + 3 * HELD)


def test_the_engine_counting_is_what_the_engine_holds():
    """A real engine serving a hybrid model of unequal groups (1 full : 2 window layers, so the
    layout pads the full group's blocks to 2 layer slots) holds, at its most, the bytes the
    default counting plans for one sequence of that length: each group's blocks x the layout's
    block bytes, the window group bounded by its window and the step."""
    from moe.engine import LLM, SamplingParams
    from moe.engine.runner.context import PagedKVContext
    from tests.engine.conftest import build_model

    window, bs, chunk, length = 8, 4, 6, 64
    model = build_model(260, n_layers=3, layer_types=["full", "sliding", "sliding"], sliding_window=window,
                        max_seq_len=128)
    llm = LLM.from_model(model, None, attention_backend="torch", block_size=bs, num_blocks=64,
                         max_num_batched_tokens=chunk, collect_routing_stats=False)
    assert llm.kv_layout.layers_per_block == 2
    rid = llm.add_request(list(range(5, 15)), SamplingParams(temperature=0, max_tokens=length - 10, ignore_eos=True))
    seq, most = llm.requests[rid], [0, 0]
    while llm.has_unfinished_requests():
        llm.step()
        if not seq.is_finished:
            most = [max(m, h) for m, h in zip(most, llm.block_manager.num_held_per_group(seq))]
    block = PagedKVContext.model_bytes_per_block(model.cfg, bs, torch.float32, layers_per_block=2)
    plan = kv_groups_plan(model.cfg, lambda n: PagedKVContext.model_bytes_per_block(
        model.cfg, bs, torch.float32, layers_per_block=n), bs, length, chunk)
    assert plan.engine_per_group and most[0] == plan.groups[0].blocks == length // bs
    # the plan bounds the window group from above by at most one block (a step's blocks at their worst alignment)
    assert plan.groups[1].blocks - 1 <= most[1] <= plan.groups[1].blocks
    assert sum(most) * block <= plan.engine_bytes <= (sum(most) + 1) * block
    assert plan.per_group_bytes < plan.engine_bytes  # per-group counts the full group's one layer, not 2 slots
    tp = kv_groups_plan(model.cfg, lambda n: n, bs, length, chunk, tensor_parallel=True)
    assert not tp.engine_per_group and tp.engine_bytes == 3 * (length // bs)  # one table, every layer, nothing freed


def test_an_unknown_counting_is_refused():
    with pytest.raises(ConfigError, match=r"--kv-groups='all' is unknown; choose one of \['engine', 'per-group'\]"):
        kv_groups_plan(ModelConfig(**BASE), lambda n: n, 16, 64, 64, "all")


def test_the_command_line_fits_per_group_where_the_engines_padded_layout_does_not(tmp_path, capsys):
    # GPT-OSS layout: layers sliding, full, sliding (window 4); 128 positions in blocks of 16, 64-token steps
    hf_config("gpt_oss-gqa-alternating").to_json_file(str(tmp_path / "config.json"))
    cfg_args = [str(tmp_path / "config.json"), "--dtype", "fp32", "--max-num-batched-tokens", "64",
                "--reserve", "0B", "--json"]
    assert main(cfg_args + ["--device-memory", "1GiB"]) == 0
    big = json.loads(capsys.readouterr().out)
    assert [(g["window"], g["layers"], g["blocks_per_sequence"]) for g in big["kv_groups"]] == \
        [(None, 1, 8), (4, 2, math.ceil((4 - 1 + 64 + 15) / 16))]
    # the engine's layout: both groups' blocks hold 2 layer slots (the full group uses one of them)
    assert big["kv_bytes_per_sequence_engine"] == 2 * (8 + 6) * big["kv_groups"][0]["bytes_per_block"]
    used = big["weights"] + big["activations"]
    between = used + (big["kv_bytes_per_sequence_per_group"] + big["kv_bytes_per_sequence_engine"]) // 2
    args = cfg_args + ["--device-memory", f"{between}B"]
    assert main(args) == 1 and json.loads(capsys.readouterr().out)["fits"] is False
    assert main(args + ["--kv-groups", "per-group"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is True and out["kv_accounting"] == "per-group" and 1 < out["sequences"] < 2
    assert main([a for a in args if a != "--json"]) == 1  # the text form says which counting the plan follows, and why
    text = capsys.readouterr().out
    assert "a smaller group's blocks are padded" in text and "DOES NOT FIT" in text
    assert "sliding window 4" in text and "(engine counting)" in text
    assert main([a for a in args if a != "--json"] + ["--kv-groups", "per-group"]) == 0
    kv_line = next(line for line in capsys.readouterr().out.splitlines() if "= KV cache" in line)
    assert kv_line.endswith("(sequences: by group, below)")  # not the engine counting's figure
    assert main(args + ["--kv-groups", "windows"]) == 2
    assert "--kv-groups='windows' is unknown" in capsys.readouterr().err


def test_devices_count_a_ranks_heads_per_group_and_the_smallest_n_follows_the_counting():
    cfg = ModelConfig(**BASE, sliding_window=128, layer_types=["sliding", "full"] * 2)
    opts = dict(block_size=16, max_num_batched_tokens=512, max_num_seqs=8, max_model_len=None, reserve=0,
                kv_cache_dtype="auto")
    sizes = model_bytes(cfg, torch.bfloat16, 512, 8)
    per_group = LAYER_BLOCK * (2 * 2048 + 2 * HELD)
    # a rank of 2 (its 1 kv head of 2) holding its weights and 1.5 per-group sequences: not one all-layers sequence
    memory = sizes.per_rank(cfg, 2) + sizes.activations + 3 * per_group // 4
    eng = parallel_report(cfg, 2, memory, torch.bfloat16, opts)
    grp = parallel_report(cfg, 2, memory, torch.bfloat16, dict(opts, kv_groups="per-group"))
    assert grp["tp"]["groups"].per_group_bytes == per_group // 2 == eng["tp"]["groups"].per_group_bytes
    assert grp["tp"]["fits"] and not eng["tp"]["fits"]
    # 2 kv heads: 1 and 2 devices are the only layouts; counted as the engine frees, neither serves it
    assert grp["tp"]["smallest_devices"] == 2 and eng["tp"]["smallest_devices"] is None
