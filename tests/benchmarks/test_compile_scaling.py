"""benchmarks/compile_scaling.py: one depth, cold then warm, gives a row of the table whose
graph is the GPT step's and whose warm first call skips code generation."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compile_scaling.py"


def test_a_one_block_gpt_compiles_cold_and_loads_warm():
    done = subprocess.run([sys.executable, str(SCRIPT), "--layers", "1"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = done.stdout.strip().splitlines()[-1]
    blocks, nodes, kernels, cold, warm, build = [cell.strip() for cell in row.strip("|").split("|")][:6]
    assert blocks == "1" and int(nodes) > 300 and int(kernels) > 10
    assert float(warm.split()[0]) < float(cold.split()[0])  # (object code from the disk cache)
    assert float(build.split()[0]) > 0
