"""Per-module CPU time of one decoded token, the engine (batch 1, no routing statistics) against HF
`generate()` on the same random model (benchmarks/generate.py's default `tiny`), both greedy from the
same 64-token prompt for `N` new tokens. Forward pre/post hooks read `time.thread_time()` (CPU time of
this thread, so the machine's load inflates it far less than wall clock); `--repeats` runs of each,
interleaved; medians and min-max per module, in microseconds per token (the prompt's prefill
included once, 1/N of the total). Run from the repository root:

    OMP_NUM_THREADS=1 python docs/results/generate/inference_routing/breakdown.py --json out.json
"""
import transformers.utils.import_utils as _u

_u.is_kernels_available = lambda *a, **k: False  # see run_without_hub_kernels.py

import argparse, json, statistics, sys, time  # noqa: E401,E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import torch  # noqa: E402

from moe.config import ModelConfig  # noqa: E402
from moe.engine import LLM, SamplingParams  # noqa: E402
from moe.hf.convert import to_hf_model  # noqa: E402
from moe.model import Transformer  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402


def hook(mod, name, acc):
    starts = []
    mod.register_forward_pre_hook(lambda m, a: starts.append(time.thread_time()))

    def post(m, a, o):
        acc[name] += time.thread_time() - starts.pop()
    mod.register_forward_hook(post)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=4096, max_seq_len=512, init_std=0.02, router=router_config(top_k=2), d_model=256,
                      n_layers=4, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=512)
    model = Transformer(cfg).eval()
    hf = to_hf_model(model, pad_token_id=0)
    hf.generation_config.pad_token_id, hf.generation_config.eos_token_id = 0, None
    acc = defaultdict(float)
    for l in model.layers:
        for mod, name in ((l.attn, "attention"), (l.ffn.router, "router"), (l.ffn.experts, "experts"),
                          (l.attn_norm, "norms"), (l.ffn_norm, "norms")):
            hook(mod, "engine/" + name, acc)
    for mod, name in ((model, "forward"), (model.lm_head, "lm_head"), (model.norm, "norms")):
        hook(mod, "engine/" + name, acc)
    for l in hf.model.layers:
        for mod, name in ((l.self_attn, "attention"), (l.mlp.gate, "router"), (l.mlp.experts, "experts"),
                          (l.input_layernorm, "norms"), (l.post_attention_layernorm, "norms")):
            hook(mod, "hf/" + name, acc)
    for mod, name in ((hf, "forward"), (hf.lm_head, "lm_head"), (hf.model.norm, "norms")):
        hook(mod, "hf/" + name, acc)
    N = args.tokens
    prompt = torch.randint(3, 4096, (1, 64), generator=torch.Generator().manual_seed(1))
    llm = LLM.from_model(model, None, max_num_seqs=1, collect_routing_stats=False)
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=N, min_new_tokens=N, do_sample=False)
    samples = defaultdict(list)
    for rep in range(args.repeats + 1):  # the first is a warm-up
        acc.clear()
        t0 = time.thread_time()
        eng = llm.generate([prompt[0].tolist()], params)[0].token_ids
        acc["engine/step (whole generate)"] = time.thread_time() - t0
        t0 = time.thread_time()
        with torch.inference_mode():
            ref = hf.generate(prompt, **kw)[0, 64:].tolist()
        acc["hf/step (whole generate)"] = time.thread_time() - t0
        assert eng == ref, "engine and HF tokens differ"
        if rep:
            for k, v in acc.items():
                samples[k].append(1e6 * v / N)
    res = {k: dict(median_us=round(statistics.median(v), 1), min_us=round(min(v), 1), max_us=round(max(v), 1),
                   runs=[round(x, 1) for x in v]) for k, v in sorted(samples.items())}
    for k, v in res.items():
        print(f"{k:34s} {v['median_us']:9.1f} us/token  ({v['min_us']:.1f}-{v['max_us']:.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(tokens=N, repeats=args.repeats, per_token=res), indent=1))


if __name__ == "__main__":
    main()
