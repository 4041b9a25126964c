"""Devices as PyTorch programs use them: the CPU is the one device, naming it anywhere works,
and naming another raises a clear error before anything is made or changed; the CUDA,
MPS and accelerator queries answer "not available"; backend flags are accepted."""

import numpy as np
import pytest

import tracegrad as tg

CPU_NAMES = ["cpu", "cpu:0", tg.device("cpu"), None]
CREATION = {
    "tensor": lambda **kw: tg.tensor([1.0, 2.0], **kw),
    "zeros": lambda **kw: tg.zeros(2, 3, **kw),
    "ones": lambda **kw: tg.ones((2,), **kw),
    "empty": lambda **kw: tg.empty(2, **kw),
    "full": lambda **kw: tg.full((2,), 1.5, **kw),
    "arange": lambda **kw: tg.arange(4, **kw),
    "linspace": lambda **kw: tg.linspace(0, 1, 5, **kw),
    "eye": lambda **kw: tg.eye(3, **kw),
    "zeros_like": lambda **kw: tg.zeros_like(tg.ones(2), **kw),
    "full_like": lambda **kw: tg.full_like(tg.ones(2), 3.0, **kw),
    "rand": lambda **kw: tg.rand(2, **kw),
    "randn": lambda **kw: tg.randn(2, **kw),
    "randint": lambda **kw: tg.randint(0, 5, (3,), **kw),
    "randn_like": lambda **kw: tg.randn_like(tg.ones(2), **kw),
}


def test_a_device_prints_compares_and_hashes_as_pytorchs():
    assert repr(tg.device("cpu")) == "device(type='cpu')"
    assert repr(tg.device("cuda", 1)) == "device(type='cuda', index=1)" and str(tg.device("cuda:1")) == "cuda:1"
    assert tg.device("cpu") == "cpu" and tg.device(tg.device("cpu")) == tg.device("cpu")
    assert len({tg.device("cpu"), tg.device("cpu"), tg.device("cuda")}) == 2


@pytest.mark.parametrize("text", ["gpu", "cuda:x", "cpu:-1"])
def test_a_malformed_device_string_is_refused(text):
    with pytest.raises(RuntimeError):
        tg.device(text)


@pytest.mark.parametrize("device", CPU_NAMES, ids=str)
@pytest.mark.parametrize("name", CREATION)
def test_every_creation_function_takes_the_cpu_as_its_device(name, device):
    t = CREATION[name](device=device)
    assert t.device == tg.device("cpu") and t.is_cuda is False


@pytest.mark.parametrize("device", ["cuda", "cuda:0", tg.device("mps")], ids=str)
@pytest.mark.parametrize("name", CREATION)
def test_another_device_is_refused_by_name(name, device):
    with pytest.raises(RuntimeError, match=rf"^{name}: tracegrad runs on the CPU only, so it cannot use device"):
        CREATION[name](device=device)


def test_neutral_creation_options_are_accepted_and_others_refused():
    assert tg.zeros(2, pin_memory=False).shape == (2,)
    with pytest.raises(RuntimeError, match="pin_memory=True is not supported"):
        tg.zeros(2, pin_memory=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        tg.ones(2, colour="red")


def test_to_a_device_keeps_the_tensor_and_converts_a_dtype_given_with_it():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    assert x.to("cpu") is x and x.to(tg.device("cpu")) is x and x.to(device="cpu", non_blocking=True) is x
    y = x.to("cpu", tg.float64)
    assert y.dtype is tg.float64 and y.grad_fn is not None
    copied = x.to("cpu", copy=True)
    assert copied is not x and np.array_equal(copied.detach().numpy(), x.detach().numpy())
    assert x.cpu() is x


def test_to_or_cuda_onto_another_device_raises_and_changes_nothing():
    x = tg.ones(2)
    version = x._version
    with pytest.raises(RuntimeError, match="Tensor.to: tracegrad runs on the CPU only"):
        x.to("cuda")
    with pytest.raises(RuntimeError, match="Tensor.cuda: tracegrad runs on the CPU only"):
        x.cuda()
    with pytest.raises(TypeError, match="invalid combination of arguments"):
        x.to("nowhere")
    assert x._version == version and x.device == tg.device("cpu")


def test_a_module_moves_to_the_cpu_and_refuses_cuda_before_changing_anything():
    model = tg.nn.Linear(3, 2)
    weight = model.weight
    assert model.to(tg.device("cpu")) is model and model.to("cpu", tg.float64).weight is weight
    assert weight.dtype is tg.float64
    with pytest.raises(RuntimeError, match="Module.to: tracegrad runs on the CPU only"):
        model.to("cuda", tg.float32)
    with pytest.raises(RuntimeError, match="Module.cuda: tracegrad runs on the CPU only"):
        model.cuda()
    assert weight.dtype is tg.float64


def test_the_usual_first_lines_of_a_program_run():
    device = tg.device("cuda" if tg.cuda.is_available() else "cpu")
    tg.backends.cudnn.benchmark = True
    tg.backends.cudnn.deterministic = True
    tg.cuda.manual_seed_all(0)
    tg.set_float32_matmul_precision("high")
    assert device == "cpu" and tg.get_float32_matmul_precision() == "high"
    assert not tg.backends.mps.is_available() and not tg.accelerator.is_available()
    assert tg.cuda.device_count() == 0 and tg.accelerator.current_accelerator() is None
    import tracegrad.backends.cudnn as cudnn
    assert cudnn.benchmark is True
    with pytest.raises(RuntimeError, match="tracegrad runs on the CPU only"):
        tg.cuda.synchronize()
    tg.set_float32_matmul_precision("highest")


def test_a_compiled_step_moving_tensors_to_the_cpu_equals_eager():
    model = tg.nn.Linear(4, 2)
    device = tg.device("cpu")

    def step(x):
        x = x.to(device)
        return model(x).sum().to("cpu")

    x = tg.randn(3, 4)
    np.testing.assert_allclose(tg.compile(step)(x).detach().numpy(), step(x).detach().numpy(), rtol=1e-6)


def test_the_default_dtype_decides_python_floats_and_integer_results():
    assert tg.get_default_dtype() is tg.float32
    tg.set_default_dtype(tg.float64)
    try:
        assert tg.tensor([0.1]).dtype is tg.float64 and tg.ones(2).dtype is tg.float64
        assert tg.tensor([1, 2]).exp().dtype is tg.float64
        assert tg.tensor([0.1]).item() == 0.1
    finally:
        tg.set_default_dtype(tg.float32)
    assert tg.tensor([0.1]).dtype is tg.float32
    with pytest.raises(TypeError, match="only floating-point types"):
        tg.set_default_dtype(tg.int64)


def test_constants_and_predicates():
    assert tg.inf == float("inf") and tg.pi == pytest.approx(3.141592653589793) and tg.e == pytest.approx(2.718281828)
    assert tg.nan != tg.nan
    x = tg.ones(2, 3)
    assert tg.is_tensor(x) and not tg.is_tensor(np.ones(2)) and tg.numel(x) == 6
    assert tg.is_floating_point(x) and not tg.is_floating_point(tg.tensor([1]))


def test_a_tensor_says_it_is_on_the_cpu_and_on_no_accelerator():
    t = tg.zeros(2)
    assert t.is_cpu is True
    assert (t.is_cuda, t.is_meta, t.is_mps, t.is_xpu) == (False, False, False, False)
