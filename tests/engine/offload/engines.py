"""Shared by the offload exactness tests: mixed prompts with a shared prefix, requests of mixed
lengths with logprobs, and engines that batch continuously (max_num_seqs=2 with 5 requests:
requests join the running batch as others finish)."""

from __future__ import annotations

import copy

from moe.engine import LLM, SamplingParams
from tests.engine.conftest import random_prompts

POLICIES = ("lru", "lfu", "lookahead", "ondemand")


def mixed_prompts(vocab: int = 260) -> list[list[int]]:
    shared = random_prompts([20], vocab, seed=11)[0]  # a shared 20-token prefix: prefix-cache hits
    tails = random_prompts([3, 30, 1, 12, 7], vocab, seed=12)
    return [shared + t for t in tails[:3]] + tails[3:]


def params():
    return [SamplingParams(temperature=0.0, max_tokens=n, logprobs=2) for n in (7, 3, 9, 4, 8)]


ENGINE = dict(num_blocks=96, max_num_seqs=2, max_num_batched_tokens=32)


def engine(model, **opts):
    return LLM.from_model(copy.deepcopy(model), **ENGINE, **opts)


def run(llm, prompts):
    return [(o.token_ids, o.logprobs) for o in llm.generate(prompts, params())]
