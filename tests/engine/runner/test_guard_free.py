"""`guard_free`: a compiled function's code, captured per key, called without dynamo's guards: the
entry whose guards accept the call is the one captured (one per shape), a graph break is not
captured, a change of global state goes back through the guards, and a stand-in that is not a
compiled function is called as it is."""

import torch

from moe.engine.runner.guard_free import GuardFreeCalls, captured_code


class Scaled:
    """A method to compile: its `factor` is a Python int the trace bakes in (a guard watches it)."""

    def __init__(self, factor: int):
        self.factor = factor

    def step(self, x):
        return (x * self.factor).sin()

    def broken(self, x):
        y = x.cos()
        torch._dynamo.graph_break()
        return y + 1


def test_captured_code_is_the_entry_whose_guards_accept_the_call():
    torch._dynamo.reset()
    s = Scaled(3)
    compiled = torch.compile(s.step, dynamic=False)
    a, b = torch.randn(2, 3), torch.randn(4, 5)
    compiled(a), compiled(b)  # two graphs, one per shape
    for x in (a, b, torch.randn(4, 5)):
        code = captured_code(Scaled.step, (s, x))
        assert code is not None and torch.equal(code(s, x), compiled(x))
    assert captured_code(Scaled.step, (s, torch.randn(7))) is None  # no graph for this shape
    assert captured_code(Scaled.step, (s,)) is None  # not the function's arguments
    code = captured_code(Scaled.step, (s, a))
    s.factor = 5  # what the guards watch: the guarded call recompiles, the captured code keeps its graph
    assert torch.allclose(compiled(a), (a * 5).sin()) and torch.allclose(code(s, a), (a * 3).sin())


def test_code_with_a_graph_break_is_not_captured():
    torch._dynamo.reset()
    s = Scaled(1)
    compiled = torch.compile(s.broken, dynamic=False)
    x = torch.randn(3)
    assert torch.allclose(compiled(x), x.cos() + 1)
    assert captured_code(Scaled.broken, (s, x)) is None


def test_calls_go_direct_after_the_first_of_a_key_and_back_through_the_guards_on_a_global_change():
    torch._dynamo.reset()
    s = Scaled(2)
    compiled = torch.compile(s.step, dynamic=False)
    calls = GuardFreeCalls(s.step)
    x, y = torch.randn(3), torch.randn(6)
    with torch.inference_mode():
        assert torch.equal(calls.call("x", compiled, x), compiled(x)) and calls.num_direct == 0
        for _ in range(3):
            assert torch.allclose(calls.call("x", compiled, x), (x * 2).sin())
        assert calls.num_direct == 3
        assert torch.allclose(calls.call("y", compiled, y), (y * 2).sin()) and calls.num_direct == 3  # a new key
        assert torch.equal(calls.call("y", compiled, y), compiled(y)) and calls.num_direct == 4
    # outside inference mode (a global state the captured graphs were not traced in): through the guards
    out = calls.call("x", compiled, x)
    assert calls.num_direct == 4 and torch.allclose(out, (x * 2).sin())
    with torch.inference_mode():
        calls.call("x", compiled, x)
    assert calls.num_direct == 5


def test_a_stand_in_for_the_compiled_function_is_called_and_nothing_captured():
    s = Scaled(2)
    calls = GuardFreeCalls(s.step)
    x = torch.randn(3)
    for _ in range(2):
        assert torch.equal(calls.call("x", s.step, x), (x * 2).sin())
    assert calls.direct == {} and calls.num_direct == 0


def test_ready_says_whether_the_next_call_of_a_key_goes_direct():
    """`ready(key)` (the runner swaps the experts' dispatch only when it is False) is True exactly when `call` would
    call the captured code: not for a key never called, nor for one whose code has a graph break (nothing captured),
    nor under another global state than the capture's (here: outside inference mode), where `call` goes through the
    guards; each verdict confirmed by what `call` then does (`num_direct`)."""
    torch._dynamo.reset()
    s = Scaled(2)
    calls = GuardFreeCalls(s.step)
    compiled = torch.compile(s.step, dynamic=False)
    x = torch.randn(3)
    with torch.inference_mode():
        assert not calls.ready("x")
        calls.call("x", compiled, x)
        assert calls.ready("x") and not calls.ready("y")
        calls.call("x", compiled, x)
        assert calls.num_direct == 1
    assert not calls.ready("x")  # global state changed: the guarded path
    calls.call("x", compiled, x)
    assert calls.num_direct == 1
    broken = GuardFreeCalls(s.broken)
    compiled_broken = torch.compile(s.broken, dynamic=False)
    with torch.inference_mode():
        broken.call("b", compiled_broken, x)
        assert "b" in broken.direct and broken.direct["b"] is None  # (met, nothing captured)
        assert not broken.ready("b")
        broken.call("b", compiled_broken, x)
    assert broken.num_direct == 0
