"""`MTPProposer` (`speculative="mtp"`): the served model's own multi-token-prediction modules
(moe/mtp.py, `model.mtp_depth = D`) draft the k tokens.

Module j (0-based) at position i reads the hidden state h^j_i (h^0: the served model's last block
output, before its final norm) and token t_{i+j+1}, and gives logits for t_{i+j+2} and its own
output h^{j+1}_i. With V verified tokens (t_{V-1} the last, not yet run by the served model), draft
j + 1 is module j's prediction at position V - 2, after module j ran every position up to V - 2
(its tokens reach t_{V-1+j}: the drafts before it): DeepSeek-V3's sequential depths at inference.
For k > D the last module is chained along positions as SGLang's NextN does: at position V - 2 + m
it reads its own previous output in place of the served model's hidden state, and the draft it
made last.

Each module has its own paged KV cache (a one-layer `ModelRunner`, a `BlockManager`, a shadow
`Sequence` per request whose token at position i is t_{i+j+1}), as `ModelProposer`'s drafting
model has. Only positions whose inputs are all verified stay in a cache: module j keeps V - 1 - j
of them after a round (the rest read drafts and are recomputed next round), and the hidden states
it will need next (h^j of the positions it has not kept) wait in a buffer per module.

The served model's h^0 comes from a forward pre-hook on its final norm (which sees every row
before the runner keeps only the sampled ones) and is taken by `observe(batch)` right after the
served model's forward; rows of positions verification later rejects are dropped at the next
`propose`. Positions the served model did not run (prefix-cache hits) have no h^0: they count as
zeros, which only lowers acceptance (outputs stay the served model's: verification decides).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Callable, Optional

import torch
from torch import nn

from moe.engine.memory.block_manager import BlockManager
from moe.engine.runner.model_runner import ModelRunner
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import ScheduledBatch, Sequence
from moe.errors import ConfigError


def check_mtp_model(target) -> None:
    """A ConfigError when the served model has no MTP modules to draft with."""
    if getattr(target, "mtp", None) is None:
        c = target.cfg
        raise ConfigError(f"speculative method 'mtp' drafts with the served model's multi-token-prediction modules; "
                          f"the served model ({c.n_layers} layers, d_model={c.d_model}, {c.n_experts} experts) has "
                          "model.mtp_depth=0: train it with model.mtp_depth >= 1, or choose 'ngram', 'draft' or 'self'")


class _OneLayerCache:
    """The KV context of one MTP block: its attention (numbered as the model's last layer) is layer 0
    of the module's own cache."""

    def __init__(self, context):
        self.context = context

    def attend(self, _layer_idx, q_BHTd, k_BGTd, v_BGTd, **layer_options):
        # layer_options: the block's sliding window and attention sinks, as the model's layers pass them
        return self.context.attend(0, q_BHTd, k_BGTd, v_BGTd, **layer_options)

    def __getattr__(self, name):  # the rest of the context as is (MLA reads `latent` and `derived`)
        if name == "context":  # (not set yet: no recursion)
            raise AttributeError(name)
        return getattr(self.context, name)


class MTPDraftLayer(nn.Module):
    """One MTP module as a `ModelRunner` model: `hidden_ND` (one row per input token, in the batch's
    order) is set before each forward; `out_ND` keeps the module's output of every row."""

    def __init__(self, target, module):
        super().__init__()
        self._target = [target]  # a list: not a submodule (its 4+ layers are not this model's)
        # A submodule (its parameters stay the served model's, shared): the runner finds the block's
        # experts through `modules()` and runs a one-token step on the chosen experts only
        # (moe/engine/runner/decode_experts.py), as the served model's decode steps do.
        self.module = module
        self.cfg = dataclasses.replace(target.cfg, n_layers=1)
        self.norm = module.norm  # the runner hooks it to keep only the rows it samples
        self.hidden_ND: Optional[torch.Tensor] = None
        self.out_ND: Optional[torch.Tensor] = None

    def forward(self, input_ids, positions, kv_context):
        target, module = self._target[0], self.module
        cos, sin = target.rotary(positions)
        h_BTD, _aux = module(self.hidden_ND[None], target.embed(input_ids), cos, sin, input_ids,
                             _OneLayerCache(kv_context))
        self.out_ND = h_BTD[0]
        return SimpleNamespace(logits=target.lm_head(self.norm(h_BTD)), moe_records=[])


@dataclasses.dataclass
class _Track:
    """One request's MTP state: per module its shadow (num_computed_tokens: the positions kept) and
    the buffered hidden inputs of the positions after those (buffer j starts at shadow j's count)."""

    shadows: list[Sequence]
    buffers: list[torch.Tensor]


class MTPProposer:
    def __init__(self, target, num_blocks: int, block_size: int, backend, device, dtype):
        check_mtp_model(target)
        self.target, self.depth, self.d_model = target, target.mtp.depth, target.cfg.d_model
        self.device, self.dtype = device, dtype
        self.layers = [MTPDraftLayer(target, m) for m in target.mtp.layers]
        self.runners = [ModelRunner(m, num_blocks, block_size, backend, device, dtype) for m in self.layers]
        self.bms = [BlockManager(num_blocks, block_size, enable_prefix_caching=False) for _ in self.layers]
        self.tracks: dict[str, _Track] = {}
        self.captured: Optional[torch.Tensor] = None
        self.hook = target.norm.register_forward_pre_hook(self._capture)

    # ------------------------------------------------------------------ the served model's hidden states
    def _capture(self, _module, args):
        self.captured = args[0]  # [1, N, D]: every row of the forward (before the runner's row selection)

    def observe(self, batch: ScheduledBatch, wanted: Callable[[Sequence], bool]) -> None:
        """Take the served model's hidden states of the `wanted` sequences of `batch` (called right
        after its forward, before their num_computed_tokens move on)."""
        rows, self.captured = self.captured, None
        if rows is None or rows.shape[1] != sum(batch.num_new_tokens):
            return  # no eager forward of this batch to read (nothing to take)
        off = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if wanted(seq):
                self._splice(self._track(seq), seq.num_computed_tokens, rows[0, off:off + n])
            off += n

    def _splice(self, tr: _Track, start: int, new_ND: torch.Tensor) -> None:
        """Put rows of positions start.. into buffer 0 (which starts at module 0's kept count);
        a gap is filled with zeros, rows before the buffer's start are already consumed."""
        base, buf = tr.shadows[0].num_computed_tokens, tr.buffers[0]
        if start < base:
            new_ND, start = new_ND[base - start:], base
        end = base + buf.shape[0]
        if start > end:
            buf = torch.cat([buf, buf.new_zeros(start - end, self.d_model)])
        tr.buffers[0] = torch.cat([buf[:start - base], new_ND.to(self.dtype)])

    def _track(self, seq: Sequence) -> _Track:
        tr = self.tracks.get(seq.request_id)
        if tr is None:
            shadows = [Sequence(seq.request_id, None, [], SamplingParams(), 0.0) for _ in self.layers]
            empty = torch.empty(0, self.d_model, device=self.device, dtype=self.dtype)
            tr = self.tracks[seq.request_id] = _Track(shadows, [empty] * self.depth)
        return tr

    # ------------------------------------------------------------------ drafting
    def propose(self, seqs: list[Sequence], ks: list[int], sample: Callable) -> list[tuple[list[int], Optional[torch.Tensor]]]:
        ext = [list(s.token_ids) for s in seqs]  # verified tokens, then the drafts as they come
        probs: list[list] = [[] for _ in seqs]
        active = [i for i, (s, k) in enumerate(zip(seqs, ks)) if self._prepare(s, k)]
        inputs = {i: self._hidden0(seqs[i]) for i in active}  # module j's hidden inputs, positions kept_j .. V-2
        for j in range(self.depth):
            rows = [i for i in active if ks[i] > j]
            if not rows:
                break
            outs = self._run(j, [(seqs[i], ext[i][j + 1:len(seqs[i].token_ids) + j], inputs[i]) for i in rows])
            self._draw(rows, seqs, ext, probs, sample, [o[0] for o in outs])
            for i, (_, out_ND) in zip(rows, outs):
                inputs[i] = self._advance(seqs[i], j, inputs[i], out_ND, continues=ks[i] > j + 1)
        self._chain(seqs, ks, ext, probs, sample, [i for i in active if ks[i] > self.depth], inputs)
        for i in active:
            self._keep_verified(seqs[i])
        return [(e[len(s.token_ids):], torch.stack(p) if p and p[0] is not None else None)
                for s, e, p in zip(seqs, ext, probs)]

    def _prepare(self, seq: Sequence, k: int) -> bool:
        """Room in every module's cache for this round's positions (else the request drafts nothing
        this round and starts over)."""
        tr, V = self._track(seq), seq.num_tokens
        for j, (sh, bm) in enumerate(zip(tr.shadows, self.bms)):
            extra = max(k - self.depth, 0) if j == self.depth - 1 else 0
            if j < k and not bm.allocate_slots(sh, V - 1 - sh.num_computed_tokens + extra):
                self.drop(seq.request_id)
                return False
        return True

    def _hidden0(self, seq: Sequence) -> torch.Tensor:
        """h^0 of module 0's positions kept .. V - 2 (rejected positions' rows dropped; missing rows: zeros)."""
        tr = self.tracks[seq.request_id]
        n = seq.num_tokens - 1 - tr.shadows[0].num_computed_tokens
        buf = tr.buffers[0][:n]
        if buf.shape[0] < n:
            buf = torch.cat([buf, buf.new_zeros(n - buf.shape[0], self.d_model)])
        tr.buffers[0] = buf
        return buf

    def _run(self, j: int, items: list[tuple[Sequence, list[int], torch.Tensor]]):
        """Module j over each item's new positions (shadow tokens, hidden rows): per item, (the logits
        of its last position, the module's outputs of its new positions)."""
        layer, shadows = self.layers[j], []
        for seq, tokens, _h in items:
            sh = self.tracks[seq.request_id].shadows[j]
            sh.token_ids = tokens
            shadows.append(sh)
        order = sorted(range(len(items)), key=lambda r: shadows[r].num_tokens - shadows[r].num_computed_tokens != 1)
        batch = ScheduledBatch()
        batch.seqs = [shadows[r] for r in order]
        batch.num_new_tokens = [s.num_tokens - s.num_computed_tokens for s in batch.seqs]
        batch.num_decodes = sum(1 for n in batch.num_new_tokens if n == 1)
        layer.hidden_ND = torch.cat([items[r][2][-n:] for r, n in zip(order, batch.num_new_tokens)])
        logits, _sampled, _ = self.runners[j].execute(batch)
        out, off = [None] * len(items), 0
        for pos, (r, n) in enumerate(zip(order, batch.num_new_tokens)):
            out[r] = (logits[pos:pos + 1], layer.out_ND[off:off + n])
            batch.seqs[pos].num_computed_tokens += n
            off += n
        layer.hidden_ND = layer.out_ND = None
        return out

    def _draw(self, rows, seqs, ext, probs, sample, logits):
        toks, qs = sample(torch.cat(logits), [seqs[i] for i in rows], [SimpleNamespace(token_ids=ext[i]) for i in rows])
        for r, i in enumerate(rows):
            ext[i].append(toks[r])
            probs[i].append(qs[r])

    def _advance(self, seq: Sequence, j: int, h_in: torch.Tensor, out_ND: torch.Tensor, continues: bool):
        """After module j ran positions kept_j .. V-2: its buffer keeps the verified-input positions it
        will rerun, and the next module's inputs (its buffer, then these outputs) are returned."""
        tr, V = self.tracks[seq.request_id], seq.num_tokens
        first = V - 1 - h_in.shape[0]  # h_in: positions first .. V-2
        keep = V - 1 - j  # module j's positions whose inputs are all verified
        upto = V - j if j else V - 1  # h^j_i is verified up to V-1-j (h^0: up to V-2)
        tr.buffers[j] = h_in[keep - first:upto - first]
        if j + 1 >= self.depth:
            return out_ND
        nxt = torch.cat([tr.buffers[j + 1], out_ND])
        if not continues:  # the next module does not run this round: keep its verified inputs for later
            tr.buffers[j + 1] = nxt[:keep - tr.shadows[j + 1].num_computed_tokens]
        return nxt

    def _chain(self, seqs, ks, ext, probs, sample, rows, inputs) -> None:
        """Drafts D+1..k: the last module one position further each time, on its own output."""
        j = self.depth - 1
        h = {i: inputs[i][-1:] for i in rows}
        for m in range(self.depth, max((ks[i] for i in rows), default=0)):
            rows = [i for i in rows if ks[i] > m]
            outs = self._run(j, [(seqs[i], ext[i][j + 1:], h[i]) for i in rows])  # up to the last draft
            self._draw(rows, seqs, ext, probs, sample, [o[0] for o in outs])
            for i, (_, out_ND) in zip(rows, outs):
                h[i] = out_ND

    def _keep_verified(self, seq: Sequence) -> None:
        """Roll every module's cache back to the positions whose inputs are all verified."""
        tr, V = self.tracks[seq.request_id], seq.num_tokens
        for j, (sh, bm) in enumerate(zip(tr.shadows, self.bms)):
            keep = min(sh.num_computed_tokens, V - 1 - j)
            sh.num_computed_tokens = keep
            del sh.token_ids[keep:]
            bm.trim(sh, keep)

    # ------------------------------------------------------------------ requests that end
    def release(self, live: set) -> None:
        for rid in [r for r in self.tracks if r not in live]:
            self.drop(rid)

    def drop(self, request_id: str) -> None:
        tr = self.tracks.pop(request_id, None)
        if tr is not None:
            for sh, bm in zip(tr.shadows, self.bms):
                bm.free(sh)
