"""`python benchmarks/surface_coverage.py CORPUS...`: how much of the PyTorch surface that
real programs use tracegrad has.

Each Python file under the corpus directories that imports torch is read as a syntax tree
(never run). The tool collects the dotted torch names the file uses, with its import aliases
resolved (`import torch.nn.functional as F` makes `F.relu` `torch.nn.functional.relu`;
`from torch.utils.data import DataLoader` makes `DataLoader` a use of
`torch.utils.data.DataLoader`), and the methods it calls that PyTorch's Tensor, Module or
Optimizer define (`x.view(...)` is `Tensor.view`). A name counts once per file. A name is
covered when the same path resolves in tracegrad. Coverage is weighted by files: the share
of (name, file) uses whose name tracegrad has.

Method calls are matched by name alone (the receiver's type is unknown without running the
program), so a NumPy array's `.sum()` counts as `Tensor.sum`; names that Python's own
containers and strings also define (`split`, `index`, `items`...) are left out for that
reason. With PyTorch installed, names PyTorch itself does not have (a local variable that
shadows an alias) are dropped; without it, method calls are not classified at all.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from collections import Counter, defaultdict
from pathlib import Path

# Methods of Python's own types: a call of one of these names says nothing about torch.
_PYTHON_METHODS = frozenset(name for kind in (list, dict, str, set, tuple, bytes, object) for name in dir(kind))


# Names tracegrad leaves out on purpose, by prefix, with the reason (docs/surface_coverage.md).
DECISIONS: dict[str, str] = {
    "torch.distributed.rpc": "RPC model parallelism: out of scope",
    "torch.distributed.autograd": "RPC model parallelism: out of scope",
    "torch.distributed.optim": "RPC model parallelism: out of scope",
    "torch.futures": "RPC model parallelism: out of scope",
    "torch.distributed.fsdp": "sharded and tensor-parallel multi-GPU training: out of scope",
    "torch.distributed.tensor": "sharded and tensor-parallel multi-GPU training: out of scope",
    "torch.distributed._tensor": "sharded and tensor-parallel multi-GPU training: out of scope",
    "torch.distributed.device_mesh": "sharded and tensor-parallel multi-GPU training: out of scope",
    "torch.distributed": "process groups and DDP: issue 19 (data-parallel training over MPI)",
    "torch.nn.parallel.DistributedDataParallel": "process groups and DDP: issue 19 (data-parallel training over MPI)",
    "torch.utils.data.distributed": "process groups and DDP: issue 19 (data-parallel training over MPI)",
    "torch.multiprocessing": "process groups and DDP: issue 19 (data-parallel training over MPI)",
    "torch.nn.DataParallel": "multi-GPU: out of scope (CPU only)",
    "torch.nn.parallel": "multi-GPU: out of scope (CPU only)",
    "torch.cuda": "CUDA devices: out of scope (CPU only; the queries answer False)",
    "torch.accelerator.set_device_index": "accelerator devices: out of scope (CPU only)",
    "torch.accelerator.device_index": "accelerator devices: out of scope (CPU only)",
    "torch.fx": "torch.fx graph capture: out of scope (tracegrad's own IR: tg.compile(fn).explain)",
    "torch.jit": "TorchScript and export: out of scope",
    "torch.onnx": "TorchScript and export: out of scope",
    "torch.classes": "TorchScript and export: out of scope",
    "torch.ops": "TorchScript and export: out of scope",
    "torch.hub": "downloads: out of scope (no network)",
    "torch.profiler": "profiling: out of scope (TRACEGRAD_LOG=timings instead)",
    "torch.autograd.profiler": "profiling: out of scope (TRACEGRAD_LOG=timings instead)",
    "torch.sparse_coo_tensor": "sparse and complex tensors: not yet",
    "torch.spmm": "sparse and complex tensors: not yet",
    "Tensor.to_sparse": "sparse and complex tensors: not yet",
    "torch.view_as_real": "sparse and complex tensors: not yet",
    "torch.view_as_complex": "sparse and complex tensors: not yet",
    "torch.polar": "sparse and complex tensors: not yet",
}


def decision(name: str) -> str | None:
    """The reason tracegrad leaves `name` out, or None (the longest matching prefix wins)."""
    matches = [p for p in DECISIONS if name == p or name.startswith(p + ".")]
    return DECISIONS[max(matches, key=len)] if matches else None


def _torch_classes() -> dict[str, type] | None:
    try:
        import torch
    except ImportError:
        return None
    return {"Tensor": torch.Tensor, "Module": torch.nn.Module, "Optimizer": torch.optim.Optimizer}


def _resolve(root: str, path: str) -> object | None:
    """The object at dotted `path` under package `root` (torch or tracegrad), importing
    submodules on the way, or None."""
    parts = path.split(".")
    obj = importlib.import_module(root)
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
            continue
        except Exception:  # torch's lazy namespaces raise other errors than AttributeError
            pass
        try:
            obj = importlib.import_module(".".join([root, *parts[:i + 1]]))
        except Exception:
            return None
    return obj


class _Uses(ast.NodeVisitor):
    """The torch names one file uses: dotted paths below `torch` and method names."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted torch path ("" is torch itself)
        self.paths: set[str] = set()
        self.methods: set[str] = set()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "torch" or alias.name.startswith("torch."):
                if alias.asname:
                    self.aliases[alias.asname] = alias.name[len("torch."):] if "." in alias.name else ""
                else:
                    self.aliases["torch"] = ""

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not (module == "torch" or module.startswith("torch.")):
            return
        base = module[len("torch."):] if "." in module else ""
        for alias in node.names:
            if alias.name == "*":
                continue
            path = f"{base}.{alias.name}" if base else alias.name
            self.aliases[alias.asname or alias.name] = path
            self.paths.add(path)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = []
        inner = node
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id in self.aliases:
            base = self.aliases[inner.id]
            self.paths.add(".".join(([base] if base else []) + chain[::-1]))
            return  # the inner attributes are prefixes of this path: not uses of their own
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        if isinstance(function, ast.Attribute) and not (isinstance(function.value, ast.Name)
                                                        and function.value.id in self.aliases):
            self.methods.add(function.attr)
        self.generic_visit(node)


def scan(corpus: list[Path]) -> tuple[Counter, dict[str, list[str]], int]:
    """(files per torch name, example files per name, number of files read)."""
    classes = _torch_classes()
    uses: Counter = Counter()
    where: dict[str, list[str]] = defaultdict(list)
    files = 0
    for root in corpus:
        for file in sorted(root.rglob("*.py")):
            text = file.read_text(errors="replace")
            if "torch" not in text:
                continue
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            visitor = _Uses()
            visitor.visit(tree)
            if not visitor.aliases:
                continue
            files += 1
            names = {f"torch.{p}" if p else "torch" for p in visitor.paths}
            if classes is not None:
                names = {n for n in names if n == "torch" or _resolve("torch", n[len("torch."):]) is not None}
                for method in visitor.methods - _PYTHON_METHODS:
                    owner = next((c for c, cls in classes.items() if hasattr(cls, method)), None)
                    if owner is not None and not method.startswith("_"):
                        names.add(f"{owner}.{method}")
            names.discard("torch")
            for name in names:
                uses[name] += 1
                where[name].append(str(file.relative_to(root.parent)))
    return uses, where, files


def covered(name: str) -> bool:
    """Whether tracegrad has the torch name (`torch.nn.Linear`, `Tensor.view`)."""
    owner, _, rest = name.partition(".")
    if owner == "torch":
        return _resolve("tracegrad", rest) is not None
    import tracegrad
    cls = {"Tensor": tracegrad.Tensor, "Module": tracegrad.nn.Module, "Optimizer": tracegrad.optim.Optimizer}[owner]
    return hasattr(cls, rest)


def report(uses: Counter, where: dict[str, list[str]], files: int, corpus: list[Path]) -> str:
    total = sum(uses.values())
    missing = sorted(((n, c) for n, c in uses.items() if not covered(n)), key=lambda item: (-item[1], item[0]))
    have = total - sum(c for _, c in missing)
    decided = [(n, c, decision(n)) for n, c in missing if decision(n) is not None]
    left = [(n, c) for n, c in missing if decision(n) is None]
    in_scope = total - sum(c for _, c, _ in decided)
    lines = [f"Corpus: {', '.join(p.name for p in corpus)}: {files} files that import torch, "
             f"{len(uses)} distinct torch names, {total} (name, file) uses.",
             f"Covered: {have} of {total} uses ({100.0 * have / max(total, 1):.1f}%), "
             f"{len(uses) - len(missing)} of {len(uses)} names.",
             f"Covered of the uses not left out on purpose: {have} of {in_scope} "
             f"({100.0 * have / max(in_scope, 1):.1f}%).", "",
             "Missing, not decided:", "", "| missing name | files | e.g. |", "|---|---|---|"]
    lines += [f"| `{n}` | {c} | {where[n][0]} |" for n, c in left]
    by_reason: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for n, c, reason in decided:
        by_reason[reason].append((n, c))
    lines += ["", "Left out on purpose:", "", "| reason | uses | names |", "|---|---|---|"]
    for reason, names in sorted(by_reason.items(), key=lambda item: -sum(c for _, c in item[1])):
        shown = ", ".join(f"`{n}`" for n, _ in names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        lines.append(f"| {reason} | {sum(c for _, c in names)} | {shown} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="+", type=Path, help="directories of Python files")
    args = parser.parse_args(argv)
    uses, where, files = scan(args.corpus)
    print(report(uses, where, files, args.corpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
