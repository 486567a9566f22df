"""Engine per-step overhead (scheduler + block manager + input preparation + sampler) against
context length, with a stub model: no forward, the logits rows come from a fixed random pool.

    python -m benchmarks.engine_overhead --contexts 2048 8192 32768 131072 --num-seqs 256 \
        --out outputs/benchmarks/engine_overhead.json

Each scenario puts `--num-seqs` sequences straight into the decode state (prompt of the given
length, all but its last token computed and registered in the prefix cache, through the block
manager's own calls), then times `LLMEngine.step()` over `--steps` decode steps (after one warm-up
step), each interleaved with a step of a peer engine of `--num-seqs` 2k-token sequences in the
same process: the figure is the ratio of the two medians (this 2-core machine is shared, so
absolute times drift from minute to minute; the ratio does not). Every request has `repetition_penalty=1.1`; half are greedy, half sample at temperature 1
with a seed. The "mix" scenario is 255 x 2k + one 128k sequence, plus a 104k-token prompt (the
128k one's first 100k tokens, cached, + 4k new) that waits for blocks (the running sequences'
growth is allocated up front, leaving fewer free blocks than a prefill chunk needs): each step
retries its admission, matching 6250 cached blocks.

Checks on the last step (exit 1 on a mismatch): the decode block tables and context lengths the
runner built equal the 0-padded tables written from each sequence's `block_table` from scratch,
and every greedy token equals the argmax of the logits penalised with a recount of the context.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from moe.config.schema import ModelConfig
from moe.engine import EngineConfig, LLMEngine, SamplingParams
from moe.engine.sampling.sampler import apply_repetition_penalty
from moe.engine.sequence import SequenceStatus
from moe.routing.routers import router_config

VOCAB = 32000  # Mixtral's


class StubModel(nn.Module):
    """What the runner calls, minus the model: `norm` is where the runner's row hook selects the
    logits rows; the logits are views of a fixed random pool (so the stub costs nothing)."""

    def __init__(self, cfg: ModelConfig, max_rows: int):
        super().__init__()
        self.cfg = cfg
        self.dummy = nn.Parameter(torch.zeros(1, dtype=torch.bfloat16), requires_grad=False)
        self.norm = nn.Identity()
        self.rotary = SimpleNamespace(extend=lambda n: None)  # no positions to embed
        self.pool = torch.randn(max_rows, cfg.vocab_size, generator=torch.Generator().manual_seed(0))
        self.last_logits = None

    def forward(self, input_ids, positions=None, kv_context=None):
        rows = self.norm(torch.zeros(1, input_ids.shape[1], 1)).shape[1]
        self.last_logits = self.pool[:rows]
        return SimpleNamespace(logits=self.last_logits.unsqueeze(0), moe_records=[])


def timed(obj, name: str, acc: dict) -> None:
    """Wrap `obj.name` so its wall time is added to `acc[name]`."""
    fn = getattr(obj, name)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
    setattr(obj, name, wrapper)


def build(lengths: list[int], waiting: int, steps: int, block_size: int, seed: int):
    max_len = max(lengths + [waiting]) + steps + 64
    # the router's own Config (the engine reads its options, e.g. capacity_factor); a bare ModelConfig
    # holds an unresolved VariantConfig
    cfg = ModelConfig(vocab_size=VOCAB, d_model=1, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1,
                      max_seq_len=max_len, n_experts=1, expert_hidden=1, router=router_config(top_k=1))
    # Room for the running sequences' growth. With a waiting prompt, that growth is allocated up front and only 16
    # blocks stay free: fewer than a prefill chunk of the step's leftover token budget needs, so it stays waiting.
    reserve = steps + 2
    num_blocks = sum(-(-(n + reserve) // block_size) for n in lengths) + (16 if waiting else 0)
    model = StubModel(cfg, len(lengths))
    engine = LLMEngine(model, None, EngineConfig(num_blocks=num_blocks, block_size=block_size, device="cpu",
                                                 dtype="bf16", max_num_seqs=len(lengths) + 1, seed=seed,
                                                 max_num_batched_tokens=max(2048, len(lengths)),
                                                 max_model_len=max_len))
    rng = random.Random(seed)
    pool = [rng.randrange(VOCAB) for _ in range(1 << 16)]
    pool = pool * (-(-(max_len * 2) // len(pool)))  # shared int objects: 8 bytes a token
    bm, sched = engine.block_manager, engine.scheduler
    for i, n in enumerate(lengths):
        params = SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0, seed=None if i % 2 == 0 else i,
                                repetition_penalty=1.1, max_tokens=10 * steps + 10, ignore_eos=True)
        off = rng.randrange(1 << 16)
        engine.add_request(pool[off:off + n], params, request_id=f"s{i}")
        seq = sched.waiting.pop()
        # the state a finished prefill leaves: all but the last prompt token computed and cached
        bm.admit(seq, [])
        assert bm.allocate_slots(seq, n - 1 + (reserve if waiting else 0))
        seq.num_computed_tokens = n - 1
        bm.cache_full_blocks(seq)
        seq.status = SequenceStatus.RUNNING
        sched.running.append(seq)
    if waiting:
        # the longest prompt's first `waiting` tokens, then a new question: its prefix is in the cache (a shared
        # document), so each admission attempt matches `waiting / block_size` blocks, then needs more than 16
        longest = max(sched.running, key=lambda s: s.num_tokens)
        engine.add_request(longest.token_ids[:waiting] + [1] * 4096, SamplingParams(max_tokens=1),
                           request_id="waiting")
    return engine, model


def check(engine: LLMEngine, model: StubModel, batch, meta, sampled) -> list[str]:
    """Mismatches of the last step against from-scratch references."""
    bad = []
    bs = engine.block_size
    nd = meta.num_decodes
    lens = [s.num_computed_tokens for s in batch.seqs[:nd]]  # after the step: the context the step attended
    width = max(-(-c // bs) for c in lens)
    ref = torch.tensor([s.block_table[:-(-c // bs)] + [0] * (width - (-(-c // bs)))
                        for s, c in zip(batch.seqs[:nd], lens)], dtype=torch.int32)
    if not torch.equal(meta.decode_block_tables, ref):
        bad.append("decode block tables differ from the from-scratch construction")
    if meta.decode_context_lens.tolist() != lens:
        bad.append("decode context lengths differ")
    seqs = [batch.seqs[i] for i in sampled]
    logits = model.last_logits.float()
    pen = apply_repetition_penalty(logits, [s.token_ids[:-1] for s in seqs], [1.1] * len(seqs))
    want = pen.argmax(dim=-1).tolist()
    for r, s in enumerate(seqs):
        if s.params.greedy and s.token_ids[-1] != want[r]:
            bad.append(f"{s.request_id}: greedy token {s.token_ids[-1]} != {want[r]} (penalty recounted)")
    return bad


def instrument(engine: LLMEngine) -> tuple[dict, dict]:
    """Time the scheduler, input preparation and sampler; keep the last step's batch and metadata."""
    acc, last = {}, {}
    timed(engine.scheduler, "schedule", acc)
    timed(engine.runner, "prepare", acc)
    timed(engine.sampler, "sample", acc)
    prepare = engine.runner.prepare

    def keep(batch):
        out = prepare(batch)
        last.update(batch=batch, meta=out[2])
        return out
    engine.runner.prepare = keep
    return acc, last


def run(name: str, lengths: list[int], waiting: int, steps: int, block_size: int, seed: int) -> dict:
    """The scenario's steps interleaved with those of a peer engine of as many 2k-token sequences,
    so that the ratio of the two does not depend on what else the machine is doing."""
    t0 = time.perf_counter()
    engine, model = build(lengths, waiting, steps, block_size, seed)
    setup_s = time.perf_counter() - t0
    peer, _ = build([2048] * len(lengths), 0, steps, block_size, seed + 1)
    acc, last = instrument(engine)
    peer_acc, _ = instrument(peer)
    engine.step()  # warm-up (also computes each sequence's last prompt token)
    peer.step()
    acc.clear()
    peer_acc.clear()
    times, peer_times = [], []
    for _ in range(steps):
        for eng, out in ((peer, peer_times), (engine, times)):
            t = time.perf_counter()
            eng.step()
            out.append(time.perf_counter() - t)
    b = last["batch"]
    sampled = [i for i, c in enumerate(engine.runner.rows_per_seq) if c]
    bad = check(engine, model, b, last["meta"], sampled)
    if any(s.is_finished for s in b.seqs) or len(b.seqs) != len(lengths):
        bad.append(f"expected {len(lengths)} running decodes, got {len(b.seqs)}")
    med, peer_med = statistics.median(times), statistics.median(peer_times)
    out = dict(scenario=name, num_seqs=len(lengths), max_context=max(lengths), total_context=sum(lengths),
               waiting_prompt=waiting, steps=steps, setup_s=round(setup_s, 2),
               step_ms_median=round(1e3 * med, 2), peer_2k_step_ms_median=round(1e3 * peer_med, 2),
               ratio_to_peer_2k=round(med / peer_med, 2),
               **{f"{k}_ms": round(1e3 * v / steps, 2) for k, v in acc.items()},
               **{f"peer_2k_{k}_ms": round(1e3 * v / steps, 2) for k, v in peer_acc.items()}, mismatches=bad)
    print(json.dumps(out), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine_overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 32768, 131072])
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--no-mix", action="store_true", help="skip the 255 x 2k + 1 x 128k (+ waiting 100k) scenario")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="stored with the results (e.g. before / after)")
    ap.add_argument("--out", default="outputs/benchmarks/engine_overhead.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    for n in args.contexts:
        results.append(run(f"{args.num_seqs} x {n}", [n] * args.num_seqs, 0, args.steps, args.block_size, args.seed))
    if not args.no_mix:
        n = args.num_seqs
        results.append(run(f"{n - 1} x 2048 + 1 x 131072, 100k waiting", [2048] * (n - 1) + [131072], 100_000,
                           args.steps, args.block_size, args.seed))
    summary = dict(label=args.label, threads=args.threads, results=results,
                   max_ratio_to_peer_2k=max(r["ratio_to_peer_2k"] for r in results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    for r in results:
        print(f"{r['scenario']:>40}: {r['step_ms_median']:9.1f} ms a step, {r['ratio_to_peer_2k']:5.2f}x its 2k peer")
    print(f"wrote {args.out}")
    bad = [m for r in results for m in r["mismatches"]]
    for m in bad:
        print("MISMATCH:", m, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
