"""A small paged-attention inference engine for moe-lab models (nano-vllm style).

    from moe.engine import LLM, SamplingParams
    llm = LLM("runs/x")  # a checkpoint file or run directory; or LLM.from_model(model, tokenizer)
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))[0]
    print(out.text, out.finish_reason, out.metrics.ttft, llm.stats()["prefix_cache_hit_rate"])

Files: sequence (request state), block_manager (KV blocks, prefix cache), scheduler
(continuous batching, chunked prefill, preemption), context (the kv_context the model's
attention calls; owns the paged cache), model_runner (flattened batch -> logits), sampler,
outputs, llm (the front end). Kernels live in `kernels/paged_attention.py`.
"""

from moe.engine.llm import LLM
from moe.engine.outputs import RequestMetrics, RequestOutput, StreamEvent
from moe.engine.sampler import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "RequestMetrics", "StreamEvent"]
