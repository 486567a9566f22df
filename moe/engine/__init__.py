"""A small paged-attention inference engine for moe-lab models (nano-vllm style).

    from moe.engine import LLM, SamplingParams
    llm = LLM("runs/x")  # a checkpoint file or run directory; or LLM.from_model(model, tokenizer)
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))[0]
    print(out.text, out.finish_reason, out.metrics.ttft, llm.stats()["prefix_cache_hit_rate"])

Layout (the layers inside the engine, bottom to top; a part imports only those below it):
config (`EngineConfig`, `SpeculativeConfig`: every option, checked on creation), outputs
(`RequestOutput`, `RequestMetrics`, `StreamEvent`), sampling/ (`SamplingParams`, the sampler,
repetition-penalty counts, guided decoding), sequence (`Sequence`: one request's state;
`ScheduledBatch`), runner/ (the model runner, its compiled variant, the paged KV context, the FP8
KV cache, block tables), memory/ (the block manager and prefix cache, KV cache sizing, memory
profile, `python -m moe.engine.memory.plan`), speculative/ (proposers, rejection sampling, the
verifier that returns each sequence's accepted tokens and rolls its KV back; docs/design/speculative.md),
core/ (`LLMEngine`, `LLM`, the scheduler, the one append-and-stop-check path, invariants).
Paged attention backends live in `moe/attention/`, their kernels in `kernels/paged_attention/`.
"""

from moe.engine.config import EngineConfig
from moe.engine.core.engine import LLMEngine
from moe.engine.core.llm import LLM
from moe.engine.outputs import RequestMetrics, RequestOutput, StreamEvent
from moe.engine.sampling.guided import GuidedParams
from moe.engine.sampling.sampler import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "GuidedParams", "RequestOutput", "RequestMetrics",
           "StreamEvent"]
