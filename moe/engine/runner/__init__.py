"""Running the model on a scheduled batch: model_runner (flattened batch -> logits), compiled
(`CompiledModelRunner`: `compile=True`, static-shape decode steps over padded batch buckets),
context (the kv_context the model's attention calls; owns the paged KV cache), kv_fp8 (the FP8
KV cache format), block_tables (each sequence's block table as a persistent int32 tensor) and
group_tables (a hybrid model's step metadata, one per KV cache group).
"""
