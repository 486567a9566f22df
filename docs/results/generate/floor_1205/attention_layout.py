"""The compiled decode step's attention alone, by layout of the gathered blocks (args: sequences S, head dim d,
blocks W of 16; 8 query heads on 4 KV heads, contexts W*16/2..W*16): `cur` the reference's [S, G, d, L] permute
(`paged_attention_decode_matmul`, compiled), `contig` `graph_decode_attention` ([S, G, L, d] rows, compiled),
`alt2` the keys as a double-transposed view, `sdpa` / `opaque_sdpa` SDPA over the gathered views (compiled, and
as one custom op), `eager_*` the same uncompiled. First the max difference from the eager reference, then three
rounds of the median wall us of 100 calls.
"""
import torch, time, statistics, os
from moe.attention.paged_torch import paged_attention_decode_matmul, gather_cache
from moe.engine.runner.compiled import graph_decode_attention
torch.set_num_threads(int(os.environ.get("NT", "1")))
import sys; S, H, G, d, bs, NB, W = int(sys.argv[1]), 8, 4, int(sys.argv[2]), 16, 257, int(sys.argv[3])
g = torch.Generator().manual_seed(0)
kc, vc = torch.randn(NB, bs, G, d, generator=g), torch.randn(NB, bs, G, d, generator=g)
q = torch.randn(S, H, d, generator=g)
tables = torch.randint(0, NB, (S, W), generator=g, dtype=torch.int32)
lens = torch.randint(W * bs // 2, W * bs, (S,), generator=g, dtype=torch.int32)
def alt2(q, k_cache, v_cache, block_tables, context_lens, scale):
    # the gather keeps the cache's row order [S, L, G, d]; heads batched by einsum-free bmm on strided views
    S, H, d = q.shape
    G = k_cache.shape[2]
    k_SLGd = gather_cache(k_cache, block_tables).float()
    v_SLGd = gather_cache(v_cache, block_tables).float()
    L = k_SLGd.shape[1]
    scores = torch.matmul(q.reshape(S, G, H // G, d).float(), k_SLGd.transpose(1, 2).transpose(-1, -2)) * scale
    valid_SL = torch.arange(L, device=q.device)[None, :] < context_lens[:, None]
    scores = scores.masked_fill(~valid_SL[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v_SLGd.transpose(1, 2))
    return out.reshape(S, H, d).to(q.dtype)
import torch.nn.functional as F
def alt3(q, k_cache, v_cache, block_tables, context_lens, scale):
    S, H, d = q.shape
    G = k_cache.shape[2]
    k_SLGd = gather_cache(k_cache, block_tables)
    v_SLGd = gather_cache(v_cache, block_tables)
    L = k_SLGd.shape[1]
    valid_SL = torch.arange(L, device=q.device)[None, :] < context_lens[:, None]
    out = F.scaled_dot_product_attention(q.reshape(S, G, H // G, d).float(), k_SLGd.transpose(1, 2).float(),
                                         v_SLGd.transpose(1, 2).float(), attn_mask=valid_SL[:, None, None, :], scale=scale)
    return out.reshape(S, H, d).to(q.dtype)
@torch.library.custom_op("scratch::dec_attn", mutates_args=())
def dec_attn(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    return alt3(q, k_cache, v_cache, block_tables, context_lens, scale)
@dec_attn.register_fake
def _(q, k_cache, v_cache, block_tables, context_lens, scale):
    return torch.empty_like(q)
fs = {"opaque_sdpa": torch.compile(lambda *a: dec_attn(*a), dynamic=False), "sdpa": torch.compile(alt3, dynamic=False), "eager_sdpa": alt3, "cur": torch.compile(paged_attention_decode_matmul, dynamic=False), "contig": torch.compile(graph_decode_attention, dynamic=False),
      "alt2": torch.compile(alt2, dynamic=False), "eager_cur": paged_attention_decode_matmul}
ref = paged_attention_decode_matmul(q, kc, vc, tables, lens, 0.125)
with torch.inference_mode():
    for n, f in fs.items():
        print(n, (f(q, kc, vc, tables, lens, 0.125) - ref).abs().max().item())
    for r in range(3):
        for n, f in fs.items():
            for _ in range(10): f(q, kc, vc, tables, lens, 0.125)
            ts = []
            for _ in range(100):
                t = time.perf_counter(); f(q, kc, vc, tables, lens, 0.125); ts.append(time.perf_counter() - t)
            print(r, n, round(statistics.median(ts) * 1e6, 1), "us")
