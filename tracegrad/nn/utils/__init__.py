"""`tg.nn.utils`: helpers around modules (`rnn`: padded and packed sequences)."""

from tracegrad.nn.utils import rnn  # noqa: F401
