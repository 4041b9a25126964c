"""`benchmarks/surface_coverage.py`: the torch names a program uses, with import aliases
resolved, counted once per file, and the share of them tracegrad has."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("surface_coverage", ROOT / "benchmarks" / "surface_coverage.py")
coverage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(coverage)

PROGRAM = '''
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

class Net(nn.Module):
    def forward(self, x):
        return F.relu(torch.flatten(x, 1))

y = torch.nn.functional.relu(torch.zeros(2))
z = torch.not_a_torch_name_at_all
'''


def _corpus(tmp_path, text, copies=1):
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(copies):
        (root / f"p{i}.py").write_text(text)
    (root / "unrelated.py").write_text("import numpy\nnumpy.zeros(3)\n")
    return root


def test_aliases_resolve_to_dotted_torch_paths_counted_once_per_file(tmp_path):
    pytest.importorskip("torch")  # without torch, names are not checked against it
    uses, where, files = coverage.scan([_corpus(tmp_path, PROGRAM, copies=2)])
    assert files == 2
    assert uses["torch.nn.functional.relu"] == 2  # F.relu and the spelled-out path: one use per file
    assert uses["torch.nn.Module"] == 2 and uses["torch.flatten"] == 2 and uses["torch.zeros"] == 2
    assert uses["torch.utils.data.DataLoader"] == 2
    assert "torch.not_a_torch_name_at_all" not in uses  # PyTorch has no such name


def test_coverage_counts_what_tracegrad_has():
    assert coverage.covered("torch.nn.functional.relu")
    assert coverage.covered("torch.nn.Linear")
    assert coverage.covered("Tensor.view")
    assert not coverage.covered("torch.fx.symbolic_trace")
    assert not coverage.covered("Tensor.not_a_method")


def test_the_report_lists_missing_names_by_files_and_decisions_by_reason(tmp_path):
    uses = {"torch.zeros": 3, "torch.fx.symbolic_trace": 2, "torch.not_here": 1}
    where = {"torch.zeros": ["c/a.py"], "torch.fx.symbolic_trace": ["c/b.py"], "torch.not_here": ["c/c.py"]}
    text = coverage.report(uses, where, 3, [tmp_path])
    assert "Covered: 3 of 6 uses (50.0%), 1 of 3 names." in text
    assert "Covered of the uses not left out on purpose: 3 of 4 (75.0%)." in text
    assert "| `torch.not_here` | 1 | c/c.py |" in text
    assert f"| {coverage.DECISIONS['torch.fx']} | 2 | `torch.fx.symbolic_trace` |" in text


def test_the_longest_matching_prefix_decides():
    assert coverage.decision("torch.distributed.rpc.init_rpc") == coverage.DECISIONS["torch.distributed.rpc"]
    assert coverage.decision("torch.distributed.all_reduce") == coverage.DECISIONS["torch.distributed"]
    assert coverage.decision("torch.distributedx") is None and coverage.decision("torch.zeros") is None
