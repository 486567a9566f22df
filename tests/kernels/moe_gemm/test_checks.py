"""`kernels/moe_gemm/checks.py`: the launchers reject bad inputs with errors naming the launcher
and the argument, before anything is launched."""

import pytest
import torch

from kernels.moe_gemm import grouped_gemm, moe_routing, swiglu_down_backward
from kernels.moe_gemm.checks import check_tiles
from tests.kernels.moe_gemm.cases import rand, routing_case


def test_launchers_reject_bad_inputs_with_clear_errors():
    experts, weights = routing_case(10, 3, 2)
    r = moe_routing(experts, 3, 16)
    x, w = rand(10, 8), rand(3, 6, 8)
    with pytest.raises(ValueError, match=r"x must be \[10, \*\]"):
        grouped_gemm(rand(11, 8), w, r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="w expects 6"):
        grouped_gemm(x, w, r, x_grouped=False, y_grouped=True, trans_w=False)
    with pytest.raises(ValueError, match="dtype torch.bfloat16 != activation dtype torch.float32"):
        grouped_gemm(x, w.bfloat16(), r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="is not one of"):
        grouped_gemm(x.double(), w.double(), r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="unit stride"):
        grouped_gemm(rand(8, 10).t(), w, r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="must be contiguous"):
        grouped_gemm(x, rand(3, 8, 6).transpose(1, 2), r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="n_experts=3"):
        grouped_gemm(x, rand(4, 6, 8), r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="fp32"):
        grouped_gemm(x, w, r, x_grouped=False, y_grouped=True, scale=weights.reshape(-1).double())
    with pytest.raises(ValueError, match="is on meta but the routing on"):
        grouped_gemm(torch.empty(10, 8, device="meta"), w, r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="power of two >= 16"):
        grouped_gemm(x, w, r, x_grouped=False, y_grouped=True, tiles=dict(BLOCK_N=8, BLOCK_K=16))
    with pytest.raises(ValueError, match="gu dtype"):
        swiglu_down_backward(x, rand(3, 8, 4), rand(20, 8).bfloat16(), torch.zeros(20), r)


def test_check_tiles_accepts_none_and_powers_of_two_and_names_a_missing_tile():
    check_tiles(None, ["BLOCK_N"])
    check_tiles(dict(BLOCK_N=16, BLOCK_K=128), ["BLOCK_N", "BLOCK_K"])
    with pytest.raises(ValueError, match="tile BLOCK_K=None"):
        check_tiles(dict(BLOCK_N=16), ["BLOCK_N", "BLOCK_K"])
