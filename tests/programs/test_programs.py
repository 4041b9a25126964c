"""Every program of `tests/programs/` (see harness.py) in its reduced configuration: eagerly
it reaches its outcome; compiled, its losses equal eager's step by step; and, when PyTorch is
installed, PyTorch running the same source from the same initial weights gives the same
losses step by step."""

import functools

import pytest

from tests.programs import harness

PROGRAMS = sorted(p.stem for p in harness.PORTS.glob("*.py") if p.stem != "__init__")


@functools.cache
def _program(name):
    return harness.load(name)


@functools.cache
def _eager(name):
    program = _program(name)
    return program.main(program.STEPS)


@pytest.mark.parametrize("name", PROGRAMS)
def test_eager_run_reaches_the_programs_outcome(name):
    _program(name).check(_eager(name))


@pytest.mark.parametrize("name", PROGRAMS)
def test_compiled_training_step_gives_eagers_losses(name):
    program, eager = _program(name), _eager(name)
    compiled = program.main(program.STEPS, compiled=True, init=eager["init"])
    if program.COMPILED_RTOL is None:
        program.check(compiled)
    else:
        harness.assert_losses_close(compiled["losses"], eager["losses"], program.COMPILED_RTOL, f"{name} compiled")


@pytest.mark.parametrize("name", PROGRAMS)
def test_pytorch_from_the_same_weights_gives_the_same_losses(name):
    pytest.importorskip("torch")
    program, eager = _program(name), _eager(name)
    theirs = harness.load(name, "torch").main(program.STEPS, init=eager["init"])
    if program.TORCH_RTOL is None:
        program.check(theirs)
    else:
        harness.assert_losses_close(eager["losses"], theirs["losses"], program.TORCH_RTOL, f"{name} against PyTorch")
