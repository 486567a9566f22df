"""The one routing pass of the expert analysis (eval/analysis/collect.py): what it records equals
the routers' own choices window by window and the model's own expert counts, in window order,
with MoE layers named by their model index; and the domains' text is read within its budget."""

from __future__ import annotations

import pytest
import torch

from eval.analysis import stats
from eval.analysis.collect import Window, collect_routing, domain_tokens, windows_of
from eval.common import EvalError
from moe.model import Transformer
from moe.routing.probe import capture_routing
from tests.conftest import tiny_model_config


class CharTokenizer:
    """Enough of a tokenizer for reading domains: one id per character."""

    eos_id = 2

    def encode(self, text: str) -> list[int]:
        return [3 + ord(c) % 90 for c in text]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(tiny_model_config(n_layers=3, n_dense_layers=1)).eval()


def test_the_record_is_each_routers_choices_in_window_order(model):
    g = torch.Generator().manual_seed(1)
    lengths, domains = [16, 16, 16, 9, 16], [0, 0, 1, 1, 2]
    windows = [Window(d, torch.randint(0, 97, (n,), generator=g).tolist()) for d, n in zip(domains, lengths)]
    windows[4].split = 5
    record = collect_routing(model, windows, batch_size=2, progress=False)
    assert record.layers == [1, 2] and record.n_experts == 4 and record.top_k == 2  # layer 0 is dense
    assert record.n_tokens == sum(lengths) and record.experts_LNK.shape == (2, sum(lengths), 2)
    assert record.token_ids_N.tolist() == [t for w in windows for t in w.token_ids]
    assert record.domain_N.tolist() == [d for d, n in zip(domains, lengths) for _ in range(n)]
    assert record.generated_N.tolist() == [False] * 57 + [False] * 5 + [True] * 11
    for i, w in enumerate(windows):
        ids = torch.tensor([w.token_ids])
        alone = [out.experts_TK for _, _, out in capture_routing(model, ids)]
        mine = record.experts_LNK[:, record.window_N == i]
        for layer in range(2):
            assert torch.equal(mine[layer], alone[layer])
        # The model's own per-layer expert counts (its MoERecords) agree with the record.
        with torch.no_grad():
            counts = [r.counts_E for r in model(ids).moe_records]
        for layer in range(2):
            assert stats.masks_of(mine[layer], 4).sum(0).tolist() == counts[layer].tolist()
    part = record.select(record.domain_N == 1)
    assert part.n_tokens == 25 and torch.equal(part.experts_LNK, record.experts_LNK[:, 32:57])


def test_domain_text_is_read_within_the_budget(tmp_path):
    tok = CharTokenizer()
    long = tmp_path / "long.txt"
    long.write_text("abcdefghij" * 10_000)
    assert domain_tokens(str(long), tok, 50) == tok.encode("abcdefghij" * 5)
    short = tmp_path / "short.txt"
    short.write_text("tiny file")
    assert domain_tokens(str(short), tok, 50) == tok.encode("tiny file") + [2]  # all of it: one document + eos
    code = domain_tokens("pystdlib", tok, 300)
    assert len(code) == 300
    with pytest.raises(EvalError, match="is not a file"):
        domain_tokens(str(tmp_path / "missing.txt"), tok, 10)
    assert windows_of(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
