"""Proposers (moe/engine/speculative/proposers.py) at their edges: the gaps the fifth mutation run
found (docs/results/mutation/run4_engine/README.md). test_proposers.py checks the lookup against
a plain search and the self-drafting forward; these check the self-drafting model's refusals (each
message names the field and the allowed range) and which routers it rebuilds, and the drafting
model's shadow sequences one call at a time: the rollback to the common prefix, each sequence's
own k, a drafting cache too short for k, the order of the logits, and the release of shadows."""

from __future__ import annotations

import copy

import pytest
import torch

from moe.attention import paged_backend
from moe.config import ModelConfig
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence
from moe.engine.speculative.proposers import ModelProposer, SelfDraftModel
from moe.engine.speculative.rejection import target_probs
from moe.errors import ConfigError
from moe.model import Transformer
from moe.routing.routers import router_config
from tests.conftest import with_variants

BS = 4


@pytest.fixture(scope="module")
def three_layers(make_model):
    return make_model(260, n_layers=3)


@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens recomputed from scratch (not the `naive` fixture: its cache is keyed by id(model),
    which a model made inside a test may share with one garbage-collected before it)."""
    ids = list(ids)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def without_layers(model, *skip: int, top_k=None) -> Transformer:
    """The reference of a self-drafting pass: a copy of the model rerouted, the skipped layers deleted."""
    ref = copy.deepcopy(model)
    if top_k is not None:
        ref.set_routing(top_k=top_k)
    for i in sorted(skip, reverse=True):
        del ref.layers[i]
    return ref


@pytest.mark.parametrize("skip", [(3,), (0, 1, 2), (0, 1, 2, 5)])
def test_self_draft_refuses_skipping_a_missing_layer_or_every_layer(three_layers, skip):
    with pytest.raises(ConfigError) as e:
        SelfDraftModel(three_layers, top_k=None, skip_layers=skip)
    assert str(e.value) == f"speculative.skip_layers={list(skip)} must name some, not all, of the model's layers 0..2"


def test_self_draft_refuses_a_top_k_above_the_models_and_a_pass_no_cheaper(three_layers):
    with pytest.raises(ConfigError, match=r"^speculative\.top_k=3 must be <= the model's router top_k=2$"):
        SelfDraftModel(three_layers, top_k=3, skip_layers=(1,))
    for top_k in (None, 2):
        with pytest.raises(ConfigError, match=r"^speculative method 'self' needs a cheaper drafting pass: a top_k "
                                              r"below the model's 2 and/or skip_layers$"):
            SelfDraftModel(three_layers, top_k=top_k, skip_layers=())


@torch.no_grad()
def test_the_models_own_top_k_with_skipped_layers_rebuilds_no_router(three_layers):
    """top_k equal to the model's is allowed beside skip_layers (the top_k <= bound), and the
    drafting pass then routes exactly as the target: no router rebuilt, the target's config kept."""
    draft = SelfDraftModel(three_layers, top_k=2, skip_layers=(2,))
    assert draft.routers == {} and draft.cfg.router.top_k == 2
    plain = SelfDraftModel(three_layers, top_k=None, skip_layers=(2,))
    assert plain.cfg is three_layers.cfg
    ids = torch.randint(4, 260, (1, 7), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(7).unsqueeze(0)
    assert torch.equal(draft(ids, pos, None).logits, plain(ids, pos, None).logits)
    assert torch.allclose(plain(ids, pos, None).logits, without_layers(three_layers, 2)(ids).logits, atol=1e-5)


@torch.no_grad()
def test_self_draft_rebuilds_the_routers_of_the_moe_layers_it_runs_only(make_model):
    """A dense first layer has no router to rebuild; a skipped MoE layer needs none."""
    model = make_model(260, n_layers=3, n_dense_layers=1)
    draft = SelfDraftModel(model, top_k=1, skip_layers=(2,))
    assert sorted(draft.routers) == [1]
    assert draft.routers[1].weight is model.layers[1].ffn.router.weight  # shared, not copied
    ids = torch.randint(4, 260, (1, 5), generator=torch.Generator().manual_seed(4))
    out = draft(ids, torch.arange(5).unsqueeze(0), None)
    assert out.logits.shape == (1, 5, 260) and out.moe_records == []
    assert torch.allclose(out.logits, without_layers(model, 2, top_k=1)(ids).logits, atol=1e-5)
    assert model.layers[1].ffn.router is not draft.routers[1]  # the target's router is back after the pass


def proposer(model, num_blocks: int = 32) -> ModelProposer:
    return ModelProposer(model, num_blocks, BS, paged_backend("torch", "cpu"), torch.device("cpu"), torch.float32)


def request(rid: str, ids: list[int], temperature: float = 0.0) -> Sequence:
    seq = Sequence(rid, None, ids, SamplingParams(temperature=temperature), 0.0)
    seq.num_computed_tokens = len(ids) - 1
    return seq


def greedy_sample(logits, seqs, shadows):
    """The drafting draw of greedy requests (SpecDecoder._sample's greedy branch)."""
    return [int(r.argmax()) for r in logits], [None] * len(seqs)


def test_sync_rolls_the_shadow_back_to_the_common_prefix(model):
    p = proposer(model)
    seq = request("a", [10, 11, 12, 13, 14, 15, 16])
    sh = p._sync(seq)
    assert p.shadows == {"a": sh} and sh.request_id == "a"
    assert sh.token_ids == seq.token_ids and sh.token_ids is not seq.token_ids and sh.num_computed_tokens == 0
    assert p.bm.allocate_slots(sh, 7)
    sh.num_computed_tokens = 7  # the shadow has run every token the sequence has
    assert p._sync(seq) is sh and sh.num_computed_tokens == 6  # the last one is fed again for its logits
    sh.token_ids += [90, 91]  # two proposals of the shadow's, then the target rejected the second
    sh.num_computed_tokens = 8
    seq.token_ids += [90, 40]
    p._sync(seq)
    assert sh.token_ids == seq.token_ids and sh.num_computed_tokens == 8
    sh.num_computed_tokens = 9
    seq.token_ids[3:] = [77, 78]  # a change at position 3: everything from there is recomputed
    p._sync(seq)
    assert sh.token_ids == seq.token_ids and sh.num_computed_tokens == 3
    assert len(sh.block_table) == 1 and p.bm.num_free_blocks == 32 - 1  # surplus blocks released


@torch.no_grad()
def test_each_sequence_drafts_its_own_k_from_its_own_context(model):
    p = proposer(model)
    prompts = [[20, 21, 22, 23, 24], [30, 31, 32, 33, 34, 35, 36, 37, 38], [40, 41]]
    seqs = [request(f"r{i}", ids) for i, ids in enumerate(prompts)]
    out = p.propose(seqs, [3, 1, 2], greedy_sample)
    assert [d for d, _ in out] == [greedy(model, ids, k) for ids, k in zip(prompts, [3, 1, 2])]
    assert all(q is None for _, q in out)
    # the next call: every shadow synced with the sequence as the target left it (one proposal
    # accepted, then a token of the target's), drafting again from there
    for seq, (d, _) in zip(seqs, out):
        seq.token_ids += [d[0], 7]
        seq.num_computed_tokens = seq.num_tokens - 1
    again = p.propose(seqs, [2, 2, 2], greedy_sample)
    assert [d for d, _ in again] == [greedy(model, s.token_ids, 2) for s in seqs]


def test_sampled_drafts_return_their_distributions_stacked(model):
    p = proposer(model)
    seq = request("s", [50, 51, 52, 53], temperature=1.0)

    def sample(logits, seqs, shadows):
        qs = [target_probs(logits[r:r + 1], s.params, [()])[0] for r, s in enumerate(seqs)]
        return [int(q.argmax()) for q in qs], qs

    ((d, q),) = p.propose([seq], [3], sample)
    assert len(d) == 3 and q.shape == (3, 260)
    assert torch.allclose(q.sum(-1), torch.ones(3)) and [int(r.argmax()) for r in q] == d


def test_a_drafting_cache_too_short_for_k_drafts_nothing_for_that_sequence(model):
    """9 tokens and k = 4 need 9 + 3 slots (the k - 1 fed-back proposals): exactly 3 blocks of 4."""
    p = proposer(model, num_blocks=3)
    ids = list(range(60, 69))
    (fits,) = p.propose([request("f", ids)], [4], greedy_sample)
    assert len(fits[0]) == 4
    p.drop("f")
    assert p.bm.num_free_blocks == 3 and p.shadows == {}
    (short,) = p.propose([request("s", ids)], [5], greedy_sample)  # 13 slots: 4 blocks
    assert short == ([], None) and p.shadows == {} and p.bm.num_free_blocks == 3


@torch.no_grad()
def test_forward_returns_each_shadows_logits_in_the_order_given(model):
    """A prefill (several new tokens) before a decode in the list: the runner takes decodes first,
    the logits come back in the caller's order."""
    p = proposer(model)
    dec, pre = request("d", [70, 71, 72, 73, 74]), request("p", [80, 81, 82])
    p.propose([dec], [1], greedy_sample)
    sh_dec, sh_pre = p._sync(dec), p._sync(pre)
    assert sh_dec.num_tokens - sh_dec.num_computed_tokens == 1 and sh_pre.num_computed_tokens == 0
    for seq in (dec, pre):
        assert p.bm.allocate_slots(p.shadows[seq.request_id], 3)
    logits = p._forward([sh_pre, sh_dec])
    want = torch.stack([model(torch.tensor([s.token_ids])).logits[0, -1] for s in (pre, dec)])
    assert torch.allclose(logits, want, atol=1e-4)
    assert (sh_pre.num_computed_tokens, sh_dec.num_computed_tokens) == (3, 5)


def test_release_drops_the_shadows_of_requests_no_longer_live(model):
    p = proposer(model)
    p.propose([request(r, [90, 91, 92, 93, 94]) for r in "abc"], [2, 2, 2], greedy_sample)
    used = p.bm.num_used_blocks
    assert set(p.shadows) == {"a", "b", "c"} and used > 0
    p.release({"b", "zzz"})
    assert set(p.shadows) == {"b"} and p.bm.num_used_blocks == len(p.shadows["b"].block_table) == used // 3
    p.drop("b")
    p.drop("b")  # twice, or an id it never drafted for: nothing to free
    assert p.shadows == {} and p.bm.num_used_blocks == 0


def hash_model() -> Transformer:
    torch.manual_seed(2)
    cfg = with_variants(ModelConfig(vocab_size=260, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, n_experts=4,
                                    expert_hidden=64, max_seq_len=256), router_config("hash", top_k=2))
    return Transformer(cfg).eval()


@torch.no_grad()
def test_a_hash_routed_model_drafts_by_skipping_layers_and_refuses_a_smaller_top_k():
    """The hash router routes by token id (its table has top_k columns): skipping layers keeps it
    routing by the input ids; a smaller top_k is refused, naming the router and the top_k."""
    model = hash_model()
    draft = SelfDraftModel(model, top_k=None, skip_layers=(1,))
    ids = torch.randint(4, 260, (1, 6), generator=torch.Generator().manual_seed(5))
    got = draft(ids, torch.arange(6).unsqueeze(0), None).logits
    assert torch.allclose(got, without_layers(model, 1)(ids).logits, atol=1e-5)
    with pytest.raises(ConfigError) as e:
        SelfDraftModel(model, top_k=1, skip_layers=())
    assert str(e.value) == "router='hash' cannot draft with top_k=1: its buffer 'table' depends on them"


@pytest.mark.parametrize("top_k, skip", [(None, (1,)), (1, (2,)), (1, ())])
def test_self_drafting_through_its_cache_proposes_the_rerouted_models_greedy_tokens(three_layers, top_k, skip):
    """The drafting pass through the paged cache (an extend, then decode steps, then a second call
    that extends the shadow): the greedy tokens of the rerouted model without the skipped layers."""
    p = proposer(SelfDraftModel(three_layers, top_k=top_k, skip_layers=skip))
    ref = without_layers(three_layers, *skip, top_k=top_k)
    seq = request("s", [20, 21, 22, 23, 24, 25])
    ((d, _),) = p.propose([seq], [3], greedy_sample)
    assert d == greedy(ref, seq.token_ids, 3)
    seq.token_ids += d[:2] + [9]  # two accepted, then the target's own token
    seq.num_computed_tokens = seq.num_tokens - 1
    ((d, _),) = p.propose([seq], [3], greedy_sample)
    assert d == greedy(ref, seq.token_ids, 3)


def test_the_drafting_cache_is_built_in_the_engines_dtype_without_prefix_caching(model):
    p = ModelProposer(model, 4, BS, paged_backend("torch", "cpu"), torch.device("cpu"), torch.bfloat16)
    assert p.runner.context.kv.dtype == torch.bfloat16 and p.runner.context.kv.device.type == "cpu"
    assert p.bm.num_blocks == 4 and p.bm.block_size == BS and p.shadows == {}
    assert p.bm.enable_prefix_caching is False  # shadows are private: nothing to share (the module docstring)


def test_a_later_call_allocates_only_what_the_shadow_has_not_computed(model):
    """4 blocks of 4: a 9-token sequence drafts 2 (10 slots), the target accepts one and adds its
    own (11 tokens, 10 computed in the shadow); drafting 6 then needs 1 + 5 slots more: 16, it fits."""
    p = proposer(model, num_blocks=4)
    seq = request("r", list(range(60, 69)))
    ((d, _),) = p.propose([seq], [2], greedy_sample)
    assert len(d) == 2 and p.shadows["r"].num_computed_tokens == 10
    seq.token_ids += [d[0], 5]
    seq.num_computed_tokens = seq.num_tokens - 1
    ((d, _),) = p.propose([seq], [6], greedy_sample)
    assert len(d) == 6 and p.bm.num_free_blocks == 0
