"""One engine decode step at a long context, window layers vs full layers (issue 34 item 4), on CPU.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python -m benchmarks.swa_decode --contexts 2048 32768 --repeats 3 \
        --json docs/results/swa_decode/results.json

A tiny random model (d_model 64, 2 layers, 4 experts) in three layouts of the same weights:
`window` (every layer slides over `--window` tokens), `full` (every layer full attention) and
`alternating` (sliding, full: GPT-OSS's pattern). For each context and layout the engine
(`LLM.from_model`, the torch paged backend) prefills `--seqs` prompts of `context` random tokens,
then decodes: `--repeats` rounds of `--steps` decode steps (every sequence decoding), the layouts'
engines interleaved in every round, each step timed by wall clock and process CPU time; the record
keeps each step, per round the median step, and over the rounds the median and min-max of those.

Correctness first, on a short case (a prompt 3 windows long, `--check-tokens` greedy tokens): every
layout's engine output must equal greedy decoding by a full forward of the model (no cache) at each
step; any difference is printed on stderr and the command exits 1 (a wrong output is no result).

What the engine does per layout at this commit: `window` frees the blocks its window passed and its
decode reads only the window's blocks; `alternating` is a hybrid model: one block table over both
layer kinds, nothing freed (moe/engine/memory/kv_groups.py), so its window layers' share of the
cache is held for the whole context.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.timing import finish_record  # noqa: E402
from moe.config import ModelConfig  # noqa: E402
from moe.engine import LLM, SamplingParams  # noqa: E402
from moe.engine.memory.kv_groups import cache_layout, is_hybrid  # noqa: E402
from moe.engine.runner.context import PagedKVContext  # noqa: E402
from moe.model import Transformer  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402
from tests.conftest import with_variants  # noqa: E402

LAYOUTS = {"window": ["sliding", "sliding"], "full": ["full", "full"], "alternating": ["sliding", "full"]}
VOCAB = 260


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.swa_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[2048, 32768])
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--seqs", type=int, default=2, help="sequences decoding together")
    p.add_argument("--steps", type=int, default=8, help="decode steps timed per engine")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--chunk", type=int, default=1024, help="max_num_batched_tokens (the prefill chunk)")
    p.add_argument("--check-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    return p


def build_model(layout: str, window: int, max_len: int) -> Transformer:
    torch.manual_seed(0)  # the same weights in every layout (layer types add no parameters)
    types = LAYOUTS[layout]
    cfg = ModelConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=64,
                      max_seq_len=max_len, sliding_window=window if "sliding" in types else None, layer_types=types)
    return Transformer(with_variants(cfg, router_config(top_k=2))).eval()


def engine(model, a, length: int) -> LLM:
    # The same KV memory for every layout: every block of every sequence of `length` tokens over all layers. A
    # hybrid model's pool blocks hold `layers_per_block` layers (moe.engine.memory.kv_groups.cache_layout), so it
    # gets n_layers / layers_per_block times as many blocks of that smaller size.
    cfg = model.cfg
    per_block = cache_layout(cfg, is_hybrid(cfg)).layers_per_block
    blocks = a.seqs * (-(-length // a.block_size) + 1) * cfg.n_layers // per_block
    return LLM.from_model(model, None, attention_backend="torch", block_size=a.block_size, num_blocks=blocks,
                          max_num_seqs=a.seqs, max_num_batched_tokens=a.chunk, collect_routing_stats=False,
                          check_invariants=False, enable_prefix_caching=False)


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (length,), generator=g).tolist() for _ in range(n)]


def add(llm: LLM, ps: list[list[int]], max_tokens: int) -> None:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(ps):
        llm.add_request(p, params, request_id=f"r{i}")


def run(llm: LLM, ps: list[list[int]], max_tokens: int) -> dict:
    """The engine's greedy outputs {request id: token ids}."""
    add(llm, ps, max_tokens)
    outs = {}
    while llm.has_unfinished_requests():
        for ev in llm.step():
            if ev.finished:
                outs[ev.request_id] = list(ev.output.token_ids)
    return outs


def decoding(llm: LLM, n: int) -> bool:
    running = llm.scheduler.running
    return len(running) == n and all(s.num_computed_tokens >= s.num_prompt_tokens for s in running)


def prefilled(llm: LLM, ps: list[list[int]], max_tokens: int) -> LLM:
    """`llm` stepped until every sequence of `ps` has its prompt cached and decodes."""
    add(llm, ps, max_tokens)
    while not decoding(llm, len(ps)):
        if not llm.has_unfinished_requests():  # a request ended (or was refused) before the others decode
            raise RuntimeError(f"the {len(ps)} sequences never decoded together: a request finished first")
        llm.step()
    return llm


def time_steps(llm: LLM, n: int, seqs: int) -> dict:
    """Wall and process CPU seconds of `n` decode steps, and the blocks in use before the last."""
    walls, cpus = [], []
    for _ in range(n):
        assert decoding(llm, seqs), "a sequence stopped decoding inside the timed steps"
        used = llm.block_manager.num_used_blocks
        w, c = time.perf_counter(), time.process_time()
        llm.step()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return dict(wall_s=walls, cpu_s=cpus, median_wall_s=statistics.median(walls),
                median_cpu_s=statistics.median(cpus), blocks_in_use=used, kv_bytes_in_use=used * block_bytes(llm),
                loadavg=os.getloadavg())


def block_bytes(llm: LLM) -> int:
    """Bytes of one pool block of `llm`'s cache (a hybrid layout's block holds `layers_per_block` layers)."""
    return PagedKVContext.model_bytes_per_block(llm.model.cfg, llm.config.block_size, llm.dtype,
                                                layers_per_block=llm.kv_layout.layers_per_block)


@torch.inference_mode()
def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by a full forward of the whole sequence at every step (no cache)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].float().argmax()))
    return ids[len(prompt):]


def check(a) -> tuple[dict, list[str]]:
    wrong, out = [], {}
    ps = prompts(2, 3 * a.window + 5, seed=1)
    for layout in LAYOUTS:
        model = build_model(layout, a.window, 4 * a.window)
        got = run(engine(model, a, len(ps[0]) + a.check_tokens), ps, a.check_tokens)
        want = [reference_greedy(model, p, a.check_tokens) for p in ps]
        out[layout] = got["r0"] == want[0] and got["r1"] == want[1]
        if not out[layout]:
            wrong.append(f"{layout}: engine {[got['r0'], got['r1']]} != full-forward greedy {want}")
    return out, wrong


def summary(values: list[float]) -> dict:
    return dict(median=statistics.median(values), min=min(values), max=max(values))


def measure(a, context: int) -> dict:
    """Each layout's engine prefilled once; then `repeats` rounds of `steps` decode steps, the layouts
    interleaved in every round (a load change hits every layout of a round alike)."""
    ps = prompts(a.seqs, context, seed=context)
    # the first sequences decode while the later ones prefill: tokens enough that all decode through every round
    gen = a.repeats * a.steps + 2 + a.seqs * -(-context // a.chunk)
    engines = {}
    for layout in LAYOUTS:
        model = build_model(layout, a.window, context + gen)
        t = time.perf_counter()
        engines[layout] = prefilled(engine(model, a, context + gen), ps, gen)
        print(f"context {context:6d} {layout:12s} prefilled in {time.perf_counter() - t:.1f} s", flush=True)
    result = {k: dict(repeats=[]) for k in LAYOUTS}
    for r in range(a.repeats):
        for layout, llm in engines.items():
            x = time_steps(llm, a.steps, a.seqs)
            result[layout]["repeats"].append(x)
            print(f"context {context:6d} {layout:12s} round {r}: step {1e3 * x['median_wall_s']:8.2f} ms wall, "
                  f"{1e3 * x['median_cpu_s']:8.2f} ms CPU, {x['blocks_in_use']} blocks in use "
                  f"({x['kv_bytes_in_use'] / 2**10:.0f} KiB)", flush=True)
    for res in result.values():
        res["step_wall_s"] = summary([x["median_wall_s"] for x in res["repeats"]])
        res["step_cpu_s"] = summary([x["median_cpu_s"] for x in res["repeats"]])
    return result


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    torch.set_num_threads(a.threads)
    record = dict(args=vars(a), machine=platform.platform(), cpus=os.cpu_count(), torch=torch.__version__,
                  threads=torch.get_num_threads(), load_before=os.getloadavg(),
                  commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
    record["check"], wrong = check(a)
    print("greedy = full forward:", record["check"], flush=True)
    if not wrong:  # a wrong output is no result: nothing timed
        record["contexts"] = {str(c): measure(a, c) for c in a.contexts}
    return finish_record(record, a.json, wrong)


if __name__ == "__main__":
    raise SystemExit(main())
