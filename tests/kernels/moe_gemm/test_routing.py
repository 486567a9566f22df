"""`kernels/moe_gemm/routing.py`: the sorted assignment order and the row-block -> expert map."""

import pytest
import torch

from kernels.moe_gemm import moe_routing
from kernels.moe_gemm.configs import INTERPRET_BLOCK_M
from tests.kernels.moe_gemm.cases import DEVICE, routing_case


@pytest.mark.parametrize("T,E,K,block_m,exact", [(1, 2, 1, 16, True), (37, 5, 3, 16, False), (50, 6, 4, 32, True),
                                                 (0, 3, 2, 16, False), (40, 4, 2, 64, False)])
def test_routing_blocks_cover_each_group_exactly_once(T, E, K, block_m, exact):
    experts, _ = routing_case(T, E, K)
    r = moe_routing(experts, E, block_m, exact_blocks=exact)
    N = T * K
    flat = experts.reshape(-1).cpu()
    assert torch.equal(r.sorted_assign.cpu().sort().values, torch.arange(N, dtype=torch.int32))  # a permutation
    assert torch.equal(flat[r.sorted_assign.long().cpu()], r.sorted_expert.long().cpu())
    assert bool((r.sorted_expert[1:] >= r.sorted_expert[:-1]).all())
    assert torch.equal(r.sorted_token.cpu(), r.sorted_assign.cpu() // K)
    offs = r.group_offs.tolist()
    assert offs[0] == 0 and offs[-1] == N and len(offs) == E + 2
    seen = torch.zeros(N, dtype=torch.int64)
    for g, s in zip(r.block_group.tolist(), r.block_start.tolist()):
        if g < 0:
            continue
        assert offs[g] <= s < offs[g + 1], "a block starts outside its group"
        seen[s:min(s + block_m, offs[g + 1])] += 1
    assert bool((seen == 1).all()), "every sorted position (dropped ones too) is in exactly one block"
    if not exact:
        assert r.max_blocks == -(-N // block_m) + E + 1


def test_routing_treats_any_out_of_range_id_as_dropped():
    experts = torch.tensor([[0, 3], [7, -1], [2, 1]], device=DEVICE)
    r = moe_routing(experts, 3, 16)
    assert r.group_offs.tolist() == [0, 1, 2, 3, 6]
    assert r.sorted_expert.tolist() == [0, 1, 2, 3, 3, 3]


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU defaults")
def test_routing_defaults_on_cpu_exact_block_map_and_interpreter_block():
    experts, _ = routing_case(37, 5, 3)
    r = moe_routing(experts, 5)
    assert r.block_m == INTERPRET_BLOCK_M and (r.n_tokens, r.top_k, r.n_experts, r.n_assign) == (37, 3, 5, 111)
    assert bool((r.block_group >= 0).all()), "on CPU the map holds only used blocks"
    assert r.max_blocks < -(-r.n_assign // r.block_m) + r.n_experts + 1


def test_routing_rejects_bad_inputs_with_clear_errors():
    experts, _ = routing_case(10, 3, 2)
    with pytest.raises(ValueError, match="power of two >= 16"):
        moe_routing(experts, 3, block_m=24)
    with pytest.raises(ValueError, match="int32 or int64"):
        moe_routing(experts.float(), 3)
    with pytest.raises(ValueError, match=r"experts_TK must be \[tokens, top_k\]"):
        moe_routing(experts.reshape(-1), 3)
    with pytest.raises(ValueError, match="n_experts must be >= 1"):
        moe_routing(experts, 0)
