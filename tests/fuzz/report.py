"""What a fuzz run prints: failures bucketed by class and mode, the features every program
of a bucket shares, throughput, and each failing program as a standalone script (which
becomes a regression test by copy-paste)."""

from __future__ import annotations

import collections

from . import tiers
from .compare import NOT_FAILING
from .runner import NEW_VALUES

FOOTER = '''

if __name__ == "__main__":
    def show(tag, function, seed):
        args, leaves = inputs(seed)
        try:
            results = function(*args)
        except Exception as error:
            print(tag, "raised", type(error).__name__, error)
            return
        print(tag, "results", [None if t is None else t.detach().numpy().tolist() for t in results])
        print(tag, "grads  ", [None if t.grad is None else t.grad.numpy().tolist() for t in leaves])
        print(tag, "args   ", [t.detach().numpy().tolist() for t in args])

    show("eager   ", program, {seed})
    compiled = torch.compile(program)  # (with real PyTorch, call `program` instead)
    show("compiled", compiled, {seed})
    show("compiled", compiled, {seed})
    show("compiled new values", compiled, {new_seed})
'''


def script(entry: dict, failures: list[dict]) -> str:
    """A program and its failures as a script that runs it eagerly and compiled."""
    seed = entry["seed"]
    lines = [f"# tracegrad fuzz program {seed}: python -m tests.fuzz --seed {seed} --count 1"]
    for failure in failures:
        lines.append(f"# {failure['kind']} in {failure['mode']}: {failure['detail']}")
        if failure.get("bisect"):
            lines.append(f"#   bisect: {failure['bisect']}")
    lines.append(f"# features: {', '.join(sorted(entry['features']))}")
    lines += ["import numpy as np", "import tracegrad as torch  # the same program runs with `import torch`"]
    if entry.get("small"):
        lines += ["# It ran with small size thresholds (tests/fuzz/tiers.py):"] + tiers.script_lines()
    return "\n".join(lines + ["", ""]) + entry["source"] + FOOTER.format(seed=seed, new_seed=seed + NEW_VALUES)


def mode_group(mode: str) -> str:
    small = " (small thresholds)" if mode.endswith("(small thresholds)") else ""
    if mode.startswith("eager"):
        return "eager speed layers" + small
    if mode.startswith("compiled") and "warm" not in mode:
        return "compiled" + small
    return mode


def buckets(results: list[dict], programs: dict[int, dict]) -> dict[tuple, list[int]]:
    """(class, mode group) -> seeds of the programs failing that way (once per program)."""
    found: dict[tuple, list[int]] = collections.defaultdict(list)
    for result in results:
        seen = set()
        for failure in result["failures"]:
            key = (failure["kind"], mode_group(failure["mode"]))
            if key not in seen:
                seen.add(key)
                found[key].append(result["seed"])
    return dict(found)


def shared_features(seeds: list[int], programs: dict[int, dict]) -> list[str]:
    """The features every program of `seeds` has (the likely culprits of a bucket)."""
    common = None
    for seed in seeds:
        features = set(programs[seed]["features"]) - {"loss", "backward"}
        common = features if common is None else common & features
    return sorted(common or ())


def summary(results: list[dict], programs: dict[int, dict], seconds: float) -> str:
    failing = {r["seed"] for r in results if any(f["kind"] not in NOT_FAILING for f in r["failures"])}
    raised = sum(1 for r in results if r.get("reference_error"))
    lines = [f"programs run: {len(results)} in {seconds:.0f} s ({len(results) / max(seconds, 1e-9):.2f} programs/s); "
             f"the reference raised in {raised}; failing programs: {len(failing)}"]
    warm = [r["warm_kernels"] for r in results if r.get("warm_kernels")]
    if warm:
        lines.append(f"warm disk cache processes: {sum(k['loaded'] for k in warm)} kernels loaded from disk, "
                     f"{sum(k['compiled'] for k in warm)} compiled")
    for (kind, group), seeds in sorted(buckets(results, programs).items(), key=lambda item: -len(item[1])):
        shown = " ".join(map(str, seeds[:12])) + (" ..." if len(seeds) > 12 else "")
        lines.append(f"  {len(seeds):5d}  {kind} [{group}]  seeds: {shown}")
        lines.append(f"         shared features: {', '.join(shared_features(seeds, programs)) or '-'}")
    return "\n".join(lines)
