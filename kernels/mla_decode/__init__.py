"""MLA's absorbed paged decode on the GPU: compile cases only, no kernel of its own yet.

The engine attends MLA's latent cache as multi-query attention with one kv head of width
kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V2-Lite / V3), the cache read as both K and V
(moe/attention/mla_paged.py), so on CUDA it runs the generic kernels of `kernels/paged_attention`.
`compile_cases.py` has `python -m kernels.compile_check --parts mla` compile them at the latent
shapes the engine serves with them (one kv head, rows up to 128 wide); at DeepSeek's 576 they
exceed sm_90's shared memory (recorded in docs/results/mla_decode/compile_check_sm90.txt), which
is why the engine refuses that width on the CUDA Triton backend. A dedicated kernel (FlashMLA-style:
the 512 latent dims split across warps, the value read from the key tile) is not built; its
launcher and reference would go here.
"""
