"""Added by the re-run of the first mutation run (docs/results/mutation/rerun1b/, "Continuation (mutL)"):
what the CPU-only tests of the first run's selection could not tell apart.

- Device: every tensor the sampler and the repetition penalty make is on the logits' device, and
  its generators on the sampler's device. Checked on the `meta` device (no data; a tensor made on
  the CPU stays on the CPU there), where a dropped `device=` shows; on the CPU it cannot.
- Default dtype: the top-p and min-p thresholds are fp32 whatever `torch.get_default_dtype()` is
  (under a float64 default the temperature division makes the scaled logits float64, so fp64
  thresholds would move the cut at the boundary).
"""

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

import moe.engine.sampling.sampler as sampler_mod
from moe.engine.sampling.penalties import TokenCounts
from moe.engine.sampling.sampler import Sampler, SamplingParams, apply_repetition_penalty


class _Devices(TorchFunctionMode):
    """(torch function name, device type) of every tensor a torch call takes or returns."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor):
                self.seen.add((getattr(func, "__name__", str(func)), t.device.type))
        return out


def test_repetition_penalty_keeps_its_index_tensors_on_the_logits_device():
    V = 8
    logits = torch.empty(3, V, device="meta")
    counts = TokenCounts(V, torch.device("meta"))
    with _Devices() as d:
        # list path (row 0), counts path for some but not all rows (rows 1 and 2: one group, two rows of three)
        out = apply_repetition_penalty(logits, [[1, 2, 2], counts, counts], [1.5, 1.2, 1.2])
    assert out.device.type == "meta" and out.shape == (3, V)
    assert ("tensor", "meta") in d.seen  # the index tensors were made
    assert {dev for _, dev in d.seen} == {"meta"}, sorted(d.seen)


def test_sampler_makes_every_tensor_on_the_logits_device():
    """A non-greedy batch through temperature, top-k, top-p and min-p up to the draw. On `meta` the
    draw itself cannot run (`exponential_` with a generator has no meta implementation), so the
    check covers every tensor made before it, the noise buffer included."""
    B, V = 3, 8
    logits = torch.empty(B, V, device="meta")
    params = [SamplingParams(temperature=0.7, top_k=3, top_p=0.9, min_p=0.05)] * B
    s = Sampler(seed=0)
    with _Devices() as d:
        with pytest.raises(Exception):  # the draw on meta (see the docstring); everything before it ran
            s.sample(logits, params, [None] * B, [[]] * B)
    names = {n for n, _ in d.seen}
    assert {"tensor", "empty"} <= names, sorted(d.seen)  # the row / temperature / threshold tensors and the noise
    assert {dev for _, dev in d.seen} == {"meta"}, sorted(d.seen)


def test_generators_are_made_on_the_samplers_device(monkeypatch):
    made = []
    real = torch.Generator

    def recording_generator(device=None):
        made.append(device)
        return real()  # a CPU generator stands in: only the device asked for is checked

    monkeypatch.setattr(torch, "Generator", recording_generator)
    dev = torch.device("meta")
    s = Sampler(seed=1, device=dev)
    g = s.new_request_generator(7)
    assert g is not None and s.new_request_generator(None) is None
    assert made == [dev, dev]


def _two_token_logits(ratio: float, rows: int, temperature: float) -> torch.Tensor:
    """fp32 logits [0, l] whose division by `temperature` (float64 under a float64 default)
    gives log(ratio) for the second token to double precision."""
    l32 = torch.tensor(-1.0, dtype=torch.float32).item()
    x = torch.zeros(rows, 2, dtype=torch.float32)
    x[:, 1] = l32
    assert abs(l32 / temperature - math.log(ratio)) < 1e-15
    return x


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def test_min_p_threshold_is_fp32_under_a_float64_default(float64_default):
    """min_p = 0.7 is 0.69999998807907... in fp32. A second token 0.69999999 times as likely as the
    first passes the fp32 threshold (kept, so some of 64 seeded draws pick it); an fp64 threshold
    0.7 would remove it."""
    ratio = 0.69999999
    T = -1.0 / math.log(ratio)
    rows = 64
    logits = _two_token_logits(ratio, rows, T)
    s = Sampler(seed=0)
    res = s.sample(logits, [SamplingParams(temperature=T, min_p=0.7)] * rows, [None] * rows, [[]] * rows)
    picked = set(res.token_ids)
    assert picked == {0, 1}, picked


def test_top_p_threshold_is_fp32_under_a_float64_default(float64_default):
    """top_p = 0.7 is 0.69999998807907... in fp32. With the first token at p = 0.69999999 the mass
    before the second token reaches the fp32 top_p, so top-p removes it (every draw picks token 0);
    an fp64 top_p 0.7 would keep it."""
    p1 = 0.69999999
    ratio = (1 - p1) / p1
    T = -1.0 / math.log(ratio)
    rows = 64
    logits = _two_token_logits(ratio, rows, T)
    s = Sampler(seed=0)
    res = s.sample(logits, [SamplingParams(temperature=T, top_p=0.7)] * rows, [None] * rows, [[]] * rows)
    assert set(res.token_ids) == {0}
    # the control: just above the fp32 threshold's reach (top_p 0.70001) the second token is kept
    res = s.sample(logits, [SamplingParams(temperature=T, top_p=0.70001)] * rows, [None] * rows, [[]] * rows)
    assert set(res.token_ids) == {0, 1}
