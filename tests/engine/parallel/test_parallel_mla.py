"""MLA under tensor parallelism (issue 33): a DeepSeek-V2-like random model (MLA with a query
LoRA, shared experts, a dense first layer) served by 2 ranks (real processes, gloo) gives the
single-process engine's greedy tokens and logprobs, with chunked prefill, prefix caching and
preemption in the run. The query and kv_b projections split by heads; the latent cache is
replicated on both ranks (as vLLM does), so each rank's cache is as large as the single
engine's."""

import pytest
import torch

from moe.checkpoint import save_checkpoint
from moe.config import Config, to_dict
from moe.engine import LLM, SamplingParams
from tests.engine.conftest import build_model, random_prompts
from tests.engine.feature_matrix import MLA
from tests.engine.parallel.test_parallel_engine import OPTS, PARAMS, assert_same

VOCAB = 263


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = build_model(VOCAB, n_layers=3, n_dense_layers=1, n_shared_experts=1, **MLA)
    path = tmp_path_factory.mktemp("tp-mla") / "step_0000001.pt"
    return str(save_checkpoint(path, {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg))}))


def test_mla_over_two_ranks_equals_the_single_process_engine(checkpoint):
    prompts = random_prompts([3, 17, 33], vocab=VOCAB)
    single = LLM(checkpoint, **OPTS)
    ref = single.generate(prompts, PARAMS)
    ref_again = single.generate(prompts, PARAMS)
    llm = LLM(checkpoint, tensor_parallel_size=2, **OPTS)
    try:
        assert_same(llm.generate(prompts, PARAMS), ref)
        assert_same(llm.generate(prompts, PARAMS), ref_again)  # the prefix-cached pass
        stats = llm.stats()
        assert stats["prefix_cache_hits"] == single.stats()["prefix_cache_hits"] > 0
        assert stats["num_preemptions"] == single.stats()["num_preemptions"]
        ranks = llm.runner.rank_stats()
        kv = {r["rank"]: r["kv_cache_bytes"] for r in ranks}
        whole = single.runner.context.kv
        assert kv[0] == kv[1] == whole.numel() * whole.element_size()  # the latent replicated, not split
        assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    finally:
        llm.shutdown()
