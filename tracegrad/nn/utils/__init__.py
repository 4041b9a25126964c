"""`tg.nn.utils`: gradient clipping, flattening parameters into one vector and back, and
`rnn` (padded and packed sequences)."""

from tracegrad.nn.utils import rnn  # noqa: F401
from tracegrad.nn.utils.clip_grad import clip_grad_norm_, clip_grad_value_, get_total_norm  # noqa: F401
from tracegrad.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters  # noqa: F401
