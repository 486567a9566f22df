"""MLA's absorbed paged decode on the GPU: compile cases only, no kernel of its own yet.

The engine attends MLA's latent cache as multi-query attention with one kv head of width
kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V2-Lite / V3), the cache read as both K and V
(moe/attention/mla_paged.py), so on CUDA it runs the generic kernels of `kernels/paged_attention`
with a 1024-wide head tile. `compile_cases.py` has `python -m kernels.compile_check --parts mla`
compile them at those shapes for sm_90 / sm_80 (register use and spills of the wide tile), which
no `--head-dims` of the paged part covers. A dedicated kernel (FlashMLA-style: the 512 latent dims
split across warps, the value read from the key tile) is not built; its launcher and reference
would go here.
"""
