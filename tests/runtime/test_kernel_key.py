"""Kernel descriptions: a disk-cache key that determines a kernel's IR without building it."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import kernel_key


def _kernel_steps(fn, *args):
    fn(*args)
    (program,) = fn._programs.values()
    return [step for step in program.steps if hasattr(step, "description")]


def _description(body, *arrays):
    (step,) = _kernel_steps(tg.compile(body), *map(tg.from_numpy, arrays))
    return step.description


def test_description_names_ops_attributes_and_types():
    text = _description(lambda x: (x * 2.0).exp(), np.ones((3, 4), np.float32))
    assert ("kernel " + kernel_key.lowering_source_hash()) in text.splitlines()[0]
    assert "exp(" in text and "f32[3,4]" in text


@pytest.mark.parametrize("other", [
    lambda x: (x * 2.0).log(),                        # another op
    lambda x: (x * 2.0).exp().sum(dim=1),             # another structure
])
def test_different_kernels_have_different_descriptions(other):
    x = np.ones((3, 4), np.float32)
    assert _description(lambda x: (x * 2.0).exp(), x) != _description(other, x)


def test_shape_and_dtype_change_the_description():
    body = lambda x: (x * 2.0).exp()  # noqa: E731
    base = _description(body, np.ones((3, 4), np.float32))
    assert base != _description(body, np.ones((4, 3), np.float32))
    assert base != _description(body, np.ones((3, 4), np.float64))


def test_same_structure_gives_the_same_description():
    x = np.ones((3, 4), np.float32)
    assert _description(lambda x: (x * 2.0).exp(), x) == _description(lambda y: (y * 3.0).exp(), x)


def test_attribute_without_exact_text_gives_no_description():
    from tracegrad.codegen.fusion import FusedKernel
    from tracegrad.ir.graph import Node
    from tracegrad.ir.types import TensorType, float32
    from tracegrad.ops.elementwise import FULL
    node = Node(FULL, (), {"shape": (2,), "dtype": float32, "value": np.arange(2.0)}, (TensorType((2,), float32),))
    kernel = FusedKernel(outputs=[node.output(0)], nodes=[node], leaves=[])
    assert kernel_key.kernel_description(kernel) is None


def test_a_description_seen_with_two_irs_raises():
    kernel_key.check_unique("test-description", "ir one")
    kernel_key.check_unique("test-description", "ir one")
    with pytest.raises(AssertionError, match="does not determine the IR"):
        kernel_key.check_unique("test-description", "ir two")


WARM_PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np, tracegrad as tg
    from tracegrad.codegen import kernels
    if sys.argv[1] == "warm":
        def refuse(*args, **kwargs):
            raise RuntimeError("built IR on a warm cache")
        kernels.build_llvm = refuse
    f = tg.compile(lambda x: ((x * 2.0).exp() * x).sum(dim=1) + x.tanh().sum())
    x = np.linspace(-1, 1, 64).astype(np.float32).reshape(8, 8)
    got = f(tg.from_numpy(x)).numpy()
    expected = (np.exp(x * 2) * x).sum(axis=1) + np.tanh(x).sum()
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    program = next(iter(f._programs.values()))
    print(sum(getattr(s, "from_disk", False) for s in program.steps), f.cache_info().kernels)
""")


def test_warm_cache_loads_kernels_without_building_their_ir(tmp_path):
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path))
    env.pop("TRACEGRAD_CACHE", None)
    env.pop("TRACEGRAD_CHECK_KERNEL_KEYS", None)

    def run(mode):
        out = subprocess.run([sys.executable, "-c", WARM_PROGRAM, mode], env=env, capture_output=True,
                             text=True, check=True).stdout
        return tuple(map(int, out.split()))

    assert run("cold")[0] == 0
    loaded, kernels = run("warm")
    assert loaded == kernels > 0


def test_a_lowering_switch_changes_the_description(monkeypatch):
    from tracegrad.runtime import llvm_engine
    x = np.ones((3, 4), np.float32)
    body = lambda x: (x * 2.0).exp()  # noqa: E731
    with_scalef = _description(body, x)
    monkeypatch.setattr(llvm_engine, "HAS_SCALEF", not llvm_engine.HAS_SCALEF)
    assert _description(body, x) != with_scalef


def test_small_and_full_optimization_are_separate_cache_entries():
    from llvmlite import ir as llvm_ir

    from tracegrad.runtime.llvm_engine import compile_kernel_keyed

    def build():
        module = llvm_ir.Module(name="kernel")
        function = llvm_ir.Function(module, llvm_ir.FunctionType(llvm_ir.VoidType(), []), "kernel")
        llvm_ir.IRBuilder(function.append_basic_block("entry")).ret_void()
        return module
    _, small_symbol, _ = compile_kernel_keyed("test small/full", "kernel", build, small=True)
    _, full_symbol, _ = compile_kernel_keyed("test small/full", "kernel", build, small=False)
    assert small_symbol != full_symbol


def test_generated_gemm_keys_cover_every_lowering_source():
    # The GEMM generators use ir_builder.py's emitters too: their keys hash all of codegen/.
    import numpy as np

    from tracegrad.codegen import gemm, gemm_narrow
    key = kernel_key.generator_key()
    assert key.startswith(kernel_key.lowering_source_hash())
    assert key in gemm._description(np.dtype(np.float32), "row", "row")
    assert key in gemm_narrow._description("rows", np.dtype(np.float32), 0)


def _reference_describe(thing, numbers):
    """The description's first, plain writing (Value's own hashing, str of every type):
    `kernel_key._describe` must write exactly this, or warm caches would miss."""
    import dataclasses

    from tracegrad.ir.graph import Node, Value
    from tracegrad.ir.types import TensorType
    if isinstance(thing, Value):
        if thing not in numbers:
            numbers[thing] = len(numbers)
        return f"%{numbers[thing]}:{thing.type}"
    if isinstance(thing, Node):
        operands = ", ".join(_reference_describe(v, numbers) for v in thing.inputs)
        attrs = ", ".join(f"{k}={kernel_key._attr_text(thing.attrs[k])}" for k in sorted(thing.attrs))
        outputs = ", ".join(_reference_describe(thing.output(i), numbers) for i in range(len(thing.out_types)))
        return f"{thing.op.name}({operands}; {attrs}) -> {outputs}"
    if isinstance(thing, (list, tuple)):
        return "[" + ", ".join(_reference_describe(item, numbers) for item in thing) + "]"
    if isinstance(thing, (set, frozenset)):
        return "{" + ", ".join(sorted(_reference_describe(item, numbers) for item in thing)) + "}"
    if isinstance(thing, dict):
        items = [(_reference_describe(k, numbers), _reference_describe(v, numbers)) for k, v in thing.items()]
        return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(items)) + "}"
    if dataclasses.is_dataclass(thing) and not isinstance(thing, type):
        fields = [f"{f.name}={_reference_describe(getattr(thing, f.name), numbers)}"
                  for f in dataclasses.fields(thing) if f.name != "name"]
        return f"{type(thing).__name__}(" + ", ".join(fields) + ")"
    assert thing is None or isinstance(thing, (bool, int, float, str, TensorType))
    return repr(thing)


def test_descriptions_are_written_as_the_plain_serializer_writes_them(monkeypatch):
    import tracegrad.nn.functional as F
    kernels = []
    original = kernel_key.kernel_description
    monkeypatch.setattr(kernel_key, "kernel_description",
                        lambda kernel, purpose="kernel": kernels.append(kernel) or original(kernel, purpose))
    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal((64, 32), dtype=np.float32))
    labels = tg.tensor(rng.integers(0, 10, 64))
    model = tg.nn.Sequential(tg.nn.Linear(32, 48), tg.nn.ReLU(), tg.nn.Linear(48, 10))
    opt = tg.optim.SGD(model.parameters(), lr=0.01)

    def step(x, labels):
        loss = F.cross_entropy(model(x), labels) + F.layer_norm(x, (32,)).tanh().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    f = tg.compile(step)
    f(x, labels)
    assert len(kernels) > 3
    for kernel in kernels:
        assert kernel_key._describe(kernel, {}) == _reference_describe(kernel, {})
