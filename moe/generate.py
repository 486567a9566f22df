"""Generate text from a checkpoint, streaming it to stdout.

    python -m moe.generate runs/x/checkpoints/step_0001000.pt --prompt "Once upon a time" \\
        --max-tokens 100 --temperature 0.8 --top-p 0.95
    echo "def fib(n):" | python -m moe.generate runs/x --prompt - --temperature 0
    python -m moe.generate ~/models/OLMoE-1B-7B-0924 --prompt "The capital of France" --router-top-k 4
    python -m moe.generate runs/x --chat --prompt "What is an expert?"

One prompt streams as it is generated; several `--prompt`s run as one batch and print in
order. A bad argument or checkpoint is one line on stderr and exit status 2; a prompt the
engine refuses (e.g. longer than the model's context) is reported on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from moe import cli
from moe.attention import PAGED_BACKENDS
from moe.engine import LLM, SamplingParams
from moe.engine.config import speculative_option
from moe.errors import UserError
from moe.routing.options import add_routing_arguments, routing_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moe.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a checkpoint file or a run directory (its newest checkpoint)")
    p.add_argument("--prompt", action="append", help="prompt text ('-' reads stdin); repeat for a batch")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn with the chat template")
    p.add_argument("--system", default=None, help="system message for --chat")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--backend", default="auto", help=f"attention backend: auto | {' | '.join(PAGED_BACKENDS)}")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--stats", action="store_true", help="print engine stats (JSON) to stderr at the end")
    p.add_argument("--speculative", default=None, help="speculative decoding: ngram | self | a JSON object of "
                   "SpeculativeConfig options (docs/design/speculative.md)")
    p.add_argument("--compile", action="store_true", help="compiled static-shape decode steps")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="split the model over this many processes (docs/guides/multi_device.md)")
    p.add_argument("--expert-parallel", action="store_true",
                   help="with --tensor-parallel-size: whole experts per rank instead of a slice of each")
    add_routing_arguments(p)
    return p


@cli.guarded
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)

    prompts = args.prompt or ["-"]
    prompts = [sys.stdin.read() if p == "-" else p for p in prompts]
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                                repetition_penalty=args.repetition_penalty, seed=args.seed,
                                max_tokens=args.max_tokens, stop=args.stop, ignore_eos=args.ignore_eos)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        routing = routing_from_args(args)
        llm = LLM(args.checkpoint, routing=routing, device=args.device, dtype=args.dtype,
                  attention_backend=args.backend, block_size=args.block_size, num_blocks=args.num_blocks,
                  speculative=speculative_option(args.speculative), compile=args.compile,
                  tensor_parallel_size=args.tensor_parallel_size, expert_parallel=args.expert_parallel)
    except (UserError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(cli.engine_settings(llm, routing), file=sys.stderr, flush=True)  # stdout carries only the text
    if args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        convs = [system + [{"role": "user", "content": p}] for p in prompts]
        events = llm.stream_chat(convs, params)
    else:
        events = llm.stream(prompts, params)

    status = 0
    if len(prompts) == 1:
        for ev in events:
            sys.stdout.write(ev.text_delta)
            sys.stdout.flush()
            if ev.finished and ev.finish_reason == "error":
                print(f"\nerror: {ev.output.error}", file=sys.stderr)
                status = 1
        sys.stdout.write("\n")
    else:
        outputs = {ev.index: ev.output for ev in events if ev.finished}
        for i in range(len(prompts)):
            out = outputs[i]
            print(f"=== [{i}] {out.finish_reason}")
            if out.finish_reason == "error":
                print(f"error: {out.error}", file=sys.stderr)
                status = 1
            print(out.text)
    sys.stdout.flush()
    if args.stats:
        print(json.dumps(llm.stats(), indent=2, default=str), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
