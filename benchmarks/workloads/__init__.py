"""The workload registry: case id -> the module implementing it.

A workload module defines `CASES` (case id -> description), `make_inputs(case, smoke)`
(float32/int64 NumPy arrays, seeded), `reference_outputs(case, inputs)` (float64),
`min_bytes(case, inputs)` (the roofline traffic, or None), `build(peer, case, inputs)`
(a zero-argument step returning a dict of outputs) and optionally
`postprocess(outputs, inputs)` (maps the outputs to the reference's keys).

The real-model workloads (W7-W11) replace `reference_outputs` with a run of the same
program in PyTorch eager (see `_models.py`) and add `PEERS` (the rows they have),
`CHECK_STEPS`, `gemms` and `parameter_count` (their roofline and GEMM estimate).

W6 (first-call time) has no module of its own: it runs the cases in `COLD_START` in a
fresh process, once with an empty compiler cache and once with the cache the first
process left on disk.
"""

from __future__ import annotations

from workloads import (
    w1_bias_gelu,
    w2_layer_norm,
    w3_cross_entropy,
    w4_mlp_sgd,
    w5_small_chain,
    w7_gpt,
    w8_lstm_lm,
    w9_mnist_cnn,
    w10_char_rnn,
    w11_data_dependent,
)

MODULES = [w1_bias_gelu, w2_layer_norm, w3_cross_entropy, w4_mlp_sgd, w5_small_chain,
           w7_gpt, w8_lstm_lm, w9_mnist_cnn, w10_char_rnn, w11_data_dependent]
CASES = {case: module for module in MODULES for case in module.CASES}
DESCRIPTIONS = {case: module.CASES[case] for case, module in CASES.items()}
COLD_START = {"W1": "W1-fwdbwd", "W2": "W2-fwdbwd", "W4": "W4-step"}
WORKLOADS = ["W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11"]


def cases_of(workload: str) -> list[str]:
    """The case ids of workload `W1`..`W11` (W6 is handled by the driver)."""
    return [case for case in CASES if case.split("-")[0] == workload]
