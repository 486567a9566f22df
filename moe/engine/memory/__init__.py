"""KV memory: block_manager (KV blocks, reference counts, the prefix cache), cache_size (how many
KV blocks), memory_profile (peak activations measured on a GPU or estimated on meta tensors) and
plan (the memory plan of a model on a device: `python -m moe.engine.memory.plan`).
"""
