"""Argument names of compiled functions: Python parameter names, then `*args` positions."""

from tracegrad.jit.input_names import ArgumentNames


def test_the_first_arguments_are_named_after_the_parameters_then_the_varargs():
    def fn(x, y, *rest):
        return x
    names = ArgumentNames(fn)
    assert names.first(4) == ("x", "y", "rest.0", "rest.1")
    assert names.first(1) == ("x",)
    assert names.first(0) == ()


def test_arguments_beyond_the_signature_are_numbered():
    names = ArgumentNames(lambda x: x)
    assert names.first(3) == ("x", "arg1", "arg2")
