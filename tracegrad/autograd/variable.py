"""`Variable`: the 2017 API of the "Autograd mechanics" note, kept for old code.

`Variable(data, requires_grad=False, volatile=False)` returns a Tensor. A volatile
input makes every result volatile, with requires_grad=False and no grad_fn, whatever the
other inputs and the grad mode: nothing is recorded or saved for it.
"""

from __future__ import annotations

from tracegrad.autograd.engine import ExecutionEngine
from tracegrad.tensor import Tensor


def Variable(data, requires_grad: bool = False, volatile: bool = False) -> Tensor:  # noqa: N802
    if isinstance(data, Tensor):
        t = data.detach()
    else:
        t = Tensor(data)
    if requires_grad:
        t.requires_grad_(True)
    t._volatile = bool(volatile)
    return t


Variable._execution_engine = ExecutionEngine()
