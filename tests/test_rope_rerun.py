"""moe/rope.py's device and dtype handling, added by the first mutation run's re-record
(docs/results/mutation/rerun1b/README.md): the first run listed `device` dropped or None and
`dtype` None as "identical on CPU"; these tests tell them apart on the CPU alone.

- Every tensor is made on the `device` asked for: run on the `meta` device, a frequency table made
  on the CPU (a dropped `device=`) comes back on the CPU.
- The tables are fp32 whatever torch's default dtype: under a float64 default, a dropped
  `dtype=` makes a float64 tensor that promotes the result.
"""

from __future__ import annotations

import pytest
import torch

from moe.rope import rope_parameters
from tests.test_rope import SCALINGS, SEPARATING, ours

CASES = {"default": ({}, None), **{k: (v, None) for k, v in SCALINGS.items()}, **SEPARATING}


def _cfg(case: str):
    scaling, theta = CASES[case]
    return ours(scaling) if theta is None else ours(scaling, theta=theta)


@pytest.mark.parametrize("case", list(CASES))
def test_rope_parameters_make_every_tensor_on_the_requested_device(case):
    inv_freq, attention = rope_parameters(_cfg(case), torch.device("meta"))
    assert inv_freq.device.type == "meta"
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (32,)
    assert attention == rope_parameters(_cfg(case), torch.device("cpu"))[1]


@pytest.mark.parametrize("case", list(CASES))
def test_rope_parameters_are_fp32_under_a_float64_default_dtype(case):
    ref, ref_attention = rope_parameters(_cfg(case), torch.device("cpu"))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        inv_freq, attention = rope_parameters(_cfg(case), torch.device("cpu"))
    finally:
        torch.set_default_dtype(old)
    assert ref.dtype == torch.float32 and inv_freq.dtype == torch.float32
    torch.testing.assert_close(inv_freq, ref, rtol=1e-6, atol=0)
    assert attention == pytest.approx(ref_attention, rel=1e-12)
