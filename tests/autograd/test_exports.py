"""`tracegrad.autograd` loads its names on first use and then keeps them bound."""

import subprocess
import sys

import tracegrad as tg
from tracegrad.autograd import engine


def test_a_loaded_name_is_bound_in_the_module_and_is_the_engine_function():
    assert tg.autograd.grad is engine.grad
    assert vars(tg.autograd)["grad"] is engine.grad  # found without the loader next time


def test_gradcheck_stays_the_function_when_its_module_is_imported_after_it_was_loaded():
    code = ("import sys, tracegrad as tg; f = tg.autograd.gradcheck; "
            "import tracegrad.autograd.gradcheck; "
            "assert tg.autograd.gradcheck is f is sys.modules['tracegrad.autograd.gradcheck'].gradcheck")
    subprocess.run([sys.executable, "-c", code], check=True)
