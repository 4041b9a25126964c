"""The README's test command, with the project's pytest settings, prints the summary line."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_test_command() -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"&& python -m pytest([^\n]*)", text)
    assert match, "the README names no pytest command"
    return match.group(1).split()


def test_readme_test_command_prints_the_passed_count(tmp_path):
    # A throwaway test run with the project's configuration (pyproject.toml's addopts) and
    # the README's own flags: a user must see "N passed", which "-q -q" hides.
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    command = [sys.executable, "-m", "pytest", *_readme_test_command(), "-p", "no:cacheprovider",
               "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b1 passed\b", result.stdout), result.stdout
