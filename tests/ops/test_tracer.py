"""The trace protocol: `bind` hands every op to the current trace (`process_primitive`), the
autograd engine every backward (`process_backward`, `process_grad`); eager execution is the
bottom trace, and nothing below the compiler knows which trace is active or whether it
follows a recorded call."""

import ast
import inspect
import pathlib
import textwrap
import threading

import numpy as np

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.ir.graph import Graph
from tracegrad.grad_mode import MODE
from tracegrad.ops import dispatch
from tracegrad.ops.trace import EAGER, EagerTrace
from tracegrad.ops.tracer import Tracer

PACKAGE = pathlib.Path(tg.__file__).parent


class CountingTrace(Tracer):
    """The plain graph trace, counting what it is handed."""

    def __init__(self):
        super().__init__(Graph(name="counted"))
        self.ops: list[str] = []
        self.handed_backwards = 0

    def process_primitive(self, prim, inputs, attrs):
        self.ops.append(prim.name)
        return super().process_primitive(prim, inputs, attrs)

    def process_backward(self, roots, targets, retain_graph, create_graph):
        self.handed_backwards += 1
        return super().process_backward(roots, targets, retain_graph, create_graph)


def test_bind_hands_every_op_of_a_composite_to_the_active_trace():
    x = tg.ones(2, 3, requires_grad=True)
    w = tg.ones(4, 3)
    with CountingTrace() as trace:
        y = (F.linear(x, w) * 2.0).exp().sum()
    assert y._data is None  # lazy: the trace computed nothing
    assert trace.ops and trace.ops == [node.op.name for node in trace.graph.nodes]


def test_a_backward_inside_a_trace_is_handed_to_it_and_the_rules_run_when_it_declines():
    x = tg.tensor([0.5, -1.0], dtype=tg.float64, requires_grad=True)
    with CountingTrace() as trace:
        (gx,) = tg.autograd.grad((x * x).sum(), [x])
    assert trace.handed_backwards == 1
    got = tg.ir.interpret(Graph(trace.graph.inputs, trace.graph.nodes, [gx._value]),
                          [trace.array_of(v) for v in trace.graph.inputs])[0]
    np.testing.assert_allclose(got, [1.0, -2.0])


def test_a_followed_call_hands_no_op_to_its_replay_once_it_is_over():
    compiled = tg.compile(lambda x: (x * 2.0).exp().sum())
    x = tg.ones(3)
    traces = [compiled._traced_call((x,), {})[1] for _ in range(3)]
    assert [t.replay is not None for t in traces] == [False, True, True]
    for trace in traces:
        assert not {"process_primitive", "scalar_tensor", "process_grad"} & set(vars(trace))
        assert trace.replay is None or trace.replay.tracer is None  # no cycle keeps the call alive


def test_only_the_compiler_knows_a_trace_may_follow_a_recorded_call():
    readers = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "jit":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "replay":
                readers.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert readers == []


def test_bind_has_no_branch_it_hands_every_op_to_the_current_trace():
    (function,) = ast.parse(textwrap.dedent(inspect.getsource(dispatch.bind))).body
    body = [node for node in function.body if not isinstance(node, ast.Expr)]  # (the docstring)
    assert len(body) == 1 and isinstance(body[0], ast.Return)


def test_eager_execution_is_the_current_trace_when_none_is_entered_in_every_thread():
    seen = []
    worker = threading.Thread(target=lambda: seen.append((MODE.trace, MODE.tracer)))
    worker.start()
    worker.join()
    assert (MODE.trace, MODE.tracer) == (EAGER, None) and seen == [(EAGER, None)]
    with CountingTrace() as trace:
        assert (MODE.trace, MODE.tracer) == (trace, trace)
        with CountingTrace() as inner:
            assert MODE.trace is inner
        assert MODE.trace is trace
    assert (MODE.trace, MODE.tracer) == (EAGER, None)


class CountingEagerTrace(EagerTrace):
    """The eager trace, counting what it is handed."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def process_primitive(self, prim, inputs, attrs):
        self.ops.append(prim.name)
        return super().process_primitive(prim, inputs, attrs)


def test_an_eager_subclass_made_current_sees_every_op_and_computes_them(monkeypatch):
    counting = CountingEagerTrace()
    monkeypatch.setattr(MODE, "trace", counting)
    x = tg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = (x.t() * 2.0).exp().sum()
    monkeypatch.undo()
    assert {"permute", "mul", "exp", "sum"} <= set(counting.ops)
    np.testing.assert_allclose(y.item(), np.exp(2.0 * np.array([1.0, 2.0, 3.0, 4.0])).sum(), rtol=1e-6)


def test_the_eager_backward_is_handed_to_the_eager_trace_and_its_cache_may_decline(monkeypatch):
    handed = []

    def declining(roots, targets, retain_graph):
        handed.append(retain_graph)
        return None

    monkeypatch.setattr(EAGER, "_cached_backward", declining)
    x = tg.tensor([0.5, -1.0], dtype=tg.float64, requires_grad=True)
    (x * x).sum().backward()
    (gx,) = tg.autograd.grad((x * x).sum(), [x], create_graph=True)  # never the cache
    assert handed == [False]
    np.testing.assert_allclose(x.grad.numpy(), [1.0, -2.0])
    np.testing.assert_allclose(gx.detach().numpy(), [1.0, -2.0])
