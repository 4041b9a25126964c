"""`benchmarks/programs.py`: times a port's steps eager and compiled from the same weights
and prints the table docs/programs.md holds."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("programs_table", ROOT / "benchmarks" / "programs.py")
programs_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(programs_table)


def test_a_program_is_timed_in_each_mode():
    row = programs_table.measure("regression", steps=5)
    assert row["name"] == "regression" and row["steps"] == 5
    assert row["eager"] > 0 and row["compiled"] > 0


def test_the_table_has_a_row_per_program_and_the_compiled_ratio():
    text = programs_table.table([{"name": "p", "steps": 3, "eager": 2.0, "compiled": 1.0, "torch": None}])
    assert text.splitlines()[2] == "| p | 3 | 2.0 | 1.0 | - | 0.50 |"
