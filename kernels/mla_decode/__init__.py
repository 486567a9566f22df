"""MLA's absorbed paged decode (DeepSeek-V2 appendix B; vLLM's triton_mla, FlashMLA): a Triton
kernel and its PyTorch reference.

The cache of one layer is `[num_blocks, block_size, 1, C + R]`: per token the normalised
`kv_lora_rank` (C) latent c and the rotated rope key (R), in paged attention's block layout
(kernels/paged_attention). A decode query arrives absorbed: `q_latent = W_UK^T q_nope [T, H, C]`
and `q_rope [T, H, R]`; the score of cached row j is `scale * (q_latent . c_j + q_rope . k_rope_j)`
and the output is the latent mix `sum_j p_j c_j [T, H, C]` (W_UV and o_proj follow in the model).

* `mla_decode(q_latent, q_rope, cache, block_tables, context_lens, scale)`: the Triton kernel
  (`triton_kernels.py`: a program per sequence, 16-head tile and context split; the latent tile read
  once as key and as value; split-KV merged by paged attention's log-sum-exp reduce). It fits
  sm_80 / sm_90 shared memory at DeepSeek's 512 + 64 (`python -m kernels.compile_check --parts mla`).
* `mla_decode_torch(...)`: the reference (fp32 softmax over the gathered rows).

Files: `checks.py`, `reference.py`, `triton_kernels.py`, `launch.py`, `compile_cases.py`.
"""

from kernels.mla_decode.checks import check_mla_decode
from kernels.mla_decode.launch import mla_decode, runnable_reason
from kernels.mla_decode.reference import mla_decode_torch

__all__ = ["check_mla_decode", "mla_decode", "mla_decode_torch", "runnable_reason"]
