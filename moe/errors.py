"""The project's exception types, in a leaf module that imports nothing from `moe`.

Every layer raises these (config schema, registries, variants, checkpoints, the engine), so
they live below all of them: importing an error type never pulls in the code that raises it.
The entry points (`train.py`, `python -m eval`, `python -m moe.serve`, `python -m moe.hf`, ...)
turn a `UserError` into one line on stderr and exit code 2; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the person running the code (a config value, a path, a request): the
    message names what is wrong and what is allowed, so no traceback is needed."""


class ConfigError(UserError, ValueError):
    """A bad configuration value; the message names the field and the allowed values."""


class UnavailableError(ConfigError):
    """A variant that exists but cannot run on this machine (flash-attn without CUDA, Triton
    kernels on a plain CPU); the message says why and what to use instead."""


class CheckpointError(UserError, RuntimeError):
    """A missing, corrupt or incompatible checkpoint."""


class RequestError(UserError, ValueError):
    """An inference request the engine cannot serve (empty or too long prompt, token ids outside
    the vocabulary, bad sampling values). `param` names the offending request field, so a server
    can answer a 400 that points at it."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


def check_option_names(given, known: list, what: str) -> None:
    """A ConfigError naming the keys of `given` not in `known`, and the known ones (a typo in an
    options dict must not fall back to a default silently)."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(f"unknown {what} option(s) {unknown}; the options are {list(known)}")
