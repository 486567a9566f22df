"""`python -m moe.engine.memory.plan <model> --devices N`: the per-rank budget of a tensor-parallel
engine, checked against the single-device plan of the same config (no weights, meta tensors);
MLA's latent KV cache whole on every rank, a GQA model's kv heads divided."""

import json

from moe.engine.memory.plan import main, plan_model, read_model_config
from moe.dtypes import resolve_dtype
from moe.engine.memory.plan_parallel import layout_error, rank_kv_bytes_per_block
from moe.engine.runner.context import PagedKVContext

MIXTRAL = "benchmarks/model_configs/mixtral-8x7b"


def test_devices_split_the_single_device_weights_and_find_the_smallest_n(capsys):
    assert main([MIXTRAL, "--device-memory", "80GB", "--devices", "2", "--max-model-len", "4096", "--json",
                 "--max-num-batched-tokens", "256"]) == 0
    report = json.loads(capsys.readouterr().out)
    cfg = read_model_config(MIXTRAL)
    single = plan_model(cfg, 80 * 10**9, resolve_dtype("bf16"), 256, 64, max_model_len=4096)
    for layout in ("tp", "ep"):
        r = report[layout]
        assert r["valid"] and r["fits"]
        # half the weights on each rank, plus the replicated norms and routers (well under 1%)
        assert 0.5 <= r["per_rank"]["weights"] / single.weights < 0.505
        assert r["smallest_devices"] == 2  # 93 GB of bf16 weights fit no 80 GB device alone
    assert "model.n_heads=32 is not divisible by tensor_parallel_size=3" in layout_error(cfg, 3, False)


DEEPSEEK_V3, QWEN3 = "benchmarks/model_configs/deepseek-v3", "benchmarks/model_configs/qwen3-235b-a22b"


def test_mla_latent_cache_is_whole_on_every_rank_and_kv_heads_are_divided():
    """The engine replicates MLA's latent row on every rank (moe/engine/parallel/shard.py): a rank's
    KV bytes per block equal the single device's for any N; a GQA model's are divided by N."""
    bf16 = resolve_dtype("bf16")
    mla, gqa = read_model_config(DEEPSEEK_V3), read_model_config(QWEN3)
    assert mla.attention_kind == "mla" and gqa.attention_kind != "mla"
    for cfg in (mla, gqa):
        one = PagedKVContext.model_bytes_per_block(cfg, 16, bf16)
        assert rank_kv_bytes_per_block(cfg, 1, 16, bf16) == one
        for n in (2, 4, 8, 16, 128) if cfg is mla else (2, 4):  # (a GQA layout needs n | n_kv_heads = 4)
            want = one if cfg is mla else one // n
            assert rank_kv_bytes_per_block(cfg, n, 16, bf16) == want, (cfg.attention_kind, n)
            assert rank_kv_bytes_per_block(cfg, n, 16, bf16, "fp8_e4m3") == (
                PagedKVContext.model_bytes_per_block(cfg, 16, bf16, "fp8_e4m3") if cfg is mla else
                PagedKVContext.bytes_per_block(cfg.n_layers, 16, cfg.n_kv_heads // n, cfg.resolved_head_dim, bf16,
                                               "fp8_e4m3"))
    # the latent row: kv_lora_rank + rope dims, one tensor (not K and V) per layer
    assert rank_kv_bytes_per_block(mla, 8, 16, bf16) == mla.n_layers * 16 * (mla.kv_lora_rank + mla.qk_rope_head_dim) * 2


def test_the_cli_plans_an_mla_model_with_its_replicated_latent(capsys):
    assert main([DEEPSEEK_V3, "--device-memory", "141GB", "--devices", "16", "--max-model-len", "8192", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cfg = read_model_config(DEEPSEEK_V3)
    per_token = rank_kv_bytes_per_block(cfg, 16, 16, resolve_dtype("bf16")) // 16
    for layout in ("tp", "ep"):
        r = report[layout]["per_rank"]
        assert r["kv_tokens"] == r["num_blocks"] * 16 and r["num_blocks"] == r["kv_cache"] // (16 * per_token)
