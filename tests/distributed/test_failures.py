"""A run of two ranks in which something goes wrong ends, with an error that says what,
within seconds: never a silent hang (each launch has a timeout far above what it needs)."""

from __future__ import annotations

import time

from tests.distributed.launch import run_ranks

LAUNCH_TIMEOUT = 60  # (subprocess timeout: reaching it fails the test with TimeoutExpired)


def test_a_rank_that_raises_aborts_the_job_and_the_other_rank_does_not_hang(tmp_path):
    started = time.monotonic()
    result = run_ranks("raise", str(tmp_path), timeout=LAUNCH_TIMEOUT)
    assert result.returncode != 0
    assert "ValueError: rank 1 failed on purpose" in result.stderr
    assert "rank 1 of 2 raised ValueError; aborting the MPI job" in result.stderr
    assert "rank 0 finished training" not in result.stdout
    assert time.monotonic() - started < 30


def test_a_rank_that_stops_calling_collectives_makes_the_others_time_out(tmp_path):
    result = run_ranks("stall", str(tmp_path), timeout=LAUNCH_TIMEOUT, env={"RANK_PROGRAM_TIMEOUT": "2"})
    assert result.returncode != 0
    assert "RuntimeError: all_reduce: timed out after 2 s waiting for the other ranks" in result.stderr
    assert "rank 0 of 2 raised RuntimeError; aborting the MPI job" in result.stderr


def test_ranks_building_different_models_fail_at_construction_naming_the_parameter(tmp_path):
    result = run_ranks("mismatch", str(tmp_path), timeout=LAUNCH_TIMEOUT)
    assert result.returncode != 0
    assert ("DistributedDataParallel: rank 1's parameter '0.weight' has shape [6, 4] (float32), but rank 0's "
            "parameter '0.weight' has shape [5, 4] (float32); every rank must build the same model") in result.stderr
