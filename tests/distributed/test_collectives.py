"""tracegrad.distributed: the process group and the collectives' semantics. In this process
(a group of one: MPI's singleton, no launcher needed) when mpi4py is installed, and on two
ranks under `mpiexec -n 2` (one launch, `rank_programs.collectives`), each rank holding
different inputs."""

from __future__ import annotations

import builtins
import json

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.distributed as dist
from tests.distributed.launch import NO_MPI, has_mpi4py, run_ranks
from tracegrad.distributed import mpi_backend

needs_mpi4py = pytest.mark.skipif(not has_mpi4py(), reason=NO_MPI)


@pytest.fixture
def group():
    """The default group of this process alone (MPI stays initialized for the session)."""
    dist.init_process_group(backend="mpi")
    yield
    dist.destroy_process_group()


# Without a group --------------------------------------------------------------------

@pytest.mark.parametrize("call", [dist.get_rank, dist.get_world_size, dist.barrier,
                                  lambda: dist.all_reduce(tg.ones(2)), lambda: dist.broadcast(tg.ones(2), 0)])
def test_using_the_group_before_init_raises_pytorchs_error(call):
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        call()


def test_a_backend_other_than_mpi_is_refused_naming_mpi():
    with pytest.raises(ValueError, match="'mpi' backend only, got backend='nccl'"):
        dist.init_process_group(backend="nccl")
    assert not dist.is_initialized()


def test_a_missing_mpi4py_raises_an_import_error_naming_the_extra(monkeypatch):
    real_import = builtins.__import__

    def without_mpi4py(name, *args, **kwargs):
        if name.startswith("mpi4py"):
            raise ImportError("No module named 'mpi4py'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without_mpi4py)
    with pytest.raises(ImportError, match=r"pip install 'tracegrad\[distributed\]'"):
        dist.init_process_group(backend="mpi")
    assert not dist.is_initialized() and not dist.is_available()


# A group of one -----------------------------------------------------------------------

@needs_mpi4py
def test_a_process_started_without_a_launcher_is_rank_0_of_1(group):
    assert dist.is_initialized() and dist.get_backend() == "mpi"
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    assert dist.group.WORLD.size() == 1
    dist.barrier()


@needs_mpi4py
def test_initializing_twice_raises(group):
    with pytest.raises(ValueError, match="twice"):
        dist.init_process_group(backend="mpi")


@needs_mpi4py
@pytest.mark.parametrize("op", list(dist.ReduceOp))
def test_all_reduce_of_one_rank_keeps_the_values_in_the_same_buffer(group, op):
    t = tg.tensor([[1.5, -2.0], [3.0, 0.25]])
    buffer, version = t.numpy(), t._version
    assert dist.all_reduce(t, op=op) is None
    assert t.numpy() is buffer or np.shares_memory(t.numpy(), buffer)  # in place, zero-copy
    np.testing.assert_array_equal(t.numpy(), [[1.5, -2.0], [3.0, 0.25]])
    assert t._version == version + 1


@needs_mpi4py
def test_all_reduce_of_a_transposed_view_writes_through_to_its_base(group):
    base = tg.arange(6, dtype=tg.float64).reshape(2, 3)
    view = base.T
    dist.all_reduce(view, op=dist.ReduceOp.MAX)
    np.testing.assert_array_equal(base.numpy(), np.arange(6.0).reshape(2, 3))
    assert view._version == base._version


@needs_mpi4py
@pytest.mark.parametrize("dtype", [tg.float16, tg.int64, tg.int32, tg.float64])
def test_all_reduce_sum_takes_dtypes_mpi_has_no_reduction_for_too(group, dtype):
    t = tg.tensor([1, 2, 3], dtype=dtype)
    dist.all_reduce(t)
    assert t.dtype is dtype and t.tolist() == [1, 2, 3]


@needs_mpi4py
def test_all_reduce_avg_of_an_integer_tensor_raises_before_anything_changes(group):
    t = tg.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="ReduceOp.AVG needs a floating point tensor, got int64"):
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert t._version == 0


@needs_mpi4py
def test_async_all_reduce_returns_work_to_wait_on(group):
    t = tg.ones(4)
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    assert work.wait() is True and work.is_completed()
    assert t.tolist() == [1.0] * 4


@needs_mpi4py
def test_broadcast_from_a_rank_outside_the_group_raises(group):
    with pytest.raises(ValueError, match="src 1 is not a rank of the group"):
        dist.broadcast(tg.ones(2), src=1)


@needs_mpi4py
def test_all_gather_checks_the_list_length_and_fills_it(group):
    with pytest.raises(ValueError, match=r"world_size \(1\) tensors, got a list of 2"):
        dist.all_gather([tg.zeros(2), tg.zeros(2)], tg.ones(2))
    out = [tg.zeros(2, 3)]
    dist.all_gather(out, tg.arange(6.0).reshape(2, 3))
    assert out[0].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@needs_mpi4py
def test_reduce_scatter_of_one_rank_copies_its_own_piece(group):
    out = tg.zeros(3)
    dist.reduce_scatter(out, [tg.tensor([1.0, 2.0, 3.0])])
    assert out.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="must hold world_size"):
        dist.reduce_scatter_tensor(out, tg.zeros(4))


@needs_mpi4py
def test_object_collectives_of_one_rank(group):
    objects = [None]
    dist.all_gather_object(objects, {"a": [1, 2]})
    assert objects == [{"a": [1, 2]}]
    listed = ["x", 3]
    dist.broadcast_object_list(listed, src=0)
    assert listed == ["x", 3]


@needs_mpi4py
def test_all_reduce_inside_compile_is_a_node_of_the_cached_graph(group):
    @tg.compile
    def doubled_sum(x):
        y = x * 2
        dist.all_reduce(y)
        return y + 1
    for value in (1.0, 2.0, 3.0):
        assert doubled_sum(tg.full((3,), value)).tolist() == [2 * value + 1] * 3
    info = doubled_sum.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    explained = str(doubled_sum.explain(tg.ones(3)))
    assert 'all_reduce(%0, op="sum")' in explained
    assert "numpy    %1: f32[3] = all_reduce" in explained  # a NumPy step between kernels


@needs_mpi4py
def test_compiled_and_eager_all_reduce_agree(group):
    def fn(x):
        y = x.exp()
        dist.all_reduce(y, op=dist.ReduceOp.AVG)
        return y * x
    x = tg.linspace(-1, 1, 7)
    tg.testing.assert_close(tg.compile(fn)(x), fn(x))


@needs_mpi4py
def test_a_wait_past_the_timeout_raises_naming_the_collective():
    class NeverDone:
        def Test(self):  # noqa: N802 - mpi4py's name
            return False
    pending = mpi_backend.Pending(NeverDone(), None, "all_reduce", timeout=0.01)
    with pytest.raises(RuntimeError, match="all_reduce: timed out after 0.01 s waiting for the other ranks"):
        pending.wait()


# Two ranks -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("collectives")
    result = run_ranks("collectives", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _base(rank: int) -> np.ndarray:
    return np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * rank


@pytest.mark.parametrize("op, combine", [("SUM", np.add), ("AVG", lambda a, b: (a + b) / 2),
                                         ("PRODUCT", np.multiply), ("MIN", np.minimum), ("MAX", np.maximum)])
def test_all_reduce_on_two_ranks_gives_both_the_reduction(two_ranks, op, combine):
    expected = combine(_base(0), _base(1)).tolist()
    assert [found[f"all_reduce_{op}"] for found in two_ranks] == [expected, expected]


def test_all_reduce_on_two_ranks_of_a_transposed_view_and_async(two_ranks):
    total = _base(0) + _base(1)
    for found in two_ranks:
        assert found["all_reduce_transposed"] == total.T.tolist()
        assert found["all_reduce_async"] == total.tolist()


def test_broadcast_on_two_ranks_copies_the_source_ranks_tensor(two_ranks):
    assert [found["broadcast"] for found in two_ranks] == [[2.0, 2.0, 2.0]] * 2


def test_gathers_on_two_ranks_give_every_rank_every_ranks_tensor(two_ranks):
    for found in two_ranks:
        assert found["all_gather"] == [[0, 0], [1, 10]]
        assert found["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0]
        assert found["all_gather_object"] == [{"rank": 0, "name": "r0"}, {"rank": 1, "name": "r1"}]
        assert found["broadcast_object_list"] == ["from 0", 0]


def test_reduce_scatter_on_two_ranks_gives_each_rank_its_reduced_piece(two_ranks):
    # rank r sends [r + 1, 10 (r + 1)]: rank 0 gets 1 + 2, rank 1 gets 10 + 20.
    assert [found["reduce_scatter"] for found in two_ranks] == [[3.0, 3.0], [30.0, 30.0]]
    # arange(4) * (r + 1), MAX: rank 1's values, split in two.
    assert [found["reduce_scatter_tensor"] for found in two_ranks] == [[0.0, 2.0], [4.0, 6.0]]


def test_compiled_all_reduce_on_two_ranks_runs_in_every_call_of_one_program(two_ranks):
    for found in two_ranks:
        # (2 * rank 0's value) + (2 * rank 1's value) + 1, values r + step
        assert found["compiled_all_reduce"] == [[2 * (2 * step + 1) + 1] * 3 for step in range(3)]
        assert found["compiled_cache"] == [2, 1]
        assert "all_reduce" in found["compiled_graph"]


def test_a_second_compiled_all_reduce_of_a_written_tensor_reduces_the_first_result_on_two_ranks(two_ranks):
    for found in two_ranks:
        # ranks hold 1 and 2: the first sum is 3 on both, the second 3 + 3
        assert found["compiled_reduce_in_sequence"] == [[3.0, 3.0], [6.0, 6.0]]


def test_a_compiled_all_reduce_before_item_runs_once_per_call_on_two_ranks(two_ranks):
    for found in two_ranks:
        # ranks hold step and 1 + step: reduced r = 2 * step + 1, result r * (2 * r)
        expected = [[[2.0 * (2 * step + 1) ** 2] * 2, [2.0 * step + 1] * 2] for step in range(3)]
        assert found["compiled_reduce_then_item"] == expected
        assert found["compiled_reduce_then_item_calls"] == 3
