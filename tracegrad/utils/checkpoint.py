"""`tg.utils.checkpoint.checkpoint`: activation checkpointing. The forward runs without
recording a graph (so its intermediate results are not kept); backward runs it again, with
the random state it had the first time, and differentiates that recomputation.

It is a custom `autograd.Function` whose backward calls `tg.autograd.backward` on the
recomputed outputs: gradients reach the inputs (returned from the Function) and every
parameter the function uses (accumulated by that inner backward), for both `use_reentrant`
settings. With `use_reentrant=False` the call is recorded even when no input requires grad
(a parameter inside may), as PyTorch's non-reentrant variant. Eager only: inside
`tg.compile`, call the function directly."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from tracegrad.autograd.engine import backward as autograd_backward
from tracegrad.autograd.function import Function
from tracegrad.creation import zeros
from tracegrad.grad_mode import enable_grad
from tracegrad.random import generator as global_generator
from tracegrad.tensor import Tensor


def noop_context_fn():
    """The default `context_fn`: no context around the forward or the recomputation."""
    from contextlib import nullcontext
    return nullcontext(), nullcontext()


class _Checkpoint(Function):
    @staticmethod
    def forward(ctx, run_function: Callable, preserve_rng_state: bool, kwargs: dict, anchor, *args):
        ctx.run_function = run_function
        ctx.kwargs = kwargs
        ctx.rng_state = global_generator().bit_generator.state if preserve_rng_state else None
        ctx.tensor_indices = [i for i, arg in enumerate(args) if isinstance(arg, Tensor)]
        ctx.inputs = [None if isinstance(arg, Tensor) else arg for arg in args]
        ctx.save_for_backward(*[arg for arg in args if isinstance(arg, Tensor)])
        return run_function(*args, **kwargs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        inputs = list(ctx.inputs)
        for index, saved in zip(ctx.tensor_indices, ctx.saved_tensors):
            inputs[index] = saved.detach().requires_grad_(saved.requires_grad)
        generator = global_generator()
        if ctx.rng_state is not None:
            current = generator.bit_generator.state
            generator.bit_generator.state = ctx.rng_state
        try:
            with enable_grad():
                outputs = ctx.run_function(*inputs, **ctx.kwargs)
        finally:
            if ctx.rng_state is not None:
                generator.bit_generator.state = current
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        pairs = [(out, grad) for out, grad in zip(outputs, grad_outputs)
                 if isinstance(out, Tensor) and out.requires_grad and grad is not None]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        autograd_backward([out for out, _ in pairs], [grad for _, grad in pairs])
        input_grads = tuple(arg.grad if isinstance(arg, Tensor) else None for arg in inputs)
        return (None, None, None, None) + input_grads


def checkpoint(function: Callable, *args, use_reentrant: bool | None = None,
               context_fn: Callable = noop_context_fn, determinism_check: str = "default",
               debug: bool = False, early_stop: bool = True, **kwargs) -> Any:
    """`function(*args, **kwargs)`, recomputed in backward instead of keeping its
    intermediate results. `preserve_rng_state` (keyword, default True) replays the random
    numbers (dropout) of the first run. `context_fn`, `determinism_check`, `debug` and
    `early_stop` are accepted at their defaults only."""
    if use_reentrant is None:
        warnings.warn(
            "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. Starting in "
            "PyTorch 2.9, calling checkpoint without use_reentrant will raise an exception. use_reentrant=False "
            "is recommended, but if you need to preserve the current default behavior, you can pass "
            "use_reentrant=True. Refer to docs for more details on the differences between the two variants.",
            stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if use_reentrant and (context_fn is not noop_context_fn or debug is not False):
        raise ValueError("Passing `context_fn` or `debug` is only supported when use_reentrant=False.")
    if context_fn is not noop_context_fn or debug or determinism_check != "default" or not early_stop:
        raise ValueError("checkpoint: tracegrad supports context_fn, debug, determinism_check and early_stop "
                         "at their defaults only")
    if use_reentrant:
        if not any(isinstance(arg, Tensor) and arg.requires_grad for arg in args):
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be None", stacklevel=2)
        anchor = None
    else:
        # A leaf that requires grad makes the call recorded whatever the inputs, so that the
        # parameters used inside get their gradients.
        anchor = zeros(0, requires_grad=True)
    return _Checkpoint.apply(function, preserve, kwargs, anchor, *args)
