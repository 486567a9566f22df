import math

import pytest
import torch

from moe.routing.metrics import MoERecord, RoutingWindow, entropy


def test_entropy_of_known_distributions():
    assert float(entropy(torch.tensor([0.25] * 4))) == pytest.approx(math.log(4))
    assert float(entropy(torch.tensor([1.0, 0.0, 0.0]))) == pytest.approx(0.0)
    assert float(entropy(torch.tensor([0.5, 0.5, 0.0]))) == pytest.approx(math.log(2))


def _record(counts, probs):
    probs = torch.tensor(probs)
    return MoERecord(counts_E=torch.tensor(counts), selected_E=torch.tensor(counts),
                     entropy_sum=entropy(probs).sum(), n_tokens=probs.shape[0], n_dropped=torch.tensor(0),
                     aux_loss=torch.tensor(1.0), z_loss=torch.tensor(0.5))


def test_window_summary_uniform_and_collapsed():
    w = RoutingWindow()
    w.add([_record([5, 5, 5, 5], [[0.25] * 4] * 10), _record([20, 0, 0, 0], [[1.0, 0, 0, 0]] * 10)])
    s, loads = w.summarize()
    assert s["moe/layer0/token_entropy_norm"] == pytest.approx(1.0)
    assert s["moe/layer0/load_entropy_norm"] == pytest.approx(1.0)
    assert s["moe/layer0/load_imbalance"] == pytest.approx(1.0)
    assert s["moe/layer0/load_cv"] == pytest.approx(0.0)
    assert s["moe/layer1/token_entropy_norm"] == pytest.approx(0.0)
    assert s["moe/layer1/load_entropy_norm"] == pytest.approx(0.0)
    assert s["moe/layer1/load_imbalance"] == pytest.approx(4.0)
    assert s["moe/layer1/dead_experts"] == 3
    assert s["moe/load_imbalance"] == pytest.approx(2.5)
    assert loads == [[0.25] * 4, [1.0, 0.0, 0.0, 0.0]]


def test_window_accumulates_and_counts_drops():
    w = RoutingWindow()
    r = _record([3, 1], [[0.5, 0.5]] * 4)
    r.n_dropped = torch.tensor(2)
    r.selected_E = torch.tensor([5, 1])
    w.add([r])
    w.add([_record([0, 4], [[0.5, 0.5]] * 4)])
    s, loads = w.summarize()
    assert loads == [[3 / 8, 5 / 8]]
    assert s["moe/dropped_frac"] == pytest.approx(2 / 10)
    assert s["moe/dead_experts"] == 0
