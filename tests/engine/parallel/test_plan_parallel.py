"""`python -m moe.engine.memory.plan <model> --devices N`: the per-rank budget of a tensor-parallel
engine, checked against the single-device plan of the same config (no weights, meta tensors)."""

import json

from moe.engine.memory.plan import main, plan_model, read_model_config
from moe.dtypes import resolve_dtype
from moe.engine.memory.plan_parallel import layout_error

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
