"""One conversation -> token ids and the loss mask (True on the assistant's tokens).

The conversation is rendered with the tokenizer's own chat template, one turn at a time: the
text a turn adds is what `render(messages[:k+1])` has beyond `render(messages[:k])` (for an
assistant turn, split at the generation prompt, which stays out of the loss). Each piece is
encoded on its own and the ids are concatenated, so the loss mask is exact without character
offsets. This needs a template whose rendering of a prefix of the conversation is a prefix of
the whole rendering; one that rewrites earlier turns (e.g. drops past reasoning) is refused by
name. The assistant's piece includes the template's end-of-turn marker, so the model learns to
stop.

The project's own BPE tokenizer renders with its documented template (`moe.data.tokenizer.
CHAT_TEMPLATE`: `<|bos|><|role|>\\ncontent<|end|>\\n...`); an HF tokenizer with no chat
template is an error naming it.
"""

from __future__ import annotations

from typing import Any, Sequence

from moe.errors import ConfigError

IGNORE_INDEX = -100  # label of a token with no loss (HF's and torch's cross-entropy convention)


def check_chat_template(tokenizer: Any, name: str) -> None:
    """A ConfigError naming `name` when the tokenizer has no chat template to render with."""
    hf = getattr(tokenizer, "tok", None)  # HFTokenizer wraps a transformers tokenizer
    if hf is not None and not getattr(hf, "chat_template", None):
        raise ConfigError(f"the tokenizer {name} has no chat template (tokenizer_config.json 'chat_template' or "
                          "chat_template.jinja); data=chat renders conversations with it: use a chat model's "
                          "tokenizer or add a template")
    if not hasattr(tokenizer, "apply_chat_template"):
        raise ConfigError(f"the tokenizer {name} ({type(tokenizer).__name__}) cannot render chat templates")


def _render(tokenizer: Any, messages: Sequence[dict], generation_prompt: bool) -> str:
    if not messages and not generation_prompt:
        return ""
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=generation_prompt)


def _suffix(longer: str, prefix: str, turn: int) -> str:
    if not longer.startswith(prefix):
        raise ConfigError(f"the chat template rewrites earlier turns when turn {turn} is added (its rendering of a "
                          "conversation prefix is not a prefix of the whole), so assistant tokens cannot be "
                          "located; use a template that renders turns append-only")
    return longer[len(prefix):]


def render_conversation(tokenizer: Any, messages: Sequence[dict]) -> tuple[list[int], list[bool]]:
    """(ids, loss_mask): the conversation's tokens and, per token, whether it is the assistant's."""
    ids: list[int] = []
    mask: list[bool] = []
    rendered = ""
    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            prompt = _render(tokenizer, messages[:k], generation_prompt=True)
            pieces = [(_suffix(prompt, rendered, k), False)]
            rendered_next = _render(tokenizer, messages[:k + 1], generation_prompt=False)
            pieces.append((_suffix(rendered_next, prompt, k), True))
        else:
            rendered_next = _render(tokenizer, messages[:k + 1], generation_prompt=False)
            pieces = [(_suffix(rendered_next, rendered, k), False)]
        for text, is_loss in pieces:
            if text:
                piece_ids = tokenizer.encode(text)
                ids.extend(piece_ids)
                mask.extend([is_loss] * len(piece_ids))
        rendered = rendered_next
    return ids, mask


def next_token_targets(ids: Sequence[int], mask: Sequence[bool]) -> list[int]:
    """Targets aligned with `ids`: at t, ids[t + 1] when that token is the assistant's, else
    IGNORE_INDEX; the last position has no next token inside the conversation (IGNORE_INDEX),
    so a packed row never predicts across a conversation boundary."""
    targets = [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)]
    return targets + [IGNORE_INDEX] if ids else []
