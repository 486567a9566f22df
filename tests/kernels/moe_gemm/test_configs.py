"""`kernels/moe_gemm/configs.py`: every tile the launchers can be given is one `tl.dot` accepts,
and the autotune tables become the `triton.Config`s they describe. (That every config compiles
for sm_90 within its shared memory is tests/kernels/test_compile_check.py.)"""

import pytest

from kernels.moe_gemm import configs as c

triton = pytest.importorskip("triton")


def _pow2_at_least_16(v):
    return v >= 16 and v & (v - 1) == 0


@pytest.mark.parametrize("rows,names", [(c.GEMM_ROWS, c.GEMM_TILES), (c.SWIGLU_ROWS, c.GEMM_TILES),
                                        (c.SWIGLU_BWD_ROWS, c.GEMM_TILES), (c.WGRAD_ROWS, c.WGRAD_TILES)])
def test_autotune_tables_have_dot_sized_tiles_and_become_their_configs(rows, names):
    assert rows and len(set(rows)) == len(rows), "no empty table, no duplicate config"
    configs = c.triton_configs(rows, names)
    assert len(configs) == len(rows)
    for row, cfg in zip(rows, configs):
        assert len(row) == len(names) + 2
        assert all(_pow2_at_least_16(v) for v in row[:-2]), row
        assert cfg.kwargs == dict(zip(names, row[:-2]))
        assert (cfg.num_warps, cfg.num_stages) == row[-2:]


def test_interpreter_tiles_and_row_blocks_are_dot_sized():
    assert set(c.INTERPRET_GEMM) == set(c.GEMM_TILES) and set(c.INTERPRET_WGRAD) == set(c.WGRAD_TILES)
    for v in [*c.INTERPRET_GEMM.values(), *c.INTERPRET_WGRAD.values(), c.INTERPRET_BLOCK_M, c.CUDA_BLOCK_M]:
        assert _pow2_at_least_16(v), v


def test_min_swiglu_block_n_is_the_narrowest_backward_tile():
    # it sizes the backward's per-column-tile buffer: no config may use a narrower tile
    widths = [r[0] for r in c.SWIGLU_BWD_ROWS] + [c.INTERPRET_GEMM["BLOCK_N"]]
    assert c.MIN_SWIGLU_BLOCK_N == min(widths)
