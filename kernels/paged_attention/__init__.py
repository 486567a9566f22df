"""Paged attention: attention against a KV cache stored in fixed-size blocks.

The cache of one layer is two tensors `k_cache, v_cache: [num_blocks, block_size, n_kv_heads,
head_dim]`; a sequence's tokens live in the blocks its row of `block_tables` lists, token `t` at
block `block_tables[s, t // block_size]`, offset `t % block_size` (its *slot* is
`block * block_size + offset`). Three operations, each as a Triton kernel with a plain PyTorch
reference beside it (the `*_torch` functions, which define the semantics):

* `reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)`: write new tokens' K/V (`[N, G, d]`)
  into their slots (slot < 0: skip the token).
* `paged_attention_decode(q, ..., block_tables, context_lens, scale)`: one query per sequence
  (`q: [S, H, d]`), attending to the sequence's `context_lens[s]` cached tokens. One program per
  (sequence, kv head, split) loads each K/V tile once for all `H / G` query heads of its GQA
  group; with `num_splits > 1` the context is cut in pieces processed in parallel and merged by a
  log-sum-exp reduce (flash-decoding). Accumulation is fp32 whatever the cache dtype.
* `paged_attention_prefill(q, ..., block_tables, cu_seqlens_q, context_lens, scale)`: varlen
  prefill/extend. Sequence `s` has the query rows `cu_seqlens_q[s]:cu_seqlens_q[s+1]`, which are
  the *last* `q_len` of its `context_lens[s]` tokens (their K/V already written into the cache);
  query `i` sees cache positions `<= context_lens[s] - q_len + i` (causal, bottom-right aligned).


This package knows nothing of the model or the engine: the engine's paged backends, which bundle
these operations (`torch`, `triton`, `flash`), are registered in `moe/attention/`. The Triton
kernels are compiled on first use, so whether they run in the interpreter is decided by
`TRITON_INTERPRET` at that moment, not at import (`kernels/runtime.py`).

Files: `checks.py` (input checks), `reference.py` (the PyTorch references), `triton_kernels.py`
(the kernels and their lazy jit), `launch.py` (the Triton launchers).
"""

from kernels.paged_attention.checks import check_attention, check_cu_seqlens, check_write
from kernels.paged_attention.launch import (default_num_splits, paged_attention_decode, paged_attention_prefill,
                                            reshape_and_cache, runnable_reason)
from kernels.paged_attention.reference import (copy_to_slots, gather_cache, kept_slots, paged_attention_decode_torch,
                                               paged_attention_prefill_torch, reshape_and_cache_torch)


__all__ = ["check_attention", "check_cu_seqlens", "check_write", "copy_to_slots", "default_num_splits", "gather_cache",
           "kept_slots", "paged_attention_decode",
           "paged_attention_decode_torch", "paged_attention_prefill", "paged_attention_prefill_torch",
           "reshape_and_cache", "reshape_and_cache_torch", "runnable_reason"]
