"""The fuzzer's own behaviour: programs are deterministic per seed and valid PyTorch, the
comparison catches a wrong compiled value, a dtype change and a missing error, and a worker
that dies costs one program, reported as a crash."""

import numpy as np
import pytest

from tests.fuzz import batches, config, runner
from tests.fuzz.compare import COMPILE_ONLY_ERROR, CRASH, EAGER_ONLY_ERROR, MISMATCH, WRONG_VALUE, close, compare
from tests.fuzz.generator import generate
from tests.fuzz.runner import Outcome

PROGRAM = '''
def inputs(seed):
    rng = np.random.default_rng(seed)
    a = torch.tensor(rng.integers(-8, 9, (3, 4)) / 8, dtype=torch.float32, requires_grad=True)
    return [a], [a]


def program(a):
    t = (a * 2 + 1).tanh()
    t.sum().backward()
    return [t]
'''


def test_a_seed_gives_the_same_program_every_time():
    disabled = config.default_features()
    assert [generate(seed, disabled).source for seed in range(20)] == \
        [generate(seed, disabled).source for seed in range(20)]
    assert len({generate(seed, disabled).source for seed in range(20)}) == 20


def test_known_failures_are_left_out_unless_switched_on():
    disabled = config.default_features()
    assert set(config.KNOWN_FAILURES) <= disabled
    features = set().union(*(generate(seed, disabled).features for seed in range(300)))
    assert not features & disabled
    switched_on = config.default_features(extra=("size0_reduce",))
    assert "size0_reduce" not in switched_on


def test_generated_programs_run_under_pytorch():
    torch = pytest.importorskip("torch")
    disabled = config.default_features()
    ran = 0
    for seed in range(30):
        namespace = runner.load(generate(seed, disabled).source, torch, seed)
        outcome = runner.call(namespace["program"], namespace, seed)
        assert outcome.error is None or not outcome.error.startswith(("inputs:", "NameError", "AttributeError",
                                                                      "SyntaxError", "TypeError"))
        ran += outcome.error is None
    assert ran >= 20


def _perturb_compiled_programs(monkeypatch, change) -> None:
    """Every program built from now on gives `change(array)` for each floating result."""
    from tracegrad.autograd import backward_cache
    from tracegrad.autograd.lru import RecencyCache
    from tracegrad.codegen import program_builder
    build = program_builder.build_program
    # (The perturbed backward programs this builds must not outlive the test.)
    monkeypatch.setattr(backward_cache, "_entries", RecencyCache(backward_cache.CAPACITY))

    class Off:
        def __init__(self, real):
            self.real, self.feeds, self.kernel_count = real, None, real.kernel_count

        def __getattr__(self, name):  # (what the compile cache reads of a program: nbytes, ...)
            return getattr(self.real, name)

        def run(self, arrays):
            return [change(array) if array.dtype.kind == "f" else array for array in self.real.run(arrays)]

    monkeypatch.setattr(program_builder, "build_program", lambda graph, **kw: Off(build(graph, **kw)))


def test_a_wrong_compiled_value_is_reported(monkeypatch):
    _perturb_compiled_programs(monkeypatch, lambda array: array + 1)
    runs = runner.run_modes(PROGRAM, 0)
    failures = {mode: compare(0, mode, got, want) for mode, (got, want) in runs.items()}
    assert failures["compiled cold"].kind == WRONG_VALUE
    assert failures["eager#1"] is None  # (from the second, the backward cache builds perturbed programs too)
    assert failures["reference compiled"] is None


def test_the_comparison_checks_errors_dtypes_and_values_with_nan_equal():
    values = {"out0": np.array([1.0, np.nan], np.float32)}
    good = Outcome(values=values, dtypes={"out0": "float32"})
    assert compare(0, "compiled cold", good, good) is None
    doubled = Outcome(values={"out0": values["out0"].astype(np.float64)}, dtypes={"out0": "float64"})
    assert compare(0, "compiled cold", doubled, good).kind == MISMATCH
    raised = Outcome(error="RuntimeError: no")
    assert compare(0, "compiled cold", raised, good).kind == COMPILE_ONLY_ERROR
    assert compare(0, "compiled cold", good, raised).kind == EAGER_ONLY_ERROR
    assert compare(0, "compiled cold", raised, raised) is None
    assert close(np.array([1.0, np.inf]), np.array([1.0 + 1e-13, np.inf]))
    assert not close(np.array([1.0], np.float32), np.array([1.001], np.float32))


def test_a_worker_that_dies_costs_one_program_reported_as_a_crash():
    dying = PROGRAM.replace("    t.sum().backward()", "    import os\n    os._exit(3)")
    entries = [{"seed": seed, "source": source, "features": []}
               for seed, source in ((1, PROGRAM), (2, dying), (3, PROGRAM))]
    results = batches.run_batch(entries, batches.Options(frozenset(), warm=False, bisect=False))
    by_seed = {r["seed"]: r for r in results}
    assert sorted(by_seed) == [1, 2, 3]
    assert [f["kind"] for f in by_seed[2]["failures"]] == [CRASH]
    assert by_seed[1]["failures"] == [] and by_seed[3]["failures"] == []


def test_spread_ramps_as_steeply_as_the_values_so_layer_norm_stays_well_conditioned():
    import tracegrad
    from tests.fuzz.generator import PRELUDE
    namespace = {"np": np, "torch": tracegrad}
    exec(PRELUDE, namespace)
    spread = namespace["spread"]
    big = spread(tracegrad.full((5,), 1000.0, dtype=tracegrad.float64)).numpy()
    assert np.all(np.diff(big) >= 1000 / 16)
    # An infinity or NaN leaves the step finite, so the other elements stay finite too.
    odd = spread(tracegrad.tensor([1.0, float("inf"), float("nan"), 2.0], dtype=tracegrad.float64)).numpy()
    assert np.isfinite(odd[[0, 3]]).all() and odd[3] - odd[0] == 1 + 3 * 3 / 16


def test_a_loss_value_check_made_only_eagerly_is_a_documented_limit_of_compiled_modes():
    # Fuzz seed 20001282: binary_cross_entropy of a NaN probability raises eagerly (as in
    # PyTorch); compiled programs skip the check, as torch.compile's do (the README says so).
    want = Outcome(error="RuntimeError: all elements of input should be between 0 and 1")
    got = Outcome(values={"out0": np.array(np.nan)}, dtypes={"out0": "float32"})
    assert compare(1, "compiled cold", got, want).kind == "documented limit"
    assert compare(1, "eager fusion", got, want).kind == EAGER_ONLY_ERROR
    other = Outcome(error="RuntimeError: some other check")
    assert compare(1, "compiled cold", got, other).kind == EAGER_ONLY_ERROR


def test_rounding_noise_is_not_made_into_a_difference_by_the_generated_program(monkeypatch):
    # Seed 53004430 divided kl_div's rounded 0 (-1.5e-8 eagerly, 0.0 compiled) by an exact 0
    # (-inf against NaN); seed 53007257's loss summed the squares of batch_norm's output,
    # a constant whose gradient is rounding noise. Both were the program's, not tracegrad's.
    # (Drawn from the catalogue as it was then, before the recurrence and lstm families.)
    from tests.fuzz import catalog
    monkeypatch.setattr(catalog, "OPS", [(op, w) for op, w in catalog.OPS if op.__name__ not in ("recurrence", "lstm")])
    disabled = config.default_features()
    division = generate(53004430, disabled).source
    assert "t8 / (t5 * t5 + 0.5)" in division
    loss = next(line for line in generate(53007257, disabled).source.splitlines() if "loss =" in line)
    assert "torch.linspace(0.5, 1.5, " in loss


def _outcome(values: dict) -> Outcome:
    outcome = Outcome()
    for key, value in values.items():
        outcome.values[key] = np.asarray(value)
        outcome.dtypes[key] = outcome.values[key].dtype.name
    return outcome


def test_a_difference_is_the_references_rounding_only_where_float64_agrees_with_the_mode():
    from tests.fuzz.compare import rounding_only
    truth = _outcome({"grad:0": np.array([0.0, 1e-13], np.float64)})
    accurate = _outcome({"grad:0": np.array([0.0, 0.0], np.float32)})
    noisy = _outcome({"grad:0": np.array([0.0, -1.22e-4], np.float32)})
    assert rounding_only(0, "compiled cold", accurate, noisy, truth)      # the reference rounded
    assert not rounding_only(0, "compiled cold", noisy, accurate, truth)  # the mode did: a failure
    assert not rounding_only(0, "compiled cold", noisy, accurate, None)   # no arbiter
    other = _outcome({"grad:0": np.array([0.0, 5e-4], np.float64)})
    assert not rounding_only(0, "compiled cold", accurate, noisy, other)  # float64 agrees with neither


def test_the_float64_program_is_the_float32_one_at_another_precision():
    truth = runner.run_float64(PROGRAM, 0)
    want = runner.call(runner.load(PROGRAM, __import__("tracegrad"), 0)["program"],
                       runner.load(PROGRAM, __import__("tracegrad"), 0), 0)
    assert truth.error is None and truth.dtypes["out0"] == "float64" and list(truth.values) == list(want.values)
    np.testing.assert_allclose(truth.values["out0"], want.values["out0"], rtol=1e-6)
    import tracegrad as tg
    assert tg.get_default_dtype() == tg.float32  # (set back)
    assert runner.run_float64(PROGRAM.replace("t.sum()", "t.double().sum()"), 0) is None  # (mixes precisions)


def test_a_wrong_compiled_value_stays_a_failure_with_the_float64_arbiter(monkeypatch):
    from tests.fuzz import child
    _perturb_compiled_programs(monkeypatch, lambda array: array * (1 + 1e-3))
    result = child.run_program({"seed": 0, "source": PROGRAM, "features": []}, "full", False, False)
    kinds = {f["mode"]: f["kind"] for f in result["failures"]}
    assert kinds["compiled cold"] == WRONG_VALUE


# mse_loss saves its target in PyTorch (modified in place before the backward: a version
# error), its difference in tracegrad (no error, the gradient of the values it read).
SAVES_OTHERS = '''
def inputs(seed):
    a = torch.tensor([0.5, -1.0], dtype=torch.float32)
    b = torch.tensor([1.5, 0.25], dtype=torch.float32, requires_grad=True)
    return [a, b], [a, b]


def program(a, b):
    t = torch.nn.functional.mse_loss(a, b, reduction='none')
    with torch.no_grad():
        b.copy_(a)
    t.sum().backward()
    return [t]
'''


def test_a_version_error_only_pytorch_raises_is_judged_by_pytorch_saving_copies():
    pytest.importorskip("torch")
    from tests.fuzz import child
    from tests.fuzz.compare import TORCH_RAISES, TORCH_SAVES_OTHERS, VERSION_ERROR, WRONG_GRAD, NOT_FAILING
    assert runner.run_torch(SAVES_OTHERS, 0).error.startswith(VERSION_ERROR)
    copied = runner.run_torch(SAVES_OTHERS, 0, saved_copies=True)
    assert copied.error is None
    np.testing.assert_array_equal(copied.values["grad:1"], [2.0, 2.5])  # -2 (a - b) at the values read
    result = child.run_program({"seed": 0, "source": SAVES_OTHERS, "features": []}, "full", True, False)
    kinds = {f["mode"]: f["kind"] for f in result["failures"]}
    assert kinds == {"torch": TORCH_SAVES_OTHERS} and TORCH_SAVES_OTHERS in NOT_FAILING
    # A reference gradient that is not the one the values read is a failure against that run.
    want = runner.call(runner.load(SAVES_OTHERS, __import__("tracegrad"), 0)["program"],
                       runner.load(SAVES_OTHERS, __import__("tracegrad"), 0), 0)
    want.values["grad:1"] = want.values["grad:1"] * 0  # (as if the backward read b after the copy)
    raised = compare(0, "torch", runner.run_torch(SAVES_OTHERS, 0), want)
    assert raised.kind == TORCH_RAISES
    judged = child._judged_with_saved_copies(SAVES_OTHERS, 0, want, False, raised)
    assert judged.kind == WRONG_GRAD and "saving copies" in judged.detail
