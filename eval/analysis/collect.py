"""The text of each domain, cut into windows, and the one pass that records the router choices.

`domain_tokens` reads at most `max_tokens` tokens of a named source: "pystdlib" (the running
interpreter's standard library, the training default `data=pystdlib`, documents in their fixed
order, each followed by <|eos|> as in training) or a UTF-8 text file (read from its start, only
as far as the budget needs). `collect_routing` runs the model over windows once, in eval mode
and without gradients, with forward hooks on the routers (`moe.routing.probe.capture_routing`),
and keeps every MoE layer's expert ids per token: a `RoutingRecord`, from which every
statistic of eval/analysis/stats.py is computed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from tqdm import tqdm

from eval.common import SHARED_DATA, EvalError
from moe.data.sources import iter_stdlib_documents
from moe.routing.probe import capture_routing, moe_routers

PYSTDLIB = "pystdlib"
# The default domains: code (the embedded corpus), children's stories and plays (the shared files).
DEFAULT_DOMAINS = {
    "code": PYSTDLIB,
    "stories": str(SHARED_DATA / "corpus" / "tinystories_valid_head.txt"),
    "plays": str(SHARED_DATA / "corpus" / "tinyshakespeare.txt"),
}


def domain_tokens(source: str, tokenizer, max_tokens: int) -> list[int]:
    """The first `max_tokens` token ids of `source` ("pystdlib" or a text file's path)."""
    eos = getattr(tokenizer, "eos_id", None)
    ids: list[int] = []
    if source == PYSTDLIB:
        for text in iter_stdlib_documents():
            ids += tokenizer.encode(text) + ([eos] if eos is not None else [])
            if len(ids) >= max_tokens:
                break
        return ids[:max_tokens]
    path = Path(source).expanduser()
    if not path.is_file():
        raise EvalError(f"domain source {source!r} is not a file (give 'pystdlib' or a UTF-8 text file)")
    # Read only what the budget needs: ~8 characters a token at first, more while it falls short.
    chars = 8 * max_tokens
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read(chars)
        while True:
            ids = tokenizer.encode(text)
            if len(ids) >= max_tokens:
                return ids[:max_tokens]
            more = f.read(chars)
            if not more:
                return ids + ([eos] if eos is not None else [])  # the whole file: one document
            text += more
            chars *= 2


def windows_of(ids: Sequence[int], seq_len: int) -> list[list[int]]:
    """`ids` cut into consecutive windows of `seq_len` tokens (the last one may be shorter)."""
    return [list(ids[i:i + seq_len]) for i in range(0, len(ids), seq_len)]


@dataclass
class Window:
    """A token sequence of one domain; `split` marks where generated tokens start (prompt + sample)."""

    domain: int
    token_ids: list[int]
    split: Optional[int] = None


@dataclass
class RoutingRecord:
    """The router choices of every MoE layer for every token of a list of windows."""

    layers: list[int]  # the model's layer index of each MoE layer (the first n_dense_layers are dense)
    n_experts: int
    top_k: int
    experts_LNK: torch.Tensor  # int64 [MoE layers, N tokens, k]; the id n_experts marks a dropped slot
    token_ids_N: torch.Tensor
    domain_N: torch.Tensor
    window_N: torch.Tensor  # index of the token's window
    generated_N: torch.Tensor  # bool: the token is at or after its window's `split`

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids_N.numel())

    def select(self, keep_N: torch.Tensor) -> "RoutingRecord":
        """The same record for the tokens where `keep_N` is True."""
        return RoutingRecord(self.layers, self.n_experts, self.top_k, self.experts_LNK[:, keep_N],
                             self.token_ids_N[keep_N], self.domain_N[keep_N], self.window_N[keep_N],
                             self.generated_N[keep_N])


def moe_layer_indices(model) -> list[int]:
    """The model's layer index of each MoE layer, in the order of `moe_routers(model)`."""
    layers = [i for i, block in enumerate(model.layers) if getattr(block, "is_moe", False)]
    if len(layers) != len(moe_routers(model)):
        raise EvalError(f"the model has {len(moe_routers(model))} routers but {len(layers)} MoE blocks")
    return layers


@torch.no_grad()
def collect_routing(model, windows: Sequence[Window], batch_size: int, desc: str = "routing",
                    progress: bool = True) -> RoutingRecord:
    """One eval-mode forward over `windows` (consecutive windows of equal length share a
    batch), recording each MoE layer's expert ids per token, on the CPU, in window order."""
    routers = moe_routers(model)
    if not routers:
        raise EvalError("the model has no MoE layer: there is no routing to analyse")
    device = next(model.parameters()).device
    experts: list[list[torch.Tensor]] = [[] for _ in routers]
    meta: list[tuple[int, int, Window]] = []  # (window index, length, window), in order
    indexed = list(enumerate(windows))
    batches = []
    for _, group in itertools.groupby(indexed, key=lambda iw: len(iw[1].token_ids)):
        group = list(group)
        batches += [group[i:i + batch_size] for i in range(0, len(group), batch_size)]
    bar = tqdm(total=sum(len(w.token_ids) for w in windows), desc=desc, unit="tok", disable=not progress,
               leave=False)
    for batch in batches:
        ids_BT = torch.tensor([w.token_ids for _, w in batch], dtype=torch.long, device=device)
        for layer, (_, _, out) in enumerate(capture_routing(model, ids_BT)):
            experts[layer].append(out.experts_TK.detach().to("cpu", torch.long))
        meta += [(i, len(w.token_ids), w) for i, w in batch]
        bar.update(ids_BT.numel())
    bar.close()
    token_ids, domain, window, generated = [], [], [], []
    for i, n, w in meta:
        token_ids.append(torch.tensor(w.token_ids, dtype=torch.long))
        domain.append(torch.full((n,), w.domain, dtype=torch.long))
        window.append(torch.full((n,), i, dtype=torch.long))
        generated.append(torch.arange(n) >= (w.split if w.split is not None else n))
    return RoutingRecord(
        layers=moe_layer_indices(model), n_experts=routers[0].n_experts, top_k=routers[0].top_k,
        experts_LNK=torch.stack([torch.cat(e) for e in experts]), token_ids_N=torch.cat(token_ids),
        domain_N=torch.cat(domain), window_N=torch.cat(window), generated_N=torch.cat(generated))
