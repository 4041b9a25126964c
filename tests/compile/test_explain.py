"""`fn.explain(*args)`: the report of one compiled call (graphs, realization points,
kernels, cache events with miss reasons, compile times, generated code) and the
recompile warning."""

import os
import re
import sys
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.jit.events import RecompileWarning

THIS_FILE = os.path.basename(__file__)


def _line() -> int:
    return sys._getframe(1).f_lineno


def _normalize(text: str) -> str:
    """Kernel numbers, symbols and timings vary from run to run."""
    text = re.sub(r"kernel\d+", "kernelN", text)
    text = re.sub(r"tg_[0-9a-f]+", "tg_HASH", text)
    return re.sub(r"(compiled in|loaded from the disk cache in) [\d.]+ ms", "compiled in T ms", text)


def _branch(x):
    if x.sum() > 0:
        return x.exp()
    return x.log()


BRANCH_CONDITION_LINE = _branch.__code__.co_firstlineno + 1
EXP_LINE = BRANCH_CONDITION_LINE + 1
LOG_LINE = BRANCH_CONDITION_LINE + 2


# --- what the report shows ----------------------------------------------------------------

def test_explain_returns_the_result_of_the_call():
    compiled = tg.compile(lambda x: x * 3.0)
    report = compiled.explain(tg.ones(2))
    np.testing.assert_array_equal(report.result.numpy(), [3.0, 3.0])


def test_explain_shows_the_traced_graph_with_inputs_named_after_parameters():
    def scale(x, factor):
        return x * factor

    text = str(tg.compile(scale).explain(tg.ones(3), tg.ones(3)))
    assert "graph scale(%x: f32[3], %factor: f32[3]) {" in text


def test_explain_names_captured_parameters_after_the_module_attribute_path():
    class Net(tg.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = tg.nn.Linear(3, 2)

    model = Net()
    report = tg.compile(lambda x: model.fc(x).sum()).explain(tg.ones(4, 3))
    header = tg.ir.dump(report.graphs[0].graph).splitlines()[0]
    assert "%model.fc.weight: f32[2,3]" in header and "%model.fc.bias: f32[2]" in header


def test_explain_of_a_compiled_module_names_its_parameters_after_self():
    model = tg.compile(tg.nn.Linear(3, 2))
    text = str(model.explain(tg.ones(4, 3)))
    assert "graph Linear(%input: f32[4,3], %self.weight: f32[2,3], %self.bias: f32[2]" in text


def test_explain_names_outputs_after_the_result_and_the_gradients():
    model = tg.nn.Linear(3, 2)

    def step(x):
        loss = model(x).sum()
        loss.backward()
        return loss

    report = tg.compile(step).explain(tg.ones(4, 3))
    names = [n for n in report.graphs[-1].graph.output_names if n]
    assert names == ["result", "model.weight.grad", "model.bias.grad"]


def test_explain_names_an_in_place_update_after_its_target():
    def scale_(x):
        x.mul_(2.0)

    report = tg.compile(scale_).explain(tg.ones(2))
    assert tg.ir.dump(report.graphs[-1].graph).splitlines()[-2].endswith("# x")


def test_explain_names_variadic_arguments_by_position():
    text = str(tg.compile(lambda *xs: xs[0] + xs[1]).explain(tg.ones(2), tg.ones(2)))
    assert "(%xs.0: f32[2], %xs.1: f32[2])" in text


def test_explain_includes_the_backward_of_a_traced_step_in_the_traced_graph():
    w = tg.ones(3, requires_grad=True)

    def step(x):
        loss = (x * w).sum()
        loss.backward()
        return loss

    report = tg.compile(step).explain(tg.ones(3))
    ops = [node.op.name for node in report.graphs[-1].graph.nodes]
    assert ops[:2] == ["mul", "sum"] and len(ops) > 2


def test_explain_shows_the_optimized_graph():
    report = tg.compile(lambda x: x.exp() + x.exp()).explain(tg.ones(2))
    assert [n.op.name for n in report.graphs[0].graph.nodes] == ["exp", "exp", "add"]
    assert [n.op.name for n in report.graphs[0].optimized.nodes] == ["exp", "add"]  # CSE
    assert "optimized graph:\n    graph <lambda>(%x: f32[2]) {\n      %0: f32[2] = exp(%x)" in str(report)


def test_explain_lists_realization_points_with_the_users_file_and_line():
    report = tg.compile(_branch).explain(tg.ones(3))
    (point,) = report.realizations
    assert point.location == f"{THIS_FILE}:{BRANCH_CONDITION_LINE}"
    assert str(point.type) == "bool[]"
    assert f"bool[] at {THIS_FILE}:{BRANCH_CONDITION_LINE} -> graph 1" in str(report)


def test_golden_kernel_section_of_a_fused_reduction():
    report = tg.compile(lambda x, y: (x * y).exp().sum(dim=1)).explain(tg.ones(4, 8), tg.ones(4, 8))
    assert _normalize(report.graphs[0].kernels_text()) == """\
1 LLVM kernel, 0 NumPy steps (values named as in the optimized graph)
kernelN  reduction over [4,8] (32 elements), symbol tg_HASH
    writes %2 (16 B)
    reads  %x, %y (256 B)
    computes in registers %0, %1
    compiled in T ms"""


def test_golden_report_of_a_small_function():
    def affine(x, y):
        return (x * y + 1.0).exp()

    report = tg.compile(affine).explain(tg.ones(4), tg.ones(4))
    lines = _normalize(str(report)).splitlines()
    loc = f"{THIS_FILE}:{affine.__code__.co_firstlineno + 1}"
    assert "\n".join(lines[:2] + lines[3:]) == f"""\
explain affine: 1 graph (0 cache hits, 1 miss), 0 realization points, 1 LLVM kernel, 0 NumPy steps

  cache: miss: first call: nothing cached yet (graph compiled in T ms)
  traced graph:
    graph affine(%x: f32[4], %y: f32[4], %c2: f32[]) {{
      %0: f32[4] = mul(%x, %y)                                   # {loc}
      %1: f32[4] = add(%0, %c2)                                  # {loc}
      %2: f32[4] = exp(%1)                                       # {loc}
      return (%2)                                                # result
    }}
  optimized graph:
    graph affine(%x: f32[4], %y: f32[4], %c2: f32[]) {{
      %0: f32[4] = mul(%x, %y)                                   # {loc}
      %1: f32[4] = add(%0, %c2)                                  # {loc}
      %2: f32[4] = exp(%1)                                       # {loc}
      return (%2)                                                # result
    }}
  kernels: 1 LLVM kernel, 0 NumPy steps (values named as in the optimized graph)
    kernelN  map over [4] (4 elements), symbol tg_HASH
        writes %2 (16 B)
        reads  %x, %y, %c2 (36 B)
        computes in registers %0, %1
        compiled in T ms"""
    assert re.fullmatch(r"graph 1: affine, hash [0-9a-f]{12}", lines[2])


def test_explain_says_which_ops_ran_through_numpy():
    report = tg.compile(lambda a, b: (a ** b).exp()).explain(tg.ones(2, 3), tg.ones(2, 3))
    kernels = report.graphs[0].kernels
    (numpy_step,) = [k for k in kernels if not k.is_llvm]
    assert numpy_step.results == ["%0"] and "no LLVM lowering for `pow`" in str(numpy_step)


def test_explain_says_how_a_matmul_runs():
    report = tg.compile(lambda a, b: (a @ b).exp()).explain(tg.ones(2, 3), tg.ones(3, 2))
    (matmul_step,) = [k for k in report.graphs[0].kernels if not k.is_llvm]
    assert "NumPy's BLAS or the generated GEMM, whichever measured faster" in str(matmul_step)


def test_explain_counts_bytes_and_elements_of_each_kernel():
    report = tg.compile(lambda x: x.exp().sum()).explain(tg.ones(5, dtype=tg.float64))
    (kernel,) = report.graphs[0].kernels
    assert (kernel.elements, kernel.bytes_read, kernel.bytes_written) == (5, 40, 8)


def test_explain_reports_compile_time_of_each_new_kernel():
    report = tg.compile(lambda x: x.exp() + 1.0).explain(tg.ones(7))
    (kernel,) = report.graphs[0].kernels
    assert kernel.step.compile_seconds > 0 and kernel.timing().startswith(("compiled in", "loaded from"))


def test_second_call_with_the_same_types_is_a_cache_hit():
    compiled = tg.compile(lambda x: x.exp())
    compiled(tg.ones(3))
    report = compiled.explain(tg.ones(3))
    assert [e.hit for e in report.cache_events] == [True]
    assert "cache: hit" in str(report)
    assert report.graphs[0].kernels[0].timing().startswith("from the cache")


def test_llvm_ir_gives_the_ir_of_each_kernel():
    report = tg.compile(lambda x: (x.exp() * 2.0).sum()).explain(tg.ones(16))
    symbols = [k.step.symbol for k in report.graphs[0].kernels if k.is_llvm]
    text = report.llvm_ir()
    assert text.count("define void") == len(symbols) and all(s in text for s in symbols)


def test_optimized_llvm_ir_is_the_ir_after_llvm_passes():
    report = tg.compile(lambda x: x.exp() * 2.0).explain(tg.ones(64))
    assert report.llvm_ir(optimized=True) != report.llvm_ir()
    assert "define void" in report.llvm_ir(optimized=True)


def test_asm_gives_the_assembly_of_each_kernel():
    report = tg.compile(lambda x: x * 2.0).explain(tg.ones(64))
    (kernel,) = report.graphs[0].kernels
    assert f"{kernel.step.symbol}:" in report.asm() and "ret" in report.asm()


def test_explain_inside_a_compiled_function_raises():
    inner = tg.compile(lambda x: x * 2)

    @tg.compile
    def outer(x):
        return inner.explain(x)

    with pytest.raises(RuntimeError, match="cannot run inside another compiled function"):
        outer(tg.ones(2))


# --- miss reasons -----------------------------------------------------------------------------

def test_first_call_miss_says_nothing_was_cached():
    report = tg.compile(lambda x: x.exp()).explain(tg.ones(2))
    assert report.cache_events[0].reason.kind == "first"


def test_shape_change_miss_names_the_input_and_both_shapes():
    compiled = tg.compile(lambda x: x.exp())
    compiled(tg.ones(2, 3))
    reason = compiled.explain(tg.ones(4, 3)).cache_events[0].reason
    assert reason.kind == "shape"
    assert str(reason) == "shape of input %x changed: f32[4,3] (cached graph: f32[2,3])"


def test_dtype_change_miss_names_the_input_and_both_dtypes():
    compiled = tg.compile(lambda x: x.exp())
    compiled(tg.ones(3))
    reason = compiled.explain(tg.ones(3, dtype=tg.float64)).cache_events[0].reason
    assert reason.kind == "dtype"
    assert str(reason) == "dtype of input %x changed: f64[3] (cached graph: f32[3])"


def test_new_branch_miss_names_the_op_and_line_on_both_sides():
    compiled = tg.compile(_branch)
    compiled(tg.ones(3))
    report = compiled.explain(-tg.ones(3))
    realize, final = report.cache_events
    assert realize.hit
    assert final.reason.kind == "branch"
    # (The call's rest: its nodes but the realized condition's `gt`.)
    assert str(final.reason) == (f"new branch: node 1 is `log` at {THIS_FILE}:{LOG_LINE} where the cached "
                                 f"graph has `exp` at {THIS_FILE}:{EXP_LINE}")


def test_changed_python_constant_attribute_miss_names_the_attribute():
    dims = [0]
    compiled = tg.compile(lambda x: x.sum(dim=dims[0]))
    compiled(tg.ones(2, 2))
    dims[0] = 1
    reason = compiled.explain(tg.ones(2, 2)).cache_events[0].reason
    assert reason.kind == "attribute" and "axes=[1] (cached graph: axes=[0])" in str(reason)


def test_miss_reason_appears_in_the_report_text():
    compiled = tg.compile(lambda x: x.exp())
    compiled(tg.ones(2))
    assert "cache: miss: shape of input %x changed: f32[5] (cached graph: f32[2])" in str(
        compiled.explain(tg.ones(5)))


# --- the recompile warning ------------------------------------------------------------------------

def test_recompiling_more_than_the_limit_warns_once_naming_what_changes():
    # (every call traced: a function whose calls keep recompiling runs some eagerly, jit.backoff)
    compiled = tg.compile(lambda x: x * 2.0, recompile_limit=3, eager_fallback=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 8):
            compiled(tg.ones(n))
    recompile_warnings = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(recompile_warnings) == 1
    message = str(recompile_warnings[0].message)
    assert "recompiled 4 times (more than 3)" in message and "shape of %x (4 times)" in message


def test_recompile_warning_points_at_the_users_call():
    compiled = tg.compile(lambda x: x + 1.0, recompile_limit=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 4):
            compiled(tg.ones(n)); line = _line()  # noqa: E702
    (warning,) = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert (os.path.basename(warning.filename), warning.lineno) == (THIS_FILE, line)


def test_default_limit_allows_eight_recompiles():
    compiled = tg.compile(lambda x: x * 2.0, eager_fallback=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompileWarning)
        for n in range(1, 10):  # the first call and 8 recompiles
            compiled(tg.ones(n))
        with pytest.raises(RecompileWarning):
            compiled(tg.ones(10))


def test_cache_hits_do_not_count_as_recompiles():
    compiled = tg.compile(lambda x: x * 2.0, recompile_limit=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompileWarning)
        for _ in range(5):
            compiled(tg.ones(1))
            compiled(tg.ones(2))


def test_the_rest_of_a_call_after_a_realization_reads_the_realized_value_and_names_its_result():
    def step(x):
        y = x.exp()
        if y.sum() > 100:
            y = y / 2
        return (y + 1).log()

    report = tg.compile(step).explain(tg.ones(3))
    rest = report.graphs[-1]
    assert [node.op.name for node in rest.optimized.nodes] == ["add", "log"]  # (exp: realized)
    assert "# result" in str(report).split(f"graph {len(report.graphs)}:")[1]


def test_explain_lists_the_operand_views_a_product_takes():
    # A batch folded into rows and a transposed weight: the product takes both views itself.
    report = tg.compile(lambda x, w: x.reshape(-1, 5) @ w.T).explain(tg.ones(2, 3, 5), tg.ones(4, 5))
    text = report.graphs[0].kernels_text()
    assert "0 LLVM kernels, 1 NumPy step" in text
    assert "takes operand %0: f32[6,5] = reshape(%x, shape=[6,5]) as a NumPy view" in text
    assert "takes operand %1: f32[5,4] = permute(%w, perm=[1,0]) as a NumPy view" in text
