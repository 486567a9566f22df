"""Byte-level BPE wrapper: lossless round trips, reserved special tokens, chat template, save/load."""

import json

import pytest

from moe.data.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, Tokenizer

ROUND_TRIP_TEXTS = [
    "Once upon a time there was a little girl named Lily.",
    "  leading spaces and trailing  ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows line ends\r",
    "emoji 🌍🚀👩‍👩‍👧 and flags 🇫🇷",
    "中文，日本語のテキスト，한국어",
    "combining e\u0301 and zero\u200bwidth and nul \x00 byte",
    "def f(x):\n    return {'a': [1, 2.5e-3]}  # code\n",
    "",
    " ",
]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip_is_lossless(small_tokenizer, text):
    ids = small_tokenizer.encode(text)
    assert all(0 <= i < small_tokenizer.vocab_size for i in ids)
    assert small_tokenizer.decode(ids) == text


def test_merges_compress_text(small_tokenizer):
    text = "Once upon a time, there was a little girl named Lily. She liked to play."
    # Trained merges make common English much shorter than its UTF-8 bytes.
    assert len(small_tokenizer.encode(text)) < 0.6 * len(text.encode("utf-8"))


def test_special_tokens_have_reserved_ids_and_are_never_split(small_tokenizer):
    tok = small_tokenizer
    assert SPECIAL_TOKENS == ("<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.special_ids == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.encode(t) == [i]
    ids = tok.encode("hi<|user|>there<|end|>\n")
    assert 4 in ids and 6 in ids
    # Special ids appear only where the markers are; the text around them is ordinary tokens.
    assert [i for i in ids if i < len(SPECIAL_TOKENS)] == [4, 6]
    assert tok.decode(ids, skip_special_tokens=False) == "hi<|user|>there<|end|>\n"
    assert tok.decode(ids) == "hithere\n"


def test_add_bos_and_encode_batch(small_tokenizer):
    tok = small_tokenizer
    texts = ["one story", "another\nstory 🌍", ""]
    assert tok.encode("one story", add_bos=True) == [tok.bos_id, *tok.encode("one story")]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_decode_accepts_tensors(small_tokenizer):
    torch = pytest.importorskip("torch")
    ids = small_tokenizer.encode("a tensor of ids")
    assert small_tokenizer.decode(torch.tensor(ids)) == "a tensor of ids"


def test_train_respects_vocab_size_and_char_budget(corpus):
    text = (corpus / "tinystories_train_head.txt").read_text(encoding="utf-8")
    big = Tokenizer.train([text], vocab_size=400)
    assert big.vocab_size == 400
    # 50 characters hold far too few pairs for 1000 - 263 merges: the budget was respected.
    tiny = Tokenizer.train([text], vocab_size=1000, max_chars=50)
    assert len(SPECIAL_TOKENS) + 256 <= tiny.vocab_size < 300
    with pytest.raises(ValueError, match="vocab_size=100"):
        Tokenizer.train([text], vocab_size=100)


def test_chat_template_exact_rendering(small_tokenizer):
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi!\nHow are you?"},
        {"role": "assistant", "content": "Fine."},
    ]
    expected = ("<|bos|><|system|>\nYou are helpful.<|end|>\n<|user|>\nHi!\nHow are you?<|end|>\n"
                "<|assistant|>\nFine.<|end|>\n")
    assert small_tokenizer.apply_chat_template(messages, add_generation_prompt=False) == expected
    assert small_tokenizer.apply_chat_template(messages) == expected + "<|assistant|>\n"
    assert small_tokenizer.apply_chat_template([]) == "<|bos|><|assistant|>\n"
    # The rendered prompt encodes its markers as the reserved ids.
    ids = small_tokenizer.encode(small_tokenizer.apply_chat_template(messages[1:2]))
    newline = small_tokenizer.encode("\n")
    assert ids[:2] == [1, 4] and 6 in ids and ids[-2:] == [5, *newline]


def test_chat_template_rejects_bad_messages(small_tokenizer):
    with pytest.raises(ValueError, match="role 'tool'"):
        small_tokenizer.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="'role' and 'content'"):
        small_tokenizer.apply_chat_template([{"content": "x"}])
    with pytest.raises(ValueError, match="content must be a str"):
        small_tokenizer.apply_chat_template([{"role": "user", "content": 3}])


def test_save_load_round_trip(small_tokenizer, tmp_path):
    out = small_tokenizer.save(tmp_path / "tok")
    assert (out / "tokenizer.json").is_file()
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == ("<|bos|>", "<|eos|>", "<|pad|>")
    text = "Lily saw a dog 🐶.\n"
    for loaded in (Tokenizer.load(out), Tokenizer.load(out / "tokenizer.json")):
        assert loaded.vocab_size == small_tokenizer.vocab_size
        assert loaded.encode(text) == small_tokenizer.encode(text)
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path / "missing")


def test_load_rejects_tokenizer_without_reserved_tokens(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    foreign = HFTokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    foreign.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="reserved special tokens"):
        Tokenizer.load(tmp_path)


def test_transformers_can_use_the_saved_tokenizer(small_tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = small_tokenizer.save(tmp_path / "tok")
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
    text = "  Lily 🌍\n"
    assert hf(text, add_special_tokens=False)["input_ids"] == small_tokenizer.encode(text)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (1, 2, 0)
    messages = [{"role": "user", "content": "Hello"}]
    assert (hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == small_tokenizer.apply_chat_template(messages))
    bare = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    assert bare.decode(small_tokenizer.encode(text)) == text
