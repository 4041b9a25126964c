"""Ops on the narrow dtypes (int32, int16, int8, uint8, float16, bfloat16): one CASES table
run eagerly against PyTorch, under `tg.compile`, through the eager fusion with small
thresholds and through the eager backward cache, each equal to plain eager execution (the
code generator lowers none of these dtypes: their nodes run as NumPy steps, so even a graph
mixing them with float32 kernels gives eager's values)."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.lru import RecencyCache
from tracegrad.autograd import backward_cache
from tracegrad.runtime.program_cache import PROGRAMS
from tracegrad.functional import eager_fusion
from tracegrad.ir import types

FLOATS = ["float16", "bfloat16"]
INTEGERS = ["int32", "int16", "int8", "uint8"]
DTYPES = FLOATS + INTEGERS


def _param(name):
    marks = [pytest.mark.skipif(not types.bfloat16_available(), reason="bfloat16 needs ml_dtypes")] \
        if name == "bfloat16" else []
    return pytest.param(name, marks=marks, id=name)


DTYPE_PARAMS = [_param(name) for name in DTYPES]
FLOAT_PARAMS = [_param(name) for name in FLOATS]

# name -> function of a module `m` and one tensor `x` of shape (4, 6) (positive where the
# op needs it); the same text runs with PyTorch as `m`.
CASES = {
    "add_sub_mul": lambda m, x: (x + x) * x - x,
    "scalar_int": lambda m, x: x * 3 + 2,
    "scalar_float": lambda m, x: x * 1.5 - 0.25,
    "scalar_out_of_range_wraps": lambda m, x: (x + 300) * (x < 300),
    "true_divide": lambda m, x: x / (x + 1),
    "div_scalar": lambda m, x: x / 4,
    "neg_abs": lambda m, x: m.abs(-x) if x.dtype != m.uint8 else m.abs(x),
    "maximum_minimum": lambda m, x: m.maximum(x, m.flip(x, [0])) + m.minimum(x, x.t().reshape(4, 6)),
    "compare": lambda m, x: m.stack([x < 3, x <= 3, x > 3, x >= 3, x == 3, x != 3]),
    "where": lambda m, x: m.where(x > 2, x, x * 2),
    "clamp": lambda m, x: m.clamp(x, 1, 5),
    "exp_log": lambda m, x: m.log(x) + m.exp(x * 0.25),
    "sqrt_tanh_sigmoid": lambda m, x: m.sqrt(x) * m.tanh(x) + m.sigmoid(x),
    "rounding": lambda m, x: m.floor(x * 0.5) + m.ceil(x * 0.5) + m.trunc(x * 0.3),
    "pow": lambda m, x: x ** 2,
    "sum_all": lambda m, x: m.sum(x),
    "sum_dim": lambda m, x: x.sum(1),
    "mean": lambda m, x: x.mean(0) if x.is_floating_point() else x.float().mean(0),
    "amax_argmax": lambda m, x: m.amax(x, 1) + m.argmax(x, 1).to(x.dtype),
    "softmax": lambda m, x: m.softmax(x, 1) if x.is_floating_point() else m.softmax(x.float(), 1),
    "layer_norm": lambda m, x: m.nn.functional.layer_norm(x if x.is_floating_point() else x.float(), (6,)),
    "matmul": lambda m, x: x @ x.t(),
    "movement": lambda m, x: m.cat([x.t().reshape(3, 8), x[1:3].reshape(2, 6)[:, ::2].reshape(3, 2).repeat(1, 4)]),
    "gather": lambda m, x: m.gather(x, 1, m.tensor([[0, 5], [1, 1], [2, 0], [3, 4]])),
    "masked_fill_tril": lambda m, x: m.tril(x.masked_fill(x > 4, 1)),
    "to_float32_and_back": lambda m, x: (x.float() * 2.5).to(x.dtype),
    "mixed_with_float32": lambda m, x: x * m.ones(6) + x.float(),
    "mixed_with_int64": lambda m, x: x + m.arange(6),
    "zero_dim_promotion": lambda m, x: x * m.tensor(2.5, dtype=m.float64),
    "any_all": lambda m, x: m.stack([m.any(x > 3, 1), m.all(x > 0, 1)]),
}

# Ops PyTorch rejects for a dtype with errors tracegrad does not copy (its integer softmax,
# integer and half layer_norm run in the input's float).
SKIP_TORCH = set()


def _data(dtype: str, seed: int = 0, positive: bool = True) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype in FLOATS:
        data = rng.uniform(0.5, 6.0, (4, 6)).astype(np.float32)
        return data if positive else data - 3.0
    return rng.integers(1, 7, (4, 6))


def _tensor(dtype: str, seed: int = 0, requires_grad: bool = False):
    return tg.tensor(_data(dtype, seed), dtype=getattr(tg, dtype), requires_grad=requires_grad)


def _numbers(t) -> np.ndarray:
    """A result's values as float64 (bfloat16 through float32), with its dtype name."""
    return t.detach().float().numpy().astype(np.float64) if t.dtype.is_floating else t.numpy().astype(np.float64)


def _assert_same(got, want):
    """Equal dtype, shape and values: integers exactly, floats to a few units in the last
    place of their dtype (a float32 exp in an LLVM kernel is not NumPy's to the last bit)."""
    assert got.dtype is want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    if got.dtype.is_floating:
        tolerance = 4 * tg.finfo(got.dtype).eps
        np.testing.assert_allclose(_numbers(got), _numbers(want), rtol=tolerance, atol=tolerance)
    else:
        np.testing.assert_array_equal(_numbers(got), _numbers(want))


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_equals_eager(case, dtype):
    fn = CASES[case]
    x = _tensor(dtype)
    want = fn(tg, x)
    compiled = tg.compile(lambda x: fn(tg, x))
    for _ in range(3):  # traced, then following the recorded call
        _assert_same(compiled(x), want)


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("case", list(CASES))
def test_eager_fusion_with_small_thresholds_equals_plain_eager(case, dtype, monkeypatch):
    fn = CASES[case]
    x = _tensor(dtype)
    with tg.reference_mode():
        want = fn(tg, x)
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(eager_fusion, "SINGLE_OP_FACTOR", 1)
    for _ in range(eager_fusion.FUSE_AFTER + 2):
        _assert_same(fn(tg, x), want)


@pytest.mark.parametrize("dtype", FLOAT_PARAMS)
@pytest.mark.parametrize("case", [c for c in CASES if c not in ("compare", "any_all", "amax_argmax")])
def test_backward_cache_and_compiled_backward_equal_eager(case, dtype):
    fn = CASES[case]

    def grad_of(run):
        x = _tensor(dtype, requires_grad=True)
        out = run(x)
        if not out.dtype.is_floating:
            pytest.skip("an integer result has no gradient")
        out.float().sum().backward()
        return x.grad

    with tg.reference_mode():
        want = grad_of(lambda x: fn(tg, x))
    assert want.dtype is getattr(tg, dtype)
    for _ in range(backward_cache.COMPILE_AFTER + 2):
        _assert_same(grad_of(lambda x: fn(tg, x)), want)
    compiled = tg.compile(lambda x: fn(tg, x))
    for _ in range(3):
        _assert_same(grad_of(compiled), want)


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("case", list(CASES))
def test_eager_matches_pytorch(case, dtype):
    torch = pytest.importorskip("torch")
    fn = CASES[case]
    data = _data(dtype)
    x_torch = torch.tensor(data).to(getattr(torch, dtype))
    try:
        want = fn(torch, x_torch)
    except (RuntimeError, NotImplementedError) as error:
        pytest.skip(f"PyTorch rejects it: {error}")
    got = fn(tg, _tensor(dtype))
    assert got.dtype.name == str(want.dtype).removeprefix("torch.")
    want_values = want.double().numpy()
    # float16/bfloat16 results round per op (PyTorch fuses some composites in float32):
    # a few units of the last place of the dtype; integers exactly.
    tolerance = {"float16": 4e-3, "bfloat16": 3e-2}.get(got.dtype.name, 1e-6 if got.dtype.is_floating else 0)
    np.testing.assert_allclose(_numbers(got), want_values, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", FLOAT_PARAMS)
def test_gradients_of_reduced_floats_match_pytorch(dtype):
    torch = pytest.importorskip("torch")
    data = _data(dtype)
    x = _tensor(dtype, requires_grad=True)
    (tg.tanh(x) * x).sum().backward()
    x_torch = torch.tensor(data).to(getattr(torch, dtype)).requires_grad_()
    (torch.tanh(x_torch) * x_torch).sum().backward()
    assert x.grad.dtype is getattr(tg, dtype)
    np.testing.assert_allclose(_numbers(x.grad), x_torch.grad.double().numpy(), rtol=3e-2, atol=3e-2)


def test_float16_sum_accumulates_in_float32():
    # 4096 halves of 0.1: rounded at each step the sum would stall at 256.
    x = tg.full((4096,), 0.1, dtype=tg.float16)
    assert x.sum().item() == pytest.approx(409.5, abs=0.5)


@pytest.mark.skipif(not types.bfloat16_available(), reason="bfloat16 needs ml_dtypes")
def test_bfloat16_sum_accumulates_in_float32():
    x = tg.ones(1000, dtype=tg.bfloat16)
    assert x.sum().item() == 1000.0
    assert x.reshape(10, 100).sum(1).tolist() == [100.0] * 10


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_sum_is_int64(dtype):
    x = tg.tensor([100, 100, 100], dtype=getattr(tg, dtype))
    total = x.sum()
    assert total.dtype is tg.int64 and total.item() == 300


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_arithmetic_wraps_in_its_width(dtype):
    info = tg.iinfo(getattr(tg, dtype))
    x = tg.tensor([info.max], dtype=getattr(tg, dtype))
    assert (x + 1).item() == info.min
    assert (x + 1).dtype is getattr(tg, dtype)


def test_uint8_any_all_are_uint8():
    x = tg.tensor([[0, 3], [1, 2]], dtype=tg.uint8)
    assert tg.any(x, 1).dtype is tg.uint8 and tg.any(x, 1).tolist() == [1, 1]
    assert tg.all(x, 1).tolist() == [0, 1]


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_eager_fusion_leaves_unlowered_dtypes_to_the_op_by_op_path(dtype, monkeypatch):
    # A fused program of these dtypes would be nothing but NumPy steps: slower than op by op.
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(eager_fusion, "SINGLE_OP_FACTOR", 1)
    monkeypatch.setattr(eager_fusion, "_programs", PROGRAMS.user("eager fusion", eager_fusion.RECIPE))
    monkeypatch.setattr(eager_fusion, "_op_programs", RecencyCache(eager_fusion.CAPACITY))
    x = _tensor(dtype)
    for _ in range(eager_fusion.FUSE_AFTER + 2):
        tg.softmax(x if x.dtype.is_floating else x.float(), 1)
        x + x
    assert len(eager_fusion._programs) == (0 if x.dtype.is_floating else 1)  # (x.float() fuses)
