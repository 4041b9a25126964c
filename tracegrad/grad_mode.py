"""Grad mode: `no_grad`, `enable_grad`, `set_grad_enabled`, `inference_mode`.

The state is per thread, as in PyTorch. The current trace lives here too because `bind`
reads all of it on every op: `trace`, the one every op is handed to (the eager trace,
`ops/trace.py`, unless another is entered), and `tracer`, the active graph trace (lazy
values: building a backward graph, tracing a compiled function), or None.
"""

from __future__ import annotations

import functools
import threading


_eager_trace = None  # the bottom trace, installed by `ops/trace.py` (a layer above this one)


class _ModeState(threading.local):
    def __init__(self):
        self.grad_enabled = True
        self.inference = False
        self.tracer = None
        self.trace = _eager_trace


MODE = _ModeState()


def set_eager_trace(trace) -> None:
    """Install the trace that is current when no other is entered (in every thread)."""
    global _eager_trace
    _eager_trace = trace
    if MODE.tracer is None:
        MODE.trace = trace


def is_grad_enabled() -> bool:
    return MODE.grad_enabled


def is_inference_mode_enabled() -> bool:
    return MODE.inference


class _DecoratorContextManager:
    """Usable as `with cm():` and as `@cm()` (and `@cm` for the classes taking no args)."""

    def __call__(self, fn=None):
        if fn is None:
            return self
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.clone():
                return fn(*args, **kwargs)
        return wrapper

    def clone(self):
        return self.__class__()

    def __new__(cls, *args, **kwargs):
        # `@no_grad` (no parentheses) passes the function as the only argument.
        if len(args) == 1 and callable(args[0]) and not kwargs and cls._takes_no_args:
            instance = super().__new__(cls)
            instance.__init__()
            return instance(args[0])
        return super().__new__(cls)

    _takes_no_args = True


class no_grad(_DecoratorContextManager):
    def __enter__(self):
        self.prev = MODE.grad_enabled
        MODE.grad_enabled = False

    def __exit__(self, *exc):
        MODE.grad_enabled = self.prev


class enable_grad(_DecoratorContextManager):
    def __enter__(self):
        self.prev = MODE.grad_enabled
        MODE.grad_enabled = True

    def __exit__(self, *exc):
        MODE.grad_enabled = self.prev


class set_grad_enabled(_DecoratorContextManager):
    """`set_grad_enabled(False)` sets the mode at once (as a function) and restores it on
    exit when used as a context manager, like PyTorch."""

    _takes_no_args = False

    def __init__(self, mode: bool):
        self.prev = MODE.grad_enabled
        self.mode = bool(mode)
        MODE.grad_enabled = self.mode

    def __call__(self, fn=None):
        # As a decorator it must not leave the mode set by __init__ in place.
        MODE.grad_enabled = self.prev
        return super().__call__(fn)

    def clone(self):
        return self.__class__(self.mode)

    def __enter__(self):
        MODE.grad_enabled = self.mode

    def __exit__(self, *exc):
        MODE.grad_enabled = self.prev


class inference_mode(_DecoratorContextManager):
    """Nothing is recorded or saved; tensors created inside are inference tensors."""

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)

    def clone(self):
        return self.__class__(self.mode)

    def __enter__(self):
        self.prev = (MODE.grad_enabled, MODE.inference)
        if self.mode:
            MODE.grad_enabled = False
            MODE.inference = True
        else:
            MODE.inference = False

    def __exit__(self, *exc):
        MODE.grad_enabled, MODE.inference = self.prev
