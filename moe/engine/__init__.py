"""A small paged-attention inference engine for moe-lab models (nano-vllm style).

    from moe.engine import LLM, SamplingParams
    llm = LLM("runs/x")  # a checkpoint file or run directory; or LLM.from_model(model, tokenizer)
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))[0]
    print(out.text, out.finish_reason, out.metrics.ttft, llm.stats()["prefix_cache_hit_rate"])

Files: config (`EngineConfig`: every option, checked on creation), cache_size (how many KV
blocks), memory_profile and plan (the memory plan: peak activations measured on a GPU or
estimated on meta tensors; `python -m moe.engine.plan`), sequence (request state),
block_manager (KV blocks, prefix cache), block_tables (persistent per-sequence block tables),
penalties (incremental repetition-penalty counts), scheduler
(continuous batching, chunked prefill, preemption), context (the kv_context the model's
attention calls; owns the paged cache), model_runner (flattened batch -> logits), sampler
(`SamplingParams` and sampling), guided (`GuidedParams`: structured outputs, grammar masks
with xgrammar), outputs, engine (`LLMEngine`: the core: request table, `validate_request`,
`step`, post-processing, stats), llm (`LLM`: the thin front end), spec_config
(`SpeculativeConfig`) and spec/ (speculative decoding: ngram / draft / self proposers, one-forward
verification, rejection sampling, KV rollback; docs/design/speculative.md), compiled
(`CompiledModelRunner`: `compile=True`, static-shape decode steps over padded batch buckets).
Paged attention backends live in `moe/attention/`, their kernels in `kernels/paged_attention/`.
"""

from moe.engine.config import EngineConfig
from moe.engine.engine import LLMEngine
from moe.engine.guided import GuidedParams
from moe.engine.llm import LLM
from moe.engine.outputs import RequestMetrics, RequestOutput, StreamEvent
from moe.engine.sampler import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "GuidedParams", "RequestOutput", "RequestMetrics",
           "StreamEvent"]
