"""The quick, fixed-seed slice of the differential fuzzer CI runs: 100 programs through
every mode, one warm disk cache process included, with no failure. A failure prints each
failing program as a script; `python -m tests.fuzz --seed S --count 1` runs one again."""

from tests.fuzz import batches, config, report
from tests.fuzz.compare import NOT_FAILING

FIRST_SEED = 0
PROGRAMS = 100


def test_the_quick_slice_finds_no_failure():
    options = batches.Options(config.default_features(), batch_size=PROGRAMS)
    results, programs = batches.run(range(FIRST_SEED, FIRST_SEED + PROGRAMS), options)
    assert len(results) == PROGRAMS
    failing = [r for r in results if any(f["kind"] not in NOT_FAILING for f in r["failures"])]
    scripts = "\n\n".join(report.script(programs[r["seed"]], r["failures"]) for r in failing[:3])
    assert not failing, f"{report.summary(results, programs, 0.0)}\n\n{scripts}"
