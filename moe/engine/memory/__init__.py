"""KV memory: block_manager (KV blocks, reference counts, the prefix cache, sliding-window freeing),
kv_groups (layers grouped by attention type; the blocks a windowed sequence holds; a hybrid model's cache
layout), hybrid_blocks (a hybrid model's per-group block tables in one shared pool), cache_size (how many
KV blocks), memory_profile (peak activations measured on a GPU or estimated on meta tensors) and
plan (the memory plan of a model on a device: `python -m moe.engine.memory.plan`).
"""
