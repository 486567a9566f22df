"""Graph breaks and graphs of the compiled decode step (`LLM(compile=True)`), counted by dynamo.

    PYTHONPATH=. python -m benchmarks.compile_graph_breaks --json out.json

A small random model generates greedily at batch 1 and at batch 3 (each in a fresh engine, after
`torch._dynamo.reset()`), and dynamo's counters say how many graph breaks it met (by reason and
place) and how many graphs it compiled. Run it against two checkouts (PYTHONPATH) to compare.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moe.config import ModelConfig  # noqa: E402
from moe.engine import LLM, SamplingParams  # noqa: E402
from moe.model import Transformer  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402


def count(batch: int, max_tokens: int) -> dict:
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=64,
                      max_seq_len=512, router=router_config(top_k=2))
    llm = LLM.from_model(Transformer(cfg).eval(), None, max_num_seqs=4, max_model_len=128,
                         collect_routing_stats=False, compile=True)
    llm.generate([[5, 6, 7, 8, 9]] * batch, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    breaks = collections.Counter({k.splitlines()[0][:160]: v for k, v in counters["graph_break"].items()})
    return {"batch": batch, "compiled_steps": llm.runner.num_compiled_steps,
            "graph_breaks": sum(breaks.values()), "graph_break_reasons": dict(breaks),
            "graphs_compiled": counters["stats"]["unique_graphs"],
            "compile_seconds": {str(k): round(v, 3) for k, v in getattr(llm.runner, "compile_seconds", {}).items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = {"torch": torch.__version__, "moe": str(Path(sys.modules["moe"].__file__).parent),
           "runs": [count(b, args.max_tokens) for b in (1, 3)]}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
