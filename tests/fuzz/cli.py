"""`python -m tests.fuzz`: run the differential fuzzer from a seed, for a number of programs
or seconds, and print the failures (each as a standalone script) and a summary.

Program seeds are consecutive from `--seed`: `--seed S --count 1` runs program S again.
The exit status is 1 when some program failed (documented compile limits do not count).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from . import batches, config, report, tiers
from .compare import NOT_FAILING


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="the first program's seed (default 0)")
    parser.add_argument("--count", type=int, help="how many programs (default: until --seconds)")
    parser.add_argument("--seconds", type=float, help="run for this long (default 60 without --count)")
    parser.add_argument("--batch", type=int, default=50, help="programs per batch (default 50; each threshold "
                                                              "setting in processes of its own)")
    parser.add_argument("--tiers", choices=tiers.MODES, default="both",
                        help="small size thresholds (tests/fuzz/tiers.py) for: no program, every program, "
                             "or programs with odd seeds (default both)")
    parser.add_argument("--torch", action="store_true", help="PyTorch as an extra oracle")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm disk cache process")
    parser.add_argument("--no-bisect", action="store_true", help="do not bisect compiled failures")
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="FEATURE",
                        help="switch on a feature of config.KNOWN_FAILURES or NEW_FAILURES (repeatable)")
    parser.add_argument("--without", action="append", default=[], metavar="FEATURE",
                        help="switch a feature off (repeatable)")
    parser.add_argument("--all-features", action="store_true", help="every feature, the known and new failures too")
    parser.add_argument("--show", type=int, default=3, help="scripts printed per failure bucket (default 3)")
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON lines")
    parser.add_argument("--quiet", action="store_true", help="only the summary")
    return parser.parse_args(argv)


def seeds(first: int, count: int | None):
    seed = first
    while count is None or seed < first + count:
        yield seed
        seed += 1


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # A terminated run unwinds (SystemExit), so the worker process it waits on is killed too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    disabled = config.default_features(args.all_features, tuple(args.extra), tuple(args.without))
    options = batches.Options(disabled, batch_size=args.batch, with_torch=args.torch, warm=not args.no_warm,
                              bisect=not args.no_bisect, tiers=args.tiers)
    seconds = args.seconds if args.seconds is not None else (None if args.count is not None else 60.0)
    start = time.monotonic()
    deadline = start + seconds if seconds is not None else None
    print(f"fuzzing from seed {args.seed}; features off: {', '.join(sorted(disabled)) or '-'}", flush=True)

    def progress(batch_results, programs):
        if not args.quiet:
            failing = sum(1 for r in batch_results if any(f["kind"] not in NOT_FAILING for f in r["failures"]))
            print(f"  ... {len(programs)} programs, {time.monotonic() - start:.0f} s, {failing} failing in the "
                  f"last batch", file=sys.stderr, flush=True)

    results, programs = batches.run(seeds(args.seed, args.count), options, deadline, progress)
    elapsed = time.monotonic() - start
    if args.json:
        with open(args.json, "w") as f:
            for result in results:
                f.write(json.dumps({**result, "source": programs[result["seed"]]["source"]}) + "\n")
    if not args.quiet:
        print_scripts(results, programs, args.show)
    print(report.summary(results, programs, elapsed))
    failing = any(f["kind"] not in NOT_FAILING for r in results for f in r["failures"])
    return 1 if failing else 0


def print_scripts(results: list[dict], programs: dict[int, dict], show: int) -> None:
    by_seed = {r["seed"]: r for r in results}
    for (kind, group), bucket in report.buckets(results, programs).items():
        if kind in NOT_FAILING:
            continue
        for seed in bucket[:show]:
            print(f"\n{'=' * 30} {kind} [{group}], program {seed} {'=' * 30}")
            print(report.script(programs[seed], by_seed[seed]["failures"]))
