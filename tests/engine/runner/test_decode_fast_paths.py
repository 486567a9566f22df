"""The decode step's fast paths (issue 32) against the general paths they stand in for: the torch
backend's matmul and contiguous decode against the reference kernel, the runner's decode-only
input preparation against the general one, the one-token experts against the sorted dispatch,
the greedy sampler against the full sampler; and the engine's greedy tokens with every fast path
on against every one off."""

import pytest
import torch

import moe.attention.paged_torch as pt
from kernels.paged_attention import paged_attention_decode_torch
from moe.engine import LLM, SamplingParams
import moe.engine.runner.decode_experts as de
import moe.engine.runner.model_runner as mr
from moe.engine.runner.model_runner import ModelRunner
from moe.experts.sorted import sorted_dispatch
from moe.engine.sampling.sampler import Sampler
from tests.engine.conftest import build_model

BS = 16


def _cache(dtype, nb=24, G=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(nb, BS, G, d, generator=g).to(dtype), torch.randn(nb, BS, G, d, generator=g).to(dtype), g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_backend_decode_matches_the_reference(dtype):
    kc, vc, g = _cache(dtype)
    backend = pt.TorchPagedAttention()
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=0, rtol=0)
    for ctx in (1, 15, 16, 17, 70):  # inside a block, at its end, one past it, several blocks
        n = -(-ctx // BS)
        contiguous = torch.arange(5, 5 + n, dtype=torch.int32)[None]
        shuffled = contiguous.flip(1)
        lens = torch.tensor([ctx], dtype=torch.int32)
        q = torch.randn(1, 8, 32, generator=g).to(dtype)
        assert pt.contiguous_span(contiguous, lens, BS) == (5 * BS, ctx)
        assert (pt.contiguous_span(shuffled, lens, BS) is None) == (n > 1)
        for table in (contiguous, shuffled):
            ref = paged_attention_decode_torch(q, kc, vc, table, lens, 0.2)
            torch.testing.assert_close(backend.decode(q, kc, vc, table, lens, 0.2), ref, **tol)
    tables = torch.randperm(24, generator=g)[:12].view(3, 4).to(torch.int32)  # several sequences: gathered
    lens = torch.tensor([5, 64, 40], dtype=torch.int32)
    q = torch.randn(3, 8, 32, generator=g).to(dtype)
    torch.testing.assert_close(backend.decode(q, kc, vc, tables, lens, 0.2),
                               paged_attention_decode_torch(q, kc, vc, tables, lens, 0.2), **tol)


def test_contiguous_span_edges():
    t = lambda *ids: torch.tensor([ids], dtype=torch.int32)  # noqa: E731
    lens = lambda n: torch.tensor([n], dtype=torch.int32)  # noqa: E731
    assert pt.contiguous_span(t(7, 8, 3), lens(2 * BS), BS) == (7 * BS, 2 * BS)  # only the blocks it uses count
    assert pt.contiguous_span(t(7, 8, 3), lens(2 * BS + 1), BS) is None  # its third block breaks the run
    assert pt.contiguous_span(t(7, 9), lens(BS + 1), BS) is None  # a gap
    assert pt.contiguous_span(t(9, 8), lens(BS + 1), BS) is None  # descending
    assert pt.contiguous_span(t(4), lens(0), BS) is None  # no context
    assert pt.contiguous_span(t(4), lens(BS + 1), BS) is None  # more blocks than the table holds
    assert pt.contiguous_span(torch.cat([t(1, 2), t(3, 4)]), torch.tensor([3, 3], dtype=torch.int32), BS) is None


def test_greedy_sampler_fast_path_equals_the_full_sampler():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0)] * 6
    sampler = Sampler(seed=0)
    fast = sampler.sample(logits, params, [None] * 6, [()] * 6)
    full = sampler.sample(logits, params, [None] * 6, [()] * 6, logits_mask=lambda _l: None)  # takes the full path
    assert fast.token_ids == full.token_ids == logits.argmax(-1).tolist()
    assert fast.logprobs == full.logprobs == [None] * 6


def test_one_token_experts_equal_the_sorted_dispatch():
    g = torch.Generator().manual_seed(2)
    E, D, H = 8, 32, 48
    gate_up, down = torch.randn(E, 2 * H, D, generator=g), torch.randn(E, D, H, generator=g)
    for experts in ([[5, 2]], [[3, 3]], [[7, E]], [[1, 4], [4, 6], [E, 0]]):  # a repeat, a dropped slot (id E)
        experts_TK = torch.tensor(experts)
        x_TD, w_TK = torch.randn(len(experts), D, generator=g), torch.rand(len(experts), 2, generator=g)
        got = de.active_experts_dispatch(x_TD, experts_TK, w_TK, gate_up, down)
        want = sorted_dispatch(x_TD, experts_TK, w_TK, gate_up, down)
        if len(experts) == 1:  # the case the runner swaps it in for: bit for bit
            assert torch.equal(got, want), experts
        else:  # several tokens: a different summation order, equal to rounding
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def model():
    return build_model(vocab_size=128, seed=3)


def _generate(model, prompts, max_num_seqs):
    llm = LLM.from_model(model, max_num_seqs=max_num_seqs, block_size=BS, num_blocks=64)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    return [o.token_ids for o in outs]


def test_engine_tokens_with_and_without_the_fast_paths(model, monkeypatch):
    """Batch 1 (contiguous blocks: the view path) and a batch of 3 (gathered), greedy: the same
    tokens with every fast path off (general input preparation, the reference decode kernel, the
    full sampler); the decode-only preparation builds the general one's tensors."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (9, 30, 17)]
    calls = {"contiguous": 0, "prepared": 0, "experts": 0}
    real_contiguous, real_prepare, real_active = pt.decode_contiguous, ModelRunner.prepare_decode, \
        de.active_experts_dispatch

    def counted_active(*a):
        calls["experts"] += 1
        return real_active(*a)

    def counted_contiguous(*a):
        calls["contiguous"] += 1
        return real_contiguous(*a)

    def checked_prepare(self, batch):
        fast, general = real_prepare(self, batch), self.prepare_general(batch)
        for a, b in zip(fast[:2], general[:2]):
            assert torch.equal(a, b)
        for field in ("slot_mapping", "decode_block_tables", "decode_context_lens"):
            assert torch.equal(getattr(fast[2], field), getattr(general[2], field)), field
        assert fast[2].num_decodes == general[2].num_decodes and fast[3] == general[3]
        calls["prepared"] += 1
        return fast

    monkeypatch.setattr(pt, "decode_contiguous", counted_contiguous)
    monkeypatch.setattr(ModelRunner, "prepare_decode", checked_prepare)
    monkeypatch.setattr(de, "active_experts_dispatch", counted_active)
    fast_1, fast_3 = _generate(model, prompts[:1], 1), _generate(model, prompts, 3)
    assert calls["contiguous"] > 0 and calls["prepared"] > 0 and calls["experts"] > 0
    monkeypatch.undo()

    monkeypatch.setattr(mr, "swappable_experts", lambda model, device: [])
    monkeypatch.setattr(ModelRunner, "_is_plain_decode", lambda self, batch: False)
    monkeypatch.setattr(pt.TorchPagedAttention, "decode",
                        lambda self, q, kc, vc, bt, cl, scale, window=None, sinks_H=None, plan=None:
                        paged_attention_decode_torch(q, kc, vc, bt, cl, scale, window, sinks_H))
    real_sample = Sampler.sample
    monkeypatch.setattr(Sampler, "sample", lambda self, logits, params, gens, ctx, logits_mask=None:
                        real_sample(self, logits, params, gens, ctx, logits_mask or (lambda _l: None)))
    assert _generate(model, prompts[:1], 1) == fast_1
    assert _generate(model, prompts, 3) == fast_3


def test_one_decode_plan_a_step(model, monkeypatch):
    """The kv context asks the backend for its plan once a step, at the first decoding layer, and
    hands every layer of the step that one (so each layer's `decode` reads the same object); the
    tokens are those of the plain engine (the test above runs the same prompts without plans)."""
    made, used = [], []
    real_plan, real_decode = pt.TorchPagedAttention.plan_decode, pt.TorchPagedAttention.decode

    def plan_decode(self, *a):
        made.append(real_plan(self, *a))
        return made[-1]

    def decode(self, *a, plan=None, **kw):
        used.append(plan)
        return real_decode(self, *a, plan=plan, **kw)

    monkeypatch.setattr(pt.TorchPagedAttention, "plan_decode", plan_decode)
    monkeypatch.setattr(pt.TorchPagedAttention, "decode", decode)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (9, 30, 17)]
    got = _generate(model, prompts, 3)
    L = model.cfg.n_layers
    assert L > 1 and made and len(used) == L * len(made)
    assert all(used[i] is made[i // L] for i in range(len(used)))
    monkeypatch.undo()
    assert got == _generate(model, prompts, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_contiguous_decode_on_strided_caches_and_queries(dtype):
    """The view path's one-call views need caches laid out as the engine's are; a cache that is
    itself a strided view (here: every other kv head of a wider one) and a query that is a transposed
    view take the general slicing, with the reference's output either way (bf16: bit for bit)."""
    wide_k, wide_v, g = _cache(dtype, G=4)
    kc, vc = wide_k[:, :, ::2], wide_v[:, :, ::2]  # [nb, BS, 2, 32], not contiguous
    assert not kc.is_contiguous()
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=0, rtol=0)
    for ctx in (1, 16, 37):
        q = torch.randn(8, 1, 32, generator=g).to(dtype).transpose(0, 1)  # [1, 8, 32], strided
        first = 3 * BS
        table = torch.arange(3, 3 + -(-ctx // BS), dtype=torch.int32)[None]
        lens = torch.tensor([ctx], dtype=torch.int32)
        ref = paged_attention_decode_torch(q, kc, vc, table, lens, 0.2)
        torch.testing.assert_close(pt.decode_contiguous(q, kc, vc, first, ctx, 0.2), ref, **tol)
        torch.testing.assert_close(pt.decode_contiguous(q, kc.contiguous(), vc.contiguous(), first, ctx, 0.2), ref,
                                   **tol)
