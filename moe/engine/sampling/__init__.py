"""Sampling: sampler (`SamplingParams`, logits processing and the batched sampler), penalties
(incremental repetition-penalty counts) and guided (`GuidedParams`: structured outputs, grammar
masks with xgrammar).
"""
