"""Calling a compiled bucket's code directly, without dynamo's guards (vLLM's custom dispatcher).

Every call of a `torch.compile`d function first evaluates the guards of its cache entries (one per
graph: here one per (batch, context) bucket) until one accepts the call: a check of every parameter
tensor, module attribute and global flag the trace read. With the frame evaluation around it that is
host time the graph itself does not need (the compiled engine's time was 2-13% lower without it on
the CPU: docs/results/generate/guard_free_1205), and the runner already knows which graph a step
needs, because it chose the bucket.

So, as vLLM's `TorchCompileWrapperWithCustomDispatcher` does, the first call of a key goes through
the compiled function (compiling if need be); then the cache entry whose guards accept that very
call is found, and its transformed bytecode (dynamo's output: it fetches the graph's inputs from
the frame and calls the compiled graph) becomes a plain function, called directly for that key
from then on. What the guards checked and the key does not name is checked another way or is the
engine's contract:

* global state (grad / inference mode, autocast, deterministic algorithms, default dtype): a
  `GlobalStateGuard` taken at capture, checked at every call (a C++ comparison); a change takes
  the guarded path;
* the caller's key: what the caller can change between steps (the runner: the buckets, the
  identity of each router, which `set_routing` replaces, and of the rotary tables, which another
  engine on the same model past its context, `allow_long_context`, replaces);
* tensors: the bytecode reads them from the frame at every call (new weights are used), and
  inductor's generated code asserts each input's size and stride;
* anything else the trace read (a module attribute changed in place, say) is not watched: the
  model is not to be modified while an engine serves it.

Only single-graph code is captured: code with a graph break calls resume functions, which outside
dynamo would run eagerly (the key then stays on the guarded path).
"""

from __future__ import annotations

import inspect
import types
from typing import Callable, Hashable, Optional

import torch

try:  # dynamo's own (private) API, as vLLM's dispatcher uses; without it every call takes the guarded path
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    GlobalStateGuard = torch._C._dynamo.guards.GlobalStateGuard
except (ImportError, AttributeError):  # pragma: no cover - torch versions without them
    _debug_get_cache_entry_list = GlobalStateGuard = None


def captured_code(fn: Callable, args: tuple) -> Optional[Callable]:
    """The transformed code of the cache entry of `fn` (the function `torch.compile` wrapped) whose
    guards accept the call `fn(*args)`, as a plain function of the same arguments; None if no entry
    accepts it or the entry's code has a graph break."""
    code = fn.__code__
    if _debug_get_cache_entry_list is None:
        return None
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_argcount != len(args):
        return None  # (the frame's locals are the positional arguments only)
    f_locals = dict(zip(code.co_varnames, args))
    for entry in _debug_get_cache_entry_list(code):
        guards = getattr(entry, "guard_manager", None)
        if guards is not None and guards.check(f_locals):
            if any(name.startswith("__resume_at") for name in entry.code.co_names):
                return None  # a graph break: its resume functions would run eagerly outside dynamo
            return types.FunctionType(entry.code, fn.__globals__, code.co_name)
    return None


class GuardFreeCalls:
    """`call(key, compiled, *args)`: `compiled(*args)` (`torch.compile` of the bound method `method`)
    the first time a key is met, and whenever the global state differs from the one at its capture;
    otherwise the captured code of that key's graph, called directly. A `compiled` that is not a
    dynamo-compiled function (a test's stand-in) is always called, and nothing is captured."""

    def __init__(self, method: types.MethodType):
        self.fn, self.owner = method.__func__, method.__self__
        self.direct: dict[Hashable, Optional[tuple]] = {}  # key -> (function, GlobalStateGuard), or None
        self.num_direct = 0  # calls that skipped the guards

    def ready(self, key: Hashable) -> bool:
        """Whether `call(key, ...)` would now call the captured code directly (not trace, not guard)."""
        hit = self.direct.get(key)
        return hit is not None and hit[1].check()

    def call(self, key: Hashable, compiled: Callable, *args):
        if not hasattr(compiled, "_torchdynamo_orig_callable"):
            return compiled(*args)
        if self.ready(key):
            self.num_direct += 1
            return self.direct[key][0](self.owner, *args)
        out = compiled(*args)
        if key not in self.direct:
            code = captured_code(self.fn, (self.owner, *args))
            self.direct[key] = None if code is None else (code, GlobalStateGuard())
        return out
