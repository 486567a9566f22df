import os

import weakref

import torch

# The Triton kernels run in the interpreter on CPU-only machines; it must be chosen before
# the first kernel launch (kernels/paged_attention/ compiles lazily, so import order is moot).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from moe.config import ModelConfig  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402
from moe.model import Transformer  # noqa: E402
from tests.conftest import with_variants


class ByteTokenizer:
    """Byte-level test tokenizer with the project's tokenizer interface: ids 0..3 are
    pad/bos/eos/end, byte b is id b + 4 (vocab 260)."""

    SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|end|>")

    def __init__(self, eos_id: int = 2):
        self.pad_id, self.bos_id, self.eos_id, self.vocab_size = 0, 1, eos_id, 260

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = [b + 4 for b in text.encode("utf-8")]
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out, buf = [], bytearray()
        for i in ids:
            i = int(i)
            if i >= 4:
                buf.append(i - 4)
            elif not skip_special_tokens:
                out.append(buf.decode("utf-8", errors="replace") + self.SPECIALS[i])
                buf = bytearray()
        return "".join(out) + buf.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        for m in messages:
            if m.get("role") not in ("system", "user", "assistant"):
                raise ValueError(f"bad role {m.get('role')!r}")
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (tests/conftest.py's `one_thread`: tiny models)."""


def build_model(vocab_size: int, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4,
               expert_hidden=64, max_seq_len=256)
    cfg.update(kw)
    return Transformer(with_variants(ModelConfig(**cfg), router_config(top_k=2))).eval()


@pytest.fixture(scope="session")
def byte_tok():
    return ByteTokenizer()


@pytest.fixture(scope="session")
def model():
    return build_model(260)


@pytest.fixture(scope="session")
def bpe_tok():
    """The project's byte-level BPE tokenizer, trained on a few lines (skipped if absent)."""
    try:
        from moe.data import Tokenizer
    except ImportError:
        pytest.skip("moe.data.Tokenizer is not importable")
    text = ("the quick brown fox jumps over the lazy dog. héllo wörld, naïve café — ✓ 日本語 テスト "
            "experts route tokens; the router picks the top k. ") * 3
    return Tokenizer.train([text] * 10, vocab_size=300)


@pytest.fixture(scope="session")
def bpe_model(bpe_tok):
    return build_model(bpe_tok.vocab_size, seed=1)


# model -> {(prompt, n): tokens}. Weakly keyed: an id() key outlived its model, and a model built later at
# the same address got the dead one's outputs (a flaky failure in tests/engine/speculative).
_NAIVE_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@torch.no_grad()
def naive_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Reference: re-run the full model (no cache) on the whole sequence for every token."""
    cache, key = _NAIVE_CACHE.setdefault(model, {}), (tuple(prompt), n)
    if key not in cache:
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        cache[key] = ids[len(prompt):]
    return cache[key]


def random_prompts(lengths, vocab: int = 260, seed: int = 0, low: int = 4) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(low, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="session")
def naive():
    return naive_greedy


@pytest.fixture(scope="session")
def make_prompts():
    return random_prompts


@pytest.fixture(scope="session")
def make_model():
    return build_model


@pytest.fixture(scope="session")
def tokenizer_cls():
    return ByteTokenizer
