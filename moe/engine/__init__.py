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

from moe.lazy_exports import lazy_exports

# Resolved on first use (PEP 562), so that importing a light part of the engine
# (`moe.engine.config`, `python -m moe.engine.memory.plan`) does not import the runner, the
# sampler, guided decoding and the model code with it.
_EXPORTS = {"EngineConfig": "moe.engine.config", "LLMEngine": "moe.engine.core.engine", "LLM": "moe.engine.core.llm",
            "RequestMetrics": "moe.engine.outputs", "RequestOutput": "moe.engine.outputs",
            "StreamEvent": "moe.engine.outputs", "GuidedParams": "moe.engine.sampling.guided",
            "SamplingParams": "moe.engine.sampling.sampler"}

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "GuidedParams", "RequestOutput", "RequestMetrics",
           "StreamEvent"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
