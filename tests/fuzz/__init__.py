"""A differential fuzzer for tracegrad (issue 20: every result right or a clear error).

Random programs over the public API are generated as Python source written against a
module named `torch` (`generator.py`, with the op catalogue in `catalog.py` over the
abstract tensors of `model.py`), run eagerly (several times, so every tier of the eager
backward cache runs), compiled (cold, a cache hit, new values, a warm disk cache in a child
process: `child.py`), in reference mode and optionally in PyTorch (`runner.py`), and
compared (`compare.py`). `python -m tests.fuzz --seconds N --seed S` runs it (`cli.py`);
`test_fuzz_quick.py` is the fixed-seed slice CI runs. Features hitting bugs being fixed
are listed in `config.KNOWN_FAILURES` and left out by default.
"""
