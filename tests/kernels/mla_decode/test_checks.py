"""`kernels/mla_decode/checks.py`: each bad argument is one ValueError naming it."""

import math

import pytest
import torch

from kernels.mla_decode import check_mla_decode, mla_decode_torch
from tests.kernels.mla_decode.cases import mla_case

BAD = {
    "q_rope heads": (lambda a: (a[0], a[1][:, :2], *a[2:]), "q_rope"),
    "cache width": (lambda a: (a[0], a[1], a[2][..., :-1], *a[3:]), "kv_lora_rank \\+ rope_dim = 19"),
    "int64 tables": (lambda a: (*a[:3], a[3].long(), *a[4:]), "block_tables must be a 2-D int32"),
    "lens count": (lambda a: (*a[:4], a[4][:1]), "context_lens must be a 1-D int32 tensor of T=2"),
    "int dtype": (lambda a: (a[0].long(), *a[1:]), "q_latent dtype"),
}


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_bad_inputs_name_the_argument(bad):
    change, words = bad
    args = mla_case(13, 6, 3, [1, 4], 3, torch.float32)[:5]
    check_mla_decode(*args)
    with pytest.raises(ValueError, match=words):
        check_mla_decode(*change(args))
    assert math.isfinite(float(mla_decode_torch(*args, 0.1).sum()))
