"""Rendering with the chat template and the assistant-only targets."""

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from moe.data.chat.prepare import load_chat_tokenizer
from moe.data.chat.render import IGNORE_INDEX, check_chat_template, next_token_targets, render_conversation
from moe.errors import ConfigError

CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye"}]


def test_loss_is_on_the_assistant_tokens_only_as_computed_by_hand(chat_tokenizer):
    tok = chat_tokenizer
    ids, mask = render_conversation(tok, CONV)
    # By hand: the project's template, piece by piece; the assistant pieces end with its <|end|>\n.
    prompt1 = tok.encode("<|bos|><|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n")
    answer1 = tok.encode("Hello<|end|>\n")
    prompt2 = tok.encode("<|user|>\nBye<|end|>\n<|assistant|>\n")
    answer2 = tok.encode("Goodbye<|end|>\n")
    assert ids == prompt1 + answer1 + prompt2 + answer2
    assert mask == [False] * len(prompt1) + [True] * len(answer1) + [False] * len(prompt2) + [True] * len(answer2)
    expected = ([IGNORE_INDEX] * (len(prompt1) - 1) + answer1 + [IGNORE_INDEX] * len(prompt2) + answer2
                + [IGNORE_INDEX])
    # targets[t] is the token after t when that token is the assistant's
    assert next_token_targets(ids, mask) == expected
    assert tok.decode([t for t in expected if t != IGNORE_INDEX], skip_special_tokens=False) == \
        "Hello<|end|>\nGoodbye<|end|>\n"


def _foreign_tokenizer(tmp_path, template):
    raw = RawTokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1, "</s>": 2, "hi": 3, "hello": 4, "U:": 5, "A:": 6},
                                        unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="[UNK]")
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def test_an_hf_tokenizer_renders_with_its_own_template(tmp_path):
    template = ("{% for m in messages %}{{ 'U: ' if m['role'] == 'user' else 'A: ' }}{{ m['content'] }} </s> "
                "{% endfor %}{% if add_generation_prompt %}A: {% endif %}")
    tok = load_chat_tokenizer(str(_foreign_tokenizer(tmp_path, template)))
    check_chat_template(tok, "foreign")
    ids, mask = render_conversation(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert ids == [5, 3, 2, 6, 4, 2]  # U: hi </s> A: | hello </s>
    assert mask == [False, False, False, False, True, True]


def test_a_tokenizer_without_a_chat_template_is_an_error_naming_it(tmp_path):
    path = _foreign_tokenizer(tmp_path, None)
    tok = load_chat_tokenizer(str(path))
    with pytest.raises(ConfigError, match="the tokenizer 'my-tok' has no chat template"):
        check_chat_template(tok, repr("my-tok"))


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path):
    # Renders only the last turn: a prefix's rendering is not a prefix of the whole.
    template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %} A: {% endif %}"
    tok = load_chat_tokenizer(str(_foreign_tokenizer(tmp_path, template)))
    with pytest.raises(ConfigError, match="rewrites earlier turns when turn 1"):
        render_conversation(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
