"""TRACEGRAD_LOG / TRACEGRAD_DUMP_DIR (`tracegrad.jit.inspect_log`): compile stages printed to
stderr or written to one file per graph, and per-step timings of compiled programs."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.jit import inspect_log
from tracegrad.runtime import step_timings as program_timings
from tracegrad.codegen.program_builder import build_numpy_program


@pytest.fixture
def log_stages():
    """Enable stages for one test; restore the settings afterwards."""
    saved = (inspect_log.stages, inspect_log.dump_dir, inspect_log.ACTIVE, program_timings.ENABLED)

    def enable(stages, directory=None):
        inspect_log.configure(stages, directory)

    yield enable
    inspect_log.stages, inspect_log.dump_dir, inspect_log.ACTIVE, program_timings.ENABLED = saved
    inspect_log.reset_timings()  # nothing left for the report at exit


def _branch(x):
    if x.sum() > 0:
        return x.exp()
    return x.log()


EXP_LINE = _branch.__code__.co_firstlineno + 2
LOG_LINE = _branch.__code__.co_firstlineno + 3
THIS_FILE = os.path.basename(__file__)


def _stderr_lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_recompiles_log_gives_the_shape_change_reason(log_stages, capsys):
    compiled = tg.compile(lambda x: x.exp())
    log_stages("recompiles")
    compiled(tg.ones(2))
    compiled(tg.ones(3))
    (line,) = _stderr_lines(capsys)
    assert line.startswith("[tracegrad] recompile: <lambda> graph ")
    assert line.endswith(": shape of input %x changed: f32[3] (cached graph: f32[2])")


def test_a_call_run_eagerly_is_logged_with_the_cache_lines(log_stages, capsys):
    # Calls that keep making new graphs: the function runs its next call eagerly (jit.backoff).
    compiled = tg.compile(lambda x: x.exp())
    log_stages("cache")
    for n in range(1, 5):
        compiled(tg.ones(n))
    lines = _stderr_lines(capsys)
    assert lines[-1] == ("[tracegrad] eager: <lambda> runs this call eagerly (its calls keep making "
                         "new graphs, and no recent call had arguments of these shapes)")
    assert sum(line.startswith("[tracegrad] cache miss") for line in lines) == 3


def test_recompiles_log_gives_the_dtype_change_reason(log_stages, capsys):
    compiled = tg.compile(lambda x: x.exp())
    log_stages("recompiles")
    compiled(tg.ones(2))
    compiled(tg.ones(2, dtype=tg.float64))
    (line,) = _stderr_lines(capsys)
    assert line.endswith(": dtype of input %x changed: f64[2] (cached graph: f32[2])")


def test_recompiles_log_gives_the_new_branch_reason(log_stages, capsys):
    compiled = tg.compile(_branch)
    log_stages("recompiles")
    compiled(tg.ones(2))
    compiled(-tg.ones(2))
    (line,) = _stderr_lines(capsys)
    # (of the call's rest: its nodes but the realized condition's `gt`)
    assert line.endswith(f": new branch: node 1 is `log` at {THIS_FILE}:{LOG_LINE} where the cached graph "
                         f"has `exp` at {THIS_FILE}:{EXP_LINE}")


def test_recompiles_log_is_silent_for_first_compiles_and_hits(log_stages, capsys):
    compiled = tg.compile(lambda x: x.exp())
    log_stages("recompiles")
    compiled(tg.ones(2))
    compiled(tg.ones(2))
    assert _stderr_lines(capsys) == []


def test_cache_log_has_one_line_per_lookup(log_stages, capsys):
    compiled = tg.compile(lambda x: x.exp())
    log_stages("cache")
    compiled(tg.ones(2))
    compiled(tg.ones(2))
    miss, hit = _stderr_lines(capsys)
    assert miss.startswith("[tracegrad] cache miss: <lambda> graph ")
    assert miss.endswith("first call: nothing cached yet")
    assert hit.startswith("[tracegrad] cache hit: <lambda> graph ")
    assert re.search(r"graph (\w+)", miss).group(1) == re.search(r"graph (\w+)", hit).group(1)


def test_graphs_log_prints_traced_and_optimized_graph_of_each_compile(log_stages, capsys):
    compiled = tg.compile(lambda x: x.exp() + x.exp())
    log_stages("graphs")
    compiled(tg.ones(2))
    err = capsys.readouterr().err
    assert "# traced graph\ngraph <lambda>(%x: f32[2]) {" in err
    assert "# optimized graph\ngraph <lambda>(%x: f32[2]) {" in err


def test_graphs_log_is_silent_on_cache_hits(log_stages, capsys):
    compiled = tg.compile(lambda x: x.exp())
    compiled(tg.ones(2))
    log_stages("graphs")
    compiled(tg.ones(2))
    assert capsys.readouterr().err == ""


def test_kernels_log_prints_the_fusion_groups(log_stages, capsys):
    compiled = tg.compile(lambda x: x.exp().sum())
    log_stages("kernels")
    compiled(tg.ones(6))
    err = capsys.readouterr().err
    assert "# kernels\n1 LLVM kernel, 0 NumPy steps" in err and "reduction over [6] (6 elements)" in err


def test_llvm_log_prints_each_kernels_ir(log_stages, capsys):
    compiled = tg.compile(lambda x: x * 2.0)
    log_stages("llvm")
    compiled(tg.ones(6))
    assert "# llvm\n; kernel" in capsys.readouterr().err


def test_asm_log_prints_each_kernels_assembly(log_stages, capsys):
    compiled = tg.compile(lambda x: x * 3.0)
    log_stages("asm")
    compiled(tg.ones(6))
    err = capsys.readouterr().err
    assert "# asm\n# kernel" in err and "ret" in err


def test_all_enables_every_stage(log_stages):
    log_stages("all")
    assert inspect_log.stages == frozenset(inspect_log.STAGES)


def test_unknown_stage_warns_and_lists_the_known_ones(log_stages):
    with pytest.warns(UserWarning, match="unknown stage.*graphz.*known stages: graphs"):
        log_stages("graphz,cache")
    assert inspect_log.stages == {"cache"}


def test_nothing_is_printed_when_no_stage_is_enabled(log_stages, capsys):
    log_stages(None)
    compiled = tg.compile(lambda x: x.exp())
    compiled(tg.ones(2))
    compiled(tg.ones(3))
    assert not inspect_log.ACTIVE and capsys.readouterr().err == ""


def test_dump_dir_writes_one_file_per_graph_named_by_its_hash(log_stages, tmp_path, capsys):
    compiled = tg.compile(_branch)
    log_stages(None, str(tmp_path))
    report = compiled.explain(tg.ones(2))
    compiled(-tg.ones(2))
    files = sorted(p.name for p in tmp_path.iterdir())
    hashes = [e.graph_hash for e in report.cache_events]
    assert f"_branch.realize.{hashes[0]}.txt" in files and f"_branch.{hashes[1]}.txt" in files
    assert len(files) == 4  # the realization graph, one graph per branch, events.log
    assert capsys.readouterr().err == ""


def test_dump_dir_file_holds_the_graph_and_kernel_stages(log_stages, tmp_path):
    compiled = tg.compile(lambda x: x.exp())
    log_stages(None, str(tmp_path))
    report = compiled.explain(tg.ones(2))
    text = (tmp_path / f"lambda.{report.cache_events[0].graph_hash}.txt").read_text()
    for section in ("# traced graph", "# optimized graph", "# kernels", "# llvm", "# asm"):
        assert section in text


def test_dump_dir_collects_cache_and_recompile_events_in_events_log(log_stages, tmp_path):
    compiled = tg.compile(lambda x: x.exp())
    log_stages(None, str(tmp_path))
    compiled(tg.ones(2))
    compiled(tg.ones(3))
    lines = (tmp_path / "events.log").read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == ["[tracegrad] cache miss", "[tracegrad] cache miss",
                                                      "[tracegrad] recompile"]


def test_environment_variable_enables_logging_for_a_whole_program():
    script = textwrap.dedent("""
        import tracegrad as tg
        from tracegrad.codegen.program_builder import build_numpy_program
        f = tg.compile(lambda x: x.exp(), builder=build_numpy_program)
        f(tg.ones(2))
        f(tg.ones(5))
    """)
    stderr = _run_with_log(script, "recompiles")
    assert stderr.strip().endswith("shape of input %x changed: f32[5] (cached graph: f32[2])")


def _run_with_log(script: str, stages: str) -> str:
    """Run `script` in a fresh interpreter with TRACEGRAD_LOG=stages; its stderr."""
    env = {**os.environ, "TRACEGRAD_LOG": stages}
    env.pop("TRACEGRAD_DUMP_DIR", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_numpy_programs_log_their_steps(log_stages, capsys):
    compiled = tg.compile(lambda x: x.exp(), builder=build_numpy_program)
    log_stages("kernels")
    compiled(tg.ones(2))
    assert "0 LLVM kernels, 1 NumPy step" in capsys.readouterr().err


def _timed_program(compiled):
    (record,) = inspect_log.timings()
    program = next(iter(compiled._programs.values()))
    return record, program


def test_timings_count_calls_and_the_bytes_each_kernel_reads_and_writes(log_stages):
    log_stages("timings")
    x = tg.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = tg.from_numpy(np.ones((3, 4), dtype=np.float32))
    compiled = tg.compile(lambda x, y: (x * y + 1.0).exp())
    for _ in range(3):
        compiled(x, y)
    record, program = _timed_program(compiled)
    assert record.runs == 3 and record.title == "<lambda>(f32[3,4], f32[3,4], f32[])"
    (step,) = record.steps
    assert step.kind == "llvm" and step.label == "mul+add+exp" and step.calls == 3
    assert step.bytes == 3 * (48 + 48 + 4 + 48)  # x, y, the scalar 1.0, the result
    assert step.seconds > 0 and step.flops == 0
    assert step.shapes == "f32[3,4] <- f32[3,4], f32[3,4], f32[]"


def test_timings_count_matmul_flops(log_stages):
    log_stages("timings")
    a = tg.from_numpy(np.ones((8, 5)))
    b = tg.from_numpy(np.ones((5, 3)))
    compiled = tg.compile(lambda a, b: a @ b)
    compiled(a, b)
    compiled(a, b)
    record, _ = _timed_program(compiled)
    (step,) = [s for s in record.steps if s.label == "matmul"]
    assert step.kind == "numpy" and step.flops == 2 * (2 * 8 * 5 * 3)
    assert step.bytes == 2 * 8 * (8 * 5 + 5 * 3 + 8 * 3)


def test_timings_report_lists_each_step_with_rates_and_shares(log_stages):
    log_stages("timings")
    compiled = tg.compile(lambda a, b: (a @ b).tanh().sum())
    compiled(tg.ones(16, 8), tg.ones(8, 4))
    report = inspect_log.timings_report()
    lines = report.splitlines()
    assert lines[0].startswith("[tracegrad] timings: 1 compiled graph(s), ")
    assert lines[2].startswith("graph <lambda>(f32[16,8], f32[8,4]): 1 runs, ")
    assert lines[3].split() == ["step", "kind", "label", "shapes", "(out", "<-", "in)", "calls", "mean", "µs",
                                "GB/s", "GFLOP/s", "threads", "share"]
    matmul, kernel = lines[4], lines[5]
    assert "numpy  matmul" in matmul and "f32[16,4] <- f32[16,8], f32[8,4]" in matmul
    assert "llvm   tanh+sum" in kernel and "f32[] <- f32[16,4]" in kernel
    shares = [float(line.rsplit(None, 1)[1].rstrip("%")) for line in (matmul, kernel)]
    assert abs(sum(shares) - 100) < 0.2


def test_a_program_given_its_kernels_in_place_gets_a_record_of_its_own(log_stages):
    # Past the recompile limit a graph first runs interpreted (NumPy steps), and seen again
    # becomes the compiled program in place: the same object, other steps.
    log_stages("timings")
    inspect_log.reset_timings()
    compiled = tg.compile(lambda x: (x * 2.0 + 1.0).exp(), recompile_limit=0)
    x = tg.ones(4)
    for _ in range(3):
        compiled(x)
    interpreted, built = sorted(inspect_log.timings(), key=lambda record: record.runs)
    assert interpreted.title.endswith(" [interpreted]") and interpreted.runs == 1
    assert [(s.kind, s.label) for s in interpreted.steps] == [("numpy", "mul"), ("numpy", "add"), ("numpy", "exp")]
    assert not built.title.endswith(" [interpreted]") and built.runs == 2
    assert [(s.kind, s.label, s.calls) for s in built.steps] == [("llvm", "mul+add+exp", 2)]


def test_timings_are_not_recorded_when_the_stage_is_off(log_stages):
    log_stages("kernels")
    inspect_log.reset_timings()
    compiled = tg.compile(lambda x: x.exp())
    compiled(tg.ones(4))
    assert not program_timings.ENABLED and inspect_log.timings() == []
    assert "nothing recorded" in inspect_log.timings_report()


def test_reset_timings_forgets_and_records_again(log_stages):
    log_stages("timings")
    compiled = tg.compile(lambda x: x.exp())
    compiled(tg.ones(4))
    inspect_log.reset_timings()
    assert inspect_log.timings() == []
    compiled(tg.ones(4))
    (record,) = inspect_log.timings()
    assert record.runs == 1


def test_timings_report_is_printed_at_exit():
    script = textwrap.dedent("""
        import tracegrad as tg
        f = tg.compile(lambda x: x.exp() * 2.0)
        f(tg.ones(100))
        f(tg.ones(100))
    """)
    stderr = _run_with_log(script, "timings")
    assert "graph <lambda>(f32[100], f32[]): 2 runs" in stderr
    assert "exp+mul" in stderr
