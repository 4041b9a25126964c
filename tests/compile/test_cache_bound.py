"""The compile cache is bounded: a function called with ever new shapes keeps programs up to
its `cache_size`, `cache_clear()` and deleting the function give their memory back (the
kernels' machine code too, unless another program still runs it), and past the recompile
limit a new graph runs interpreted until it is seen again."""

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import object_loader
from tracegrad.jit.events import RecompileWarning

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _scaled_sum(x):
    return (x * 1.2345678).sum()  # (a constant no other test uses: a kernel of its own)


def _kernel_addresses(compiled) -> list[int]:
    return [ctypes.cast(step.function, ctypes.c_void_p).value
            for program in compiled._programs.values() for step in program.steps if hasattr(step, "function")]


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(part, 16) for part in line.split()[0].split("-"))
            if low <= address < high:
                return True
    return False


def _call_with_sizes(compiled, sizes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        for n in sizes:
            x = np.arange(n) / 7.0 + 1.0
            np.testing.assert_allclose(compiled(tg.from_numpy(x)).item(), (x * 1.2345678).sum(), rtol=1e-12)


def test_a_function_called_with_many_shapes_keeps_its_cache_within_its_size():
    compiled = tg.compile(_scaled_sum, cache_size=100_000)
    _call_with_sizes(compiled, range(1, 301))
    assert compiled._cache_bytes <= 100_000
    assert 0 < compiled.cache_info().graphs < 300
    _call_with_sizes(compiled, range(1, 21))  # evicted graphs are built again, results right


def test_cache_clear_drops_every_program():
    compiled = tg.compile(_scaled_sum)
    _call_with_sizes(compiled, range(1, 40))
    compiled.cache_clear()
    assert compiled.cache_info().graphs == 0 and compiled._cache_bytes == 0
    assert not compiled._inspect.origins


needs_object_loader = pytest.mark.skipif(not object_loader.supported()
                                         or os.environ.get("TRACEGRAD_OBJECT_LOADER") == "mcjit",
                                         reason="code placed by MCJIT is never given back")


@needs_object_loader
def test_cache_clear_unmaps_the_machine_code_of_the_kernels_only_it_ran():
    compiled = tg.compile(_scaled_sum)
    _call_with_sizes(compiled, [5, 6])
    addresses = _kernel_addresses(compiled)
    assert addresses and all(map(_mapped, addresses))
    compiled.cache_clear()
    gc.collect()
    assert not any(map(_mapped, addresses))


@needs_object_loader
def test_deleting_a_compiled_function_unmaps_the_machine_code_of_its_kernels():
    compiled = tg.compile(_scaled_sum)
    _call_with_sizes(compiled, [7, 8])
    addresses = _kernel_addresses(compiled)
    assert addresses and all(map(_mapped, addresses))
    del compiled
    gc.collect()
    assert not any(map(_mapped, addresses))


def test_a_kernel_another_program_still_runs_stays_when_one_function_is_cleared():
    first, second = tg.compile(_scaled_sum), tg.compile(_scaled_sum)
    _call_with_sizes(first, [9])
    _call_with_sizes(second, [9])  # the same kernel (one symbol, one copy of its code)
    assert _kernel_addresses(first) == _kernel_addresses(second)
    first.cache_clear()
    gc.collect()
    assert all(map(_mapped, _kernel_addresses(second)))
    _call_with_sizes(second, [9, 9])


def test_past_the_recompile_limit_a_new_graph_runs_interpreted_until_seen_again():
    compiled = tg.compile(_scaled_sum, recompile_limit=2)
    _call_with_sizes(compiled, [10, 11])
    assert compiled.cache_info().kernels == 2
    _call_with_sizes(compiled, [12])  # a third shape: no code generated for one call
    assert compiled.cache_info().kernels == 2 and compiled.cache_info().graphs == 3
    _call_with_sizes(compiled, [12, 12])  # seen again: compiled, in place
    assert compiled.cache_info().kernels == 3 and compiled.cache_info().graphs == 3



def test_a_graph_run_interpreted_is_not_optimized_until_it_compiles(monkeypatch):
    # The passes cost as much as building NumPy steps on a long graph, for a run that may
    # be its only one: the graph is optimized when it compiles, seen again.
    from tracegrad.jit import function as compile_function

    optimized = []
    original = compile_function.optimize
    monkeypatch.setattr(compile_function, "optimize", lambda graph, **options: optimized.append(graph.name)
                        or original(graph, **options))
    compiled = tg.compile(_scaled_sum, recompile_limit=1)
    _call_with_sizes(compiled, [13])
    assert len(optimized) == 1
    _call_with_sizes(compiled, [14])  # interpreted
    assert len(optimized) == 1 and compiled.cache_info().graphs == 2
    _call_with_sizes(compiled, [14])  # compiled, optimized
    assert len(optimized) == 2 and compiled.cache_info().kernels == 2


_MANY_SHAPES = textwrap.dedent("""
    import gc, warnings
    import tracegrad as tg
    warnings.simplefilter("ignore")
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    f = tg.compile(lambda x: (x * 2.0).sum())
    for n in range(1, 11):
        f(tg.ones(n))
    gc.collect()
    before = rss()
    for n in range(11, 611):
        f(tg.ones(n))
    gc.collect()
    print(rss() - before, f.cache_info().graphs)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_over_hundreds_of_shapes_stays_bounded(tmp_path):
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    env.pop("TRACEGRAD_CACHE", None)
    out = subprocess.run([sys.executable, "-c", _MANY_SHAPES], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=600).stdout
    growth, graphs = out.split()
    # (Before the bound: a new program with a compiled kernel per shape, ~130 KiB each.)
    assert float(growth) < 24 and int(graphs) <= 610
