"""`tg.nn`: Module, Parameter, layers and `functional`."""

from tracegrad.nn import functional  # noqa: F401
from tracegrad.nn.layers import Linear, ReLU, Sequential  # noqa: F401
from tracegrad.nn.module import Module  # noqa: F401
from tracegrad.nn.parameter import Parameter  # noqa: F401
