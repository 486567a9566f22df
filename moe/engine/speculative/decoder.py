"""`SpecDecoder`: the engine's speculative decoding, around an unchanged scheduler and runner.

Per step: (1) before scheduling, every running sequence that decodes speculatively and is fully
computed gets k proposals appended to its `token_ids` (`num_draft_tokens` says how many); the
scheduler then sees 1 + k uncomputed tokens and schedules them like a prefill chunk (the extend
path of the paged cache), so budget, chunking and preemption apply unchanged; (2) a sequence with
proposals that is not scheduled (preempted, out of budget) has them taken back at once; (3) the
runner returns logits for every position from the last verified token on, and `verify` accepts a
prefix (`moe.engine.speculative.rejection`); `verify_drafts` rolls the sequence back to its
verified tokens (its `num_computed_tokens`, prefix-cache hashes only over verified tokens, and
surplus KV blocks released with `BlockManager.trim`: `moe.engine.speculative.verifier`) and
returns the tokens to emit per sequence (`NewTokens`); the engine appends them one by one through
the same stop checks as a plain decode token.
"""

from __future__ import annotations

from typing import Optional

import torch

from moe.engine.config import OFF, SpeculativeConfig
from moe.engine.memory.block_manager import BlockManager
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import NewTokens, ScheduledBatch, Sequence
from moe.engine.speculative.mtp import MTPProposer
from moe.engine.speculative.proposers import ModelProposer, NgramProposer, SelfDraftModel
from moe.engine.speculative.rejection import draw, target_probs, verify
from moe.engine.speculative.verifier import discard, drop_proposals, logprob_dicts, roll_back
from moe.errors import ConfigError, RequestError
from moe.loading import load_model

# spec_first_accepted: steps whose first proposal was accepted (the first-draft acceptance DeepSeek-V3
# reports for MTP, section 5.4.3)
COUNTERS = ("spec_steps", "spec_proposed", "spec_accepted", "spec_emitted", "spec_first_accepted")


class SpecDecoder:
    def __init__(self, default: Optional[SpeculativeConfig], target, num_blocks: int, block_size: int, backend,
                 device, dtype, max_num_seqs: int, generator: torch.Generator):
        self.default, self.target = default, target
        self.cache_args = (num_blocks + max_num_seqs, block_size, backend, device, dtype)
        self.generator = generator
        self.proposers: dict[tuple, object] = {}
        self.drafted: list[Sequence] = []  # sequences holding proposals this step
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.draft_model = None
        if default is not None and default.method == "draft":
            m = default.model
            if m is None:
                raise ConfigError("speculative method 'draft' needs speculative.model: a checkpoint path or a "
                                  "Transformer with the served model's tokenizer")
            if isinstance(m, str):
                m, _tok, _cfg = load_model(m, device=device, dtype=dtype)
            m.to(device=device, dtype=dtype).eval()
            if m.cfg.vocab_size != target.cfg.vocab_size:
                raise ConfigError(f"speculative.model has vocab_size={m.cfg.vocab_size} but the served model has "
                                  f"{target.cfg.vocab_size}: a draft model must share the tokenizer")
            self.draft_model = m
        if default is not None:
            self.proposer(default)  # a bad self config (top_k, skip_layers) fails when the engine is built

    # ------------------------------------------------------------------ per request
    def resolve(self, params: SamplingParams) -> Optional[SpeculativeConfig]:
        """The request's speculative config (its own, else the engine's; None: plain decoding);
        a RequestError (param "speculative") when this engine cannot serve it."""
        spec = params.speculative if params.speculative is not None else self.default
        if spec is None or spec == OFF:
            return None
        if spec.method == "draft" and self.draft_model is None:
            raise RequestError("speculative method 'draft' needs the engine's draft model "
                               "(LLM(..., speculative={'method': 'draft', 'model': ...})); this engine has none",
                               param="speculative")
        try:
            self.proposer(spec)
        except ConfigError as e:
            raise RequestError(str(e), param="speculative") from None
        return spec

    def proposer(self, spec: SpeculativeConfig):
        p = self.proposers.get(spec.key)
        if p is None:
            if spec.method == "ngram":
                p = NgramProposer(spec.prompt_lookup_max, spec.prompt_lookup_min)
            elif spec.method == "draft":
                p = ModelProposer(self.draft_model, *self.cache_args)
            elif spec.method == "mtp":  # a ConfigError naming the model when it has no MTP modules
                p = MTPProposer(self.target, *self.cache_args)
            else:
                p = ModelProposer(SelfDraftModel(self.target, spec.top_k, spec.skip_layers), *self.cache_args)
            self.proposers[spec.key] = p
        return p

    # ------------------------------------------------------------------ the step
    def observe(self, batch: ScheduledBatch) -> None:
        """Right after the served model's forward over `batch`: the MTP drafter takes the hidden
        states its sequences' next proposals start from (moe/engine/speculative/mtp.py)."""
        mtp = self.proposers.get(("mtp",))
        if mtp is not None:
            mtp.observe(batch, lambda s: s.spec is not None and s.spec.method == "mtp")

    def propose(self, running: list[Sequence], max_model_len: int) -> None:
        """Append proposals to the running speculative sequences that are fully computed."""
        groups: dict[tuple, list[tuple[Sequence, int]]] = {}
        for seq in running:
            if seq.spec is None or seq.num_draft_tokens or seq.num_computed_tokens != seq.num_tokens - 1:
                continue
            # every emitted token must still fit max_tokens and max_model_len (a step emits up to k + 1)
            k = min(seq.spec.num_tokens, seq.params.max_tokens - seq.num_output_tokens - 1,
                    max_model_len - seq.num_tokens - 1)
            if k >= 1:
                groups.setdefault(seq.spec.key, []).append((seq, k))
        for key, items in groups.items():
            seqs = [s for s, _ in items]
            for seq, (d, q) in zip(seqs, self.proposers[key].propose(seqs, [k for _, k in items], self._sample)):
                if d:
                    seq.token_ids.extend(d)
                    seq.num_draft_tokens, seq.draft_probs = len(d), q
                    self.drafted.append(seq)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], shadows: list[Sequence]):
        """A drafting model's next tokens, drawn as the target would draw (same processing), and
        their distributions (None for greedy requests: their verification needs none)."""
        toks, qs = [], []
        for r, (seq, sh) in enumerate(zip(seqs, shadows)):
            p = target_probs(logits[r:r + 1], seq.params, [sh.token_ids])[0]
            if seq.params.greedy:
                toks.append(int(p.argmax()))
                qs.append(None)
            else:
                toks.append(draw(p, seq.generator or self.generator))
                qs.append(p)
        return toks, qs

    def release(self, running: list[Sequence]) -> None:
        """Free the drafting caches' blocks of sequences no longer running (finished, preempted)."""
        live = {s.request_id for s in running}
        for p in self.proposers.values():
            p.release(live)

    def forget(self, seq: Sequence) -> None:
        """A finished request: free its blocks in the drafting caches."""
        for p in self.proposers.values():
            p.drop(seq.request_id)

    def take_back(self, scheduled: list[Sequence], running: list[Sequence]) -> None:
        """Remove the proposals of every drafted sequence not in `scheduled`; release the drafting
        caches of sequences not `running`."""
        self.release(running)
        keep = {id(s) for s in scheduled}
        for seq in self.drafted:
            if id(seq) not in keep:
                drop_proposals(seq)
        self.drafted = [s for s in self.drafted if id(s) in keep]

    def verify_drafts(self, batch: ScheduledBatch, logits: torch.Tensor, sampled: list[int], rows_per_seq: list[int],
                      block_manager: BlockManager, guided=None) -> tuple[list[NewTokens], Optional[torch.Tensor], list[int]]:
        """Verify the proposals of the drafted sequences among the `sampled` batch positions
        (`rows_per_seq[i]` logits rows each; a guided sequence's rows masked by its grammar through
        `guided`, the engine's GuidedDecoder) and roll each back to its verified tokens. Returns
        (their `NewTokens`: the tokens to emit, or the error; the logits rows and batch positions
        of the other sampled sequences, one row each, for the sampler)."""
        out, plain_rows, plain, row = [], [], [], 0
        for i in sampled:
            seq, c = batch.seqs[i], rows_per_seq[i]
            if not seq.num_draft_tokens:
                plain_rows.append(row)
                plain.append(i)
                row += c
                continue
            lg, row = logits[row:row + c], row + c
            if not bool(torch.isfinite(lg).all()):
                discard(seq)
                out.append(NewTokens(seq, error="the model produced non-finite logits"))
                continue
            toks, acc = self.verify(seq, lg, guided)
            roll_back(seq, acc, len(toks), block_manager)
            lps = logprob_dicts(lg, toks, seq.params.logprobs) if seq.logprobs is not None else [None] * len(toks)
            out.append(NewTokens(seq, toks, lps))
        self.drafted = []
        if len(plain) == len(sampled):
            return out, logits, sampled
        return out, (logits[plain_rows] if plain else None), plain

    def verify(self, seq: Sequence, logits_RV: torch.Tensor, guided=None) -> tuple[list[int], int]:
        """(tokens to emit, drafts accepted) of a drafted sequence given its raw logits rows (a
        guided sequence's are masked here, on a copy: logprobs are reported unmasked, as the
        sampler reports them)."""
        L = seq.num_tokens - seq.num_draft_tokens
        drafts = seq.token_ids[L:]
        R = logits_RV.shape[0]
        if seq.grammar is not None:
            logits_RV = logits_RV.float().clone()
            guided.mask_drafts(seq.grammar, drafts, logits_RV)
        contexts = [seq.token_ids[:L + j] for j in range(R)] if seq.params.repetition_penalty != 1.0 else [()] * R
        p = target_probs(logits_RV, seq.params, contexts)
        toks, _rows, acc = verify(p, drafts, seq.draft_probs, seq.params.greedy, seq.generator or self.generator)
        m, c = seq.metrics, self.counters
        m.spec_steps += 1
        m.spec_proposed += len(drafts)
        m.spec_accepted += acc
        c["spec_steps"] += 1
        c["spec_proposed"] += len(drafts)
        c["spec_accepted"] += acc
        c["spec_emitted"] += len(toks)
        c["spec_first_accepted"] += int(acc >= 1)
        return toks, acc

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict:
        c = self.counters
        out = dict(c)
        out["spec_acceptance_rate"] = c["spec_accepted"] / c["spec_proposed"] if c["spec_proposed"] else 0.0
        out["spec_mean_accepted_length"] = c["spec_accepted"] / c["spec_steps"] if c["spec_steps"] else 0.0
        out["spec_first_acceptance_rate"] = c["spec_first_accepted"] / c["spec_steps"] if c["spec_steps"] else 0.0
        return out

    def reset_stats(self) -> None:
        self.counters = dict.fromkeys(COUNTERS, 0)

