"""What makes a request servable, checked before it is queued (`LLMEngine.validate_request`,
which the server also calls to answer a 400): a prompt of token ids inside the vocabulary,
shorter than `max_model_len`, and a KV cache that can hold it with its `max_tokens`. Each failure
is a RequestError whose `param` names the request field at fault.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from moe.engine.memory.block_manager import BlockManager
from moe.errors import RequestError

Prompt = Union[str, list[int]]


def is_token_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def encode_prompt(prompt: Prompt, tokenizer, add_bos: bool) -> tuple[Optional[str], list[int]]:
    """(the text or None, the token ids) of a text prompt or a list (or tensor) of token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestError("text prompts need a tokenizer (pass token ids, or a tokenizer to from_model)",
                               param="prompt")
        return prompt, list(tokenizer.encode(prompt, add_bos=add_bos))
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)) or not all(is_token_id(t) for t in prompt):
        raise RequestError(f"a prompt must be a str or a list of token ids; got {type(prompt).__name__}",
                           param="prompt")
    return None, list(prompt)


def check_prompt(prompt_ids: list[int], vocab_size: int, max_model_len: int) -> None:
    """A non-empty prompt of token ids in [0, vocab_size) that leaves room to generate."""
    if not prompt_ids:
        raise RequestError("the prompt is empty (it encodes to no tokens)", param="prompt")
    bad = [t for t in prompt_ids if not is_token_id(t) or not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})",
                           param="prompt")
    n, limit = len(prompt_ids), max_model_len
    if n >= limit:
        raise RequestError(f"This model's maximum context length is {limit} tokens (max_model_len), but the "
                           f"prompt has {n} tokens: at most {limit - 1} prompt tokens leave room to generate",
                           param="prompt", code="context_length_exceeded")


def check_cache_room(num_prompt_tokens: int, max_tokens: int, max_model_len: int,
                     block_manager: BlockManager, max_chunk: Optional[int] = None) -> None:
    """The whole KV cache can hold the request at its longest (param "max_tokens" when not): all
    its blocks, or with a sliding window the most it holds at once (steps of <= `max_chunk` tokens)."""
    num_blocks, block_size = block_manager.num_blocks, block_manager.block_size
    cached = min(num_prompt_tokens + max_tokens, max_model_len) - 1  # the last token is never fed back
    need = block_manager.max_blocks_held(cached, max_chunk)
    if need > num_blocks:
        raise RequestError(f"the request needs up to {need} KV blocks ({cached} tokens of prompt + max_tokens) "
                           f"but the cache has only {num_blocks} ({num_blocks * block_size} "
                           "tokens); lower max_tokens or give the cache more memory", param="max_tokens")
