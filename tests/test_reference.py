"""The reference mode (tracegrad/reference.py): one switch turns every speed layer off and
runs compiled graphs through the NumPy interpreter; the compile backends `interpret` and
`interpret-optimized` run one function's graphs through the interpreter."""

import os
import subprocess
import sys

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad import reference
from tracegrad.jit import composite as compile_composite
from tracegrad.jit import replay as compile_replay
from tracegrad.autograd import backward_cache, traced_backward
from tracegrad.autograd.lru import RecencyCache
from tracegrad.codegen import program_builder
from tracegrad.runtime.program_cache import PROGRAMS
from tracegrad.runtime import disk_cache
from tracegrad.functional import eager_fusion


@pytest.fixture(autouse=True)
def _reference_off_after_each_test():
    previous = reference.ACTIVE
    reference.reference_mode(False)
    yield
    reference.reference_mode(previous)


def _spy(monkeypatch, module, name: str) -> list:
    """Count the calls of `module.name` (still calling it)."""
    calls = []
    original = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def _model_and_data():
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(6, 8), tg.nn.Tanh(), tg.nn.Linear(8, 3))
    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal((5, 6)).astype(np.float32))
    y = tg.tensor(rng.integers(0, 3, 5))
    return model, x, y


def _train(step_fn, model, x, y, steps: int = 3):
    optimizer = tg.optim.Adam(model.parameters(), lr=0.1)

    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    run = step_fn(step)
    losses = [run(x, y).item() for _ in range(steps)]
    return losses, [p.detach().numpy().copy() for p in model.parameters()]


def test_reference_mode_compiled_training_gives_the_eager_results():
    model, x, y = _model_and_data()
    eager_losses, eager_params = _train(lambda f: f, model, x, y)
    model, x, y = _model_and_data()
    with tg.reference_mode():
        losses, params = _train(tg.compile, model, x, y)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-6)
    for got, want in zip(params, eager_params):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_reference_mode_is_a_switch_and_a_context_manager_restoring_the_setting():
    assert not tg.is_reference_mode()
    with tg.reference_mode():
        assert tg.is_reference_mode()
        with tg.reference_mode(False):
            assert not tg.is_reference_mode()
        assert tg.is_reference_mode()
    assert not tg.is_reference_mode()
    tg.reference_mode(True)
    assert tg.is_reference_mode()
    tg.reference_mode(False)
    assert not tg.is_reference_mode()


def _compiled_training(repeats: int = 3) -> None:
    model, x, y = _model_and_data()
    _train(tg.compile, model, x, y, steps=repeats)


def _eager_training(repeats: int = 4) -> None:
    model, x, y = _model_and_data()
    _train(lambda f: f, model, x, y, steps=repeats)


def _outside_and_inside(run, calls: list) -> tuple[int, int]:
    """How many spied calls `run()` made outside reference mode, then inside it."""
    calls.clear()
    run()
    outside = len(calls)
    calls.clear()
    with tg.reference_mode():
        run()
    return outside, len(calls)


def test_reference_mode_follows_no_recorded_trace(monkeypatch):
    calls = _spy(monkeypatch, compile_replay.Replay, "__init__")
    outside, inside = _outside_and_inside(_compiled_training, calls)
    assert outside > 0 and inside == 0


def test_reference_mode_takes_no_composite_in_one_step(monkeypatch):
    calls = _spy(monkeypatch, compile_composite, "record")
    calls += _spy(monkeypatch, compile_composite, "jump")
    outside, inside = _outside_and_inside(_compiled_training, calls)
    assert outside > 0 and inside == 0


def test_reference_mode_replays_no_traced_backward_template(monkeypatch):
    monkeypatch.setattr(compile_replay, "ENABLED", False)  # outside: every call looks for a template
    traced_backward.clear()
    calls = _spy(monkeypatch, traced_backward, "_replay")
    calls += _spy(monkeypatch, traced_backward, "_record")
    outside, inside = _outside_and_inside(_compiled_training, calls)
    assert outside > 0 and inside == 0


def test_reference_mode_skips_the_eager_backward_cache(monkeypatch):
    monkeypatch.setattr(backward_cache, "_entries", RecencyCache(backward_cache.CAPACITY))
    calls = _spy(monkeypatch, backward_cache, "_describe")
    calls += _spy(monkeypatch, backward_cache, "_build")
    outside, inside = _outside_and_inside(_eager_training, calls)
    assert outside > 0 and inside == 0


def test_reference_mode_runs_no_eager_fusion(monkeypatch):
    monkeypatch.delenv("TRACEGRAD_EAGER_COMPILE", raising=False)
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(eager_fusion, "FUSE_AFTER", 1)
    monkeypatch.setattr(eager_fusion, "_seen", RecencyCache(eager_fusion.CAPACITY))
    monkeypatch.setattr(eager_fusion, "_programs", PROGRAMS.user("eager fusion", eager_fusion.RECIPE))
    calls = _spy(monkeypatch, eager_fusion, "_run_fused")
    outside, inside = _outside_and_inside(_eager_training, calls)
    assert outside > 0 and inside == 0


def test_the_eager_compile_switch_follows_the_environment_as_it_changes(monkeypatch):
    monkeypatch.delenv("TRACEGRAD_EAGER_COMPILE", raising=False)
    assert reference.eager_compile()
    monkeypatch.setenv("TRACEGRAD_EAGER_COMPILE", "0")
    assert not reference.eager_compile()
    monkeypatch.setenv("TRACEGRAD_EAGER_COMPILE", "1")
    assert reference.eager_compile()
    with tg.reference_mode():
        assert not reference.eager_compile()


def test_reference_mode_multiplies_large_eager_matrices_with_numpy(monkeypatch):
    from tracegrad.codegen import gemm, matmul_steps
    monkeypatch.setenv("TRACEGRAD_MATMUL", "generated")
    calls = _spy(monkeypatch, gemm, "matmul")
    a = tg.ones(128, 128)
    product = lambda: (a @ a).sum()  # noqa: E731
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        product()
    outside = len(calls)
    calls.clear()
    with tg.reference_mode():
        assert product().item() == 128 ** 3
    assert outside > 0 and calls == []


def test_reference_mode_builds_and_caches_no_program(monkeypatch):
    calls = _spy(monkeypatch, program_builder, "build_program")
    model, x, y = _model_and_data()
    with tg.reference_mode():
        optimizer = tg.optim.SGD(model.parameters(), lr=0.1)

        @tg.compile
        def step(x, y):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            return loss

        for _ in range(3):
            step(x, y)
    assert calls == []
    assert step.cache_info().graphs == 0 and step._programs == {}


def test_reference_mode_reads_and_writes_no_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    assert disk_cache.cache_dir() == str(tmp_path)
    with tg.reference_mode():
        assert disk_cache.cache_dir() is None
        _compiled_training()
    assert list(tmp_path.iterdir()) == []


def test_reference_mode_is_read_from_the_environment_at_import():
    code = "import tracegrad as tg; print(tg.is_reference_mode())"
    root = os.path.dirname(os.path.dirname(os.path.abspath(tg.__file__)))
    env = dict(os.environ, TRACEGRAD_REFERENCE="1", PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def _step(x, w):
    y = (x @ w).tanh() * 2.0 + 1.0
    loss = F.log_softmax(y, -1).sum() + y.amax(0).sum()
    loss.backward()
    return loss, y


@pytest.mark.parametrize("backend", ["interpret", "interpret-optimized"])
def test_interpreting_backends_run_no_llvm_kernel_and_give_eager_results(monkeypatch, backend):
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32))
            for _ in range(3)]
    wanted = []
    for x, w in data:
        w_eager = tg.tensor(w, requires_grad=True)
        loss, y = _step(tg.tensor(x), w_eager)
        wanted.append((loss.detach().numpy(), y.detach().numpy(), w_eager.grad.numpy()))
    calls = _spy(monkeypatch, program_builder, "build_program")
    compiled = tg.compile(_step, backend=backend)
    for (x, w), want in zip(data, wanted):
        w_compiled = tg.tensor(w, requires_grad=True)
        loss, y = compiled(tg.tensor(x), w_compiled)
        for got, expected in zip((loss.detach().numpy(), y.detach().numpy(), w_compiled.grad.numpy()), want):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)  # (eager log_softmax: another formula)
    assert calls == []
    assert compiled.cache_info().kernels == 0


def test_the_default_backend_builds_llvm_kernels(monkeypatch):
    calls = _spy(monkeypatch, program_builder, "build_program")
    compiled = tg.compile(_step)
    compiled(tg.ones(4, 5), tg.ones(5, 3, requires_grad=True))
    assert calls and compiled.cache_info().kernels > 0


def test_interpret_backend_interprets_the_unoptimized_graph_and_the_other_the_optimized(monkeypatch):
    seen = []

    def remember(graph, donations=()):
        seen.append(graph)
        return reference.InterpretedProgram(graph)

    monkeypatch.setattr(reference, "interpreted_program", remember)
    for backend in ("interpret", "interpret-optimized"):
        tg.compile(lambda x: x.exp() + x.exp(), backend=backend)(tg.ones(3))
    ops = [[node.op.name for node in graph.nodes] for graph in seen]
    assert ops == [["exp", "exp", "add"], ["exp", "add"]]  # the optimizer merges the equal nodes


def test_an_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'cuda'.*llvm, interpret, interpret-optimized"):
        tg.compile(lambda x: x, backend="cuda")
