"""DistributedDataParallel on two ranks (`mpiexec -n 2`, one launch of
`rank_programs.py ddp` whose results every test here reads) against one process training
on the concatenated global batch; and in this process as a group of one."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.distributed as dist
import tracegrad.nn.functional as F
from tests.distributed import rank_programs as programs
from tests.distributed.launch import NO_MPI, has_mpi4py, run_ranks

DDP = tg.nn.parallel.DistributedDataParallel
TRAININGS = ["eager", "eager_buckets", "compiled", "compiled_buckets"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[list, list]:
    out = tmp_path_factory.mktemp("ddp")
    result = run_ranks("ddp", str(out), timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    arrays = [dict(np.load(out / f"rank{rank}.npz")) for rank in (0, 1)]
    overlap = [json.loads((out / f"overlap{rank}.json").read_text()) for rank in (0, 1)]
    return arrays, overlap


def single_process_training(steps: int = programs.STEPS) -> dict[str, np.ndarray]:
    """The same SGD with momentum in one process on each whole global batch, from rank 0's
    initial parameters (which DDP broadcasts)."""
    model = programs.make_model(seed=0)
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = programs.make_step(model, optimizer)
    for x, y in programs.global_batches(steps):
        step(tg.tensor(x), tg.tensor(y))
    return programs.parameters_of(model)


@pytest.mark.parametrize("training", TRAININGS)
def test_every_rank_holds_bitwise_identical_parameters_after_training(ranks, training):
    arrays, _ = ranks
    names = [k for k in arrays[0] if k.startswith(training + "/")]
    assert len(names) >= 6
    for name in names:
        np.testing.assert_array_equal(arrays[0][name], arrays[1][name], err_msg=name)


@pytest.mark.parametrize("training", TRAININGS)
def test_two_ranks_train_as_one_process_on_the_global_batch(ranks, training):
    arrays, _ = ranks
    for name, expected in single_process_training().items():
        np.testing.assert_allclose(arrays[0][f"{training}/{name}"], expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_small_bucket_caps_split_the_parameters_into_several_buckets(ranks):
    arrays, _ = ranks
    assert arrays[0]["eager/buckets"] == 1 and arrays[0]["eager_buckets/buckets"] >= 2


@pytest.mark.parametrize("training", ["compiled", "compiled_buckets"])
def test_a_compiled_ddp_step_is_one_cached_program_holding_each_buckets_all_reduce(ranks, training):
    arrays, _ = ranks
    # The first step traces without momentum buffers, the second with them; then hits.
    assert arrays[0][f"{training}/cache_misses"] <= 2
    assert arrays[0][f"{training}/all_reduce_nodes"] == arrays[0][f"{training}/buckets"]


def test_a_buckets_all_reduce_starts_before_the_backward_has_delivered_every_gradient(ranks):
    _, overlap = ranks
    for found in overlap:
        events = found["events"]
        assert found["buckets"] == 6  # (one parameter each)
        first_start = events.index(next(e for e in events if e.startswith("all_reduce start")))
        last_grad = max(i for i, e in enumerate(events) if e.startswith("grad "))
        assert first_start < last_grad < events.index("backward returned")
        # Each bucket starts as soon as its one gradient arrives (DDP's hook runs first).
        for i, event in enumerate(events):
            if event.startswith("grad "):
                assert events[i - 1].startswith("all_reduce start")


def test_a_buckets_all_reduce_starts_before_the_backward_has_computed_the_first_layers_gradients(ranks):
    _, overlap = ranks
    for found in overlap:
        events = found["events"]
        computed = events.index("gradient of the first layer's output computed")
        started = [i for i, e in enumerate(events) if e.startswith("all_reduce start")]
        # The last two layers' four buckets are in flight while the backward still computes;
        # the first layer's two start after it (they need its output's gradient).
        assert len([i for i in started if i < computed]) == 4
        assert len([i for i in started if i > computed]) == 2
        assert [e for e in events if e.startswith("grad ")][:4] == [
            "grad 4.bias", "grad 4.weight", "grad 2.bias", "grad 2.weight"]


def test_gradients_accumulated_under_no_sync_average_as_one_big_batch(ranks):
    arrays, _ = ranks
    model = programs.make_model(seed=0)
    x, y = programs.global_batches(1)[0]
    F.cross_entropy(model(tg.tensor(x)), tg.tensor(y)).backward()
    for name, p in model.named_parameters():
        # Two micro-batches of 4 per rank: each rank's .grad sums two means over 4, so the
        # average over ranks is twice the gradient of the mean over all 16.
        for rank in (0, 1):
            np.testing.assert_allclose(arrays[rank][f"no_sync/{name}"], 2 * p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_no_sync_leaves_each_ranks_gradient_its_own(ranks):
    arrays, _ = ranks
    local = [arrays[rank]["no_sync/local_0.weight"] for rank in (0, 1)]
    assert not np.allclose(local[0], local[1])


def test_a_checkpoint_saved_on_rank_0_loads_on_every_rank(ranks):
    arrays, _ = ranks
    expected = single_process_training(steps=1)
    for rank in (0, 1):
        for name, value in expected.items():
            np.testing.assert_allclose(arrays[rank][f"checkpoint/{name}"], value, rtol=1e-5, atol=1e-6)


# A group of one -----------------------------------------------------------------------

needs_mpi4py = pytest.mark.skipif(not has_mpi4py(), reason=NO_MPI)


@pytest.fixture
def group():
    dist.init_process_group(backend="mpi")
    yield
    dist.destroy_process_group()


def test_wrapping_a_module_before_init_process_group_raises():
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        DDP(tg.nn.Linear(2, 2))


class TwoHeads(tg.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = tg.nn.Linear(3, 4)
        self.used = tg.nn.Linear(4, 2)
        self.unused = tg.nn.Linear(4, 2)

    def forward(self, x):
        return self.used(self.body(x))


@needs_mpi4py
def test_ddp_forwards_to_its_module_and_names_it_module(group):
    module = tg.nn.Linear(3, 2)
    model = DDP(module)
    x = tg.randn(5, 3)
    assert model.module is module
    tg.testing.assert_close(model(x), module(x))
    assert list(model.state_dict()) == ["module.weight", "module.bias"]


@needs_mpi4py
def test_device_ids_are_refused_for_a_cpu_module(group):
    with pytest.raises(ValueError, match="device_ids and output_device arguments only work with GPU modules"):
        DDP(tg.nn.Linear(3, 2), device_ids=[0])


@needs_mpi4py
def test_one_rank_ddp_gradients_equal_the_modules_own(group):
    module = TwoHeads()
    model = DDP(module, bucket_cap_mb=1e-5, find_unused_parameters=True)
    x = tg.randn(6, 3)
    model(x).square().sum().backward()
    got = {name: p.grad for name, p in module.named_parameters()}
    reference = TwoHeads()
    reference.load_state_dict(module.state_dict())
    reference(x).square().sum().backward()
    for name, p in reference.named_parameters():
        if name.startswith("unused"):
            assert got[name] is None  # unused on every rank: left alone, as PyTorch
        else:
            tg.testing.assert_close(got[name], p.grad)


@needs_mpi4py
def test_an_unused_parameter_without_find_unused_parameters_fails_the_next_forward(group):
    model = DDP(TwoHeads())
    x = tg.randn(2, 3)
    model(x).sum().backward()
    with pytest.raises(RuntimeError, match=r"Expected to have finished reduction in the prior iteration(.|\n)*"
                                           r"unused\.weight, unused\.bias"):
        model(x)


@needs_mpi4py
def test_one_rank_no_sync_accumulates_and_the_next_backward_keeps_the_sum(group):
    model = DDP(tg.nn.Linear(3, 1))
    x = tg.randn(4, 3)
    with model.no_sync():
        model(x).sum().backward()
    first = model.module.weight.grad.clone()
    model(x).sum().backward()
    tg.testing.assert_close(model.module.weight.grad, 2 * first)


@needs_mpi4py
def test_a_second_backward_through_one_forward_only_accumulates_locally_as_in_pytorch(group, monkeypatch):
    model = DDP(tg.nn.Linear(3, 1))
    out = model(tg.randn(4, 3)).sum()
    out.backward(retain_graph=True)
    first = model.module.weight.grad.clone()
    backend = dist.process_group.default_backend()
    monkeypatch.setattr(backend, "start_all_reduce", lambda *args: pytest.fail("a second reduction started"))
    out.backward()
    tg.testing.assert_close(model.module.weight.grad, 2 * first)
