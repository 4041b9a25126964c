"""Optimizer updates written in place by one fused program (`functional/fused_update.py`)
leave what the op-by-op update leaves: the same parameters and state, in the same buffers,
with the same version counts, and are declined where writing in place would differ."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import optim
from tracegrad.autograd.lru import RecencyCache
from tracegrad.functional import fused_update
from tracegrad.functional._util import composite
from tracegrad.runtime.program_cache import PROGRAMS


@pytest.fixture(autouse=True)
def _fuse_everything(monkeypatch):
    """Fuse from the first call and whatever the size; fresh caches."""
    monkeypatch.delenv("TRACEGRAD_EAGER_COMPILE", raising=False)
    monkeypatch.setattr(fused_update, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(fused_update, "FUSE_AFTER", 1)
    monkeypatch.setattr(fused_update, "_seen", RecencyCache(fused_update.CAPACITY))
    monkeypatch.setattr(fused_update, "_entries", RecencyCache(fused_update.CAPACITY))
    monkeypatch.setattr(fused_update, "_programs", PROGRAMS.user("fused updates (test)", "test"))


def _op_by_op(monkeypatch):
    monkeypatch.setattr(fused_update, "MIN_ELEMENTS", 1 << 62)


def _fused_calls() -> int:
    return sum(1 for entry in fused_update._entries.values() if entry is not False)


OPTIMIZERS = {
    "sgd": (optim.SGD, dict(lr=0.1)),
    "sgd_weight_decay": (optim.SGD, dict(lr=0.1, weight_decay=0.01)),
    "sgd_momentum": (optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd_nesterov": (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True)),
    "adam": (optim.Adam, dict(lr=0.01, weight_decay=0.01)),
    "adamw_amsgrad": (optim.AdamW, dict(lr=0.01, amsgrad=True)),
    "adam_maximize": (optim.Adam, dict(lr=0.01, maximize=True)),
    "adadelta": (optim.Adadelta, dict(lr=1.0)),
    "adadelta_weight_decay": (optim.Adadelta, dict(lr=0.5, weight_decay=0.1, maximize=True)),
    "rmsprop": (optim.RMSprop, dict(lr=0.01)),
    "rmsprop_centered_momentum": (optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.9, weight_decay=0.1)),
    "adagrad": (optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
}
SHAPES = [(37, 5), (1, 7), (6,), (0, 3)]


def _train(name: str, dtype, steps: int = 5, shapes=SHAPES):
    """Parameters of several shapes after `steps` updates with given gradients, their
    state, the optimizer, and per step the version increments of each parameter."""
    optimizer_class, options = OPTIMIZERS[name]
    rng = np.random.default_rng(1)
    params = [tg.nn.Parameter(tg.tensor(rng.standard_normal(shape), dtype=dtype)) for shape in shapes]
    optimizer = optimizer_class(params, **options)
    bumps = []
    for _ in range(steps):
        for p in params:
            p.grad = tg.tensor(rng.standard_normal(p.shape), dtype=dtype)
        before = [p._version for p in params]
        optimizer.step()
        bumps.append([p._version - v for p, v in zip(params, before)])
    return params, optimizer, bumps


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_fused_update_leaves_what_the_op_by_op_update_leaves(name, dtype, monkeypatch):
    fused, fused_optimizer, fused_bumps = _train(name, dtype)
    assert _fused_calls() > 0
    _op_by_op(monkeypatch)
    plain, plain_optimizer, plain_bumps = _train(name, dtype)
    tolerance = dict(rtol=1e-6, atol=1e-7) if dtype == tg.float32 else dict(rtol=1e-13, atol=1e-15)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), **tolerance)
        for key, value in plain_optimizer.state.get(b, {}).items():
            mine = fused_optimizer.state[a][key]
            if isinstance(value, tg.Tensor):
                np.testing.assert_allclose(mine.numpy(), value.numpy(), **tolerance, err_msg=key)
            else:
                assert mine == value
    assert fused_bumps == plain_bumps


def test_a_fused_update_writes_into_the_parameters_own_buffer():
    p = tg.nn.Parameter(tg.ones(64, 8))
    alias = p.data  # shares p's memory, as in PyTorch
    buffer = p._data
    optimizer = optim.Adadelta([p])
    for _ in range(3):
        p.grad = tg.full((64, 8), 0.5)
        optimizer.step()
    assert _fused_calls() == 1
    assert p._data is buffer
    np.testing.assert_array_equal(alias.numpy(), p.detach().numpy())
    assert not np.allclose(p.detach().numpy(), 1.0)


def test_a_new_learning_rate_runs_the_same_program(monkeypatch):
    rng = np.random.default_rng(2)
    start = rng.standard_normal((16, 4)).astype(np.float32)
    grads = [rng.standard_normal((16, 4)).astype(np.float32) for _ in range(4)]

    def run():
        p = tg.nn.Parameter(tg.tensor(start))
        optimizer = optim.SGD([p], lr=0.1, momentum=0.5)
        scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        for grad in grads:
            p.grad = tg.tensor(grad)
            optimizer.step()
            scheduler.step()
        return p.detach().numpy()

    fused = run()
    assert _fused_calls() == 1
    _op_by_op(monkeypatch)
    np.testing.assert_allclose(fused, run(), rtol=1e-6)


def test_an_update_of_a_tensor_saved_for_backward_is_still_detected():
    p = tg.nn.Parameter(tg.ones(8, 8))
    optimizer = optim.SGD([p], lr=0.1)
    for _ in range(2):
        p.grad = tg.ones(8, 8)
        optimizer.step()
    loss = (p * p).sum()  # saves p
    p.grad = tg.ones(8, 8)
    optimizer.step()
    assert _fused_calls() == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@composite
def _shifted(a, b):
    return (a + b,)


@composite
def _doubled_other(a, b):
    return (b * 2.0,)


@tg.no_grad()
def test_an_update_that_would_read_memory_it_wrote_is_declined():
    a = tg.ones(4, 4)
    view = a[1:]
    assert not fused_update.update_in_place(_shifted, (a[:3], view), (a[:3],))  # a view written
    b = tg.ones(4, 4)
    alias = b.detach()  # another tensor on b's memory
    assert not fused_update.update_in_place(_shifted, (b, alias), (b,))
    np.testing.assert_array_equal(b.numpy(), np.ones((4, 4)))
    assert b._version == 0


def test_a_new_value_not_stored_in_place_is_copied_over_its_tensor():
    a, b = tg.zeros(8, 8), tg.full((8, 8), 3.0)
    with tg.no_grad():
        assert fused_update.update_in_place(_doubled_other, (a, b), (a,))
    np.testing.assert_array_equal(a.numpy(), np.full((8, 8), 6.0))
    assert a._version == 1 and b._version == 0


def test_updates_outside_an_optimizer_step_are_not_fused(monkeypatch):
    a, b = tg.zeros(8, 8), tg.ones(8, 8)
    assert not fused_update.update_in_place(_shifted, (a, b), (a,))  # grad mode is on
    with tg.no_grad():
        monkeypatch.setenv("TRACEGRAD_EAGER_COMPILE", "0")
        assert not fused_update.update_in_place(_shifted, (a, b), (a,))
        monkeypatch.delenv("TRACEGRAD_EAGER_COMPILE")
        fortran = tg.from_numpy(np.asfortranarray(np.zeros((8, 8), np.float32)))
        assert not fused_update.update_in_place(_shifted, (fortran, b), (fortran,))  # not C-contiguous
        assert fused_update.update_in_place(_shifted, (a, b), (a,))
    np.testing.assert_array_equal(a.numpy(), np.ones((8, 8)))


def test_a_program_the_cache_dropped_is_built_again():
    a, b = tg.zeros(8, 8), tg.ones(8, 8)
    with tg.no_grad():
        assert fused_update.update_in_place(_shifted, (a, b), (a,))
        PROGRAMS.release(fused_update._programs)
        assert fused_update.update_in_place(_shifted, (a, b), (a,))
    np.testing.assert_array_equal(a.numpy(), np.full((8, 8), 2.0))


def test_a_fused_adadelta_step_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    start = rng.standard_normal((300, 40)).astype(np.float32)
    grads = [rng.standard_normal((300, 40)).astype(np.float32) for _ in range(4)]
    p, theirs = tg.nn.Parameter(tg.tensor(start)), torch.nn.Parameter(torch.tensor(start))
    mine_optimizer, theirs_optimizer = optim.Adadelta([p], lr=1.0), torch.optim.Adadelta([theirs], lr=1.0)
    for grad in grads:
        p.grad, theirs.grad = tg.tensor(grad), torch.tensor(grad)
        mine_optimizer.step()
        theirs_optimizer.step()
    assert _fused_calls() == 1
    np.testing.assert_allclose(p.detach().numpy(), theirs.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adadelta", "rmsprop_centered_momentum", "adagrad"])
def test_a_compiled_training_step_matches_the_fused_eager_one(name):
    optimizer_class, options = OPTIMIZERS[name]
    rng = np.random.default_rng(4)
    weight, inputs = rng.standard_normal((4, 6)), [rng.standard_normal((3, 6)) for _ in range(5)]

    def train(compiled: bool):
        w = tg.nn.Parameter(tg.tensor(weight))
        optimizer = optimizer_class([w], **options)

        def step(x):
            optimizer.zero_grad()
            loss = ((x @ w.t()) ** 2).sum()
            loss.backward()
            optimizer.step()
            return loss

        run = tg.compile(step) if compiled else step
        losses = [run(tg.tensor(x)).item() for x in inputs]
        return losses, w.detach().numpy()

    eager_losses, eager_weight = train(False)
    assert _fused_calls() >= 1
    compiled_losses, compiled_weight = train(True)
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-12)
    np.testing.assert_allclose(compiled_weight, eager_weight, rtol=1e-12, atol=1e-14)
