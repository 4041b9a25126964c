"""When a compiled function runs a call eagerly: the eager tier of `@tg.compile`.

A compiled call pays for tracing, keying and, on a new graph, building a program; a call
that follows a recording to a cached program pays almost nothing of that. So compiling
pays off on a function whose calls keep to a few graphs, and costs many times an eager
call on one whose calls keep making new graphs: a sequence model fed sequences of ever
new lengths, or a loop whose length the data decide while training settles (W11).

Such a function is *unsettled*: two of its traced calls within `WINDOW` traced calls made
new graphs (a recompile: any miss but its first call's); it is settled again by a traced
call that makes none. While unsettled:
- a call whose argument types (the shapes and dtypes of its tensor arguments) none of
  the last `SIGNATURES` calls had runs eagerly, as the function itself, outside any trace
  (eager execution is what compiled calls must equal: the results are the same). Arguments
  seen before trace: a function whose calls come back to a set of shapes (names of a few
  lengths, W10) compiles them from their second sighting on, and one whose graphs change
  with its data, not its arguments' types, traces every call as before;
- a new graph is built interpreted (NumPy steps, no code generation), as after
  `recompile_limit` graphs: it gets its kernels when it runs again.
One new graph now and then (a last short batch per epoch) never makes a function unsettled.

`tg.compile(fn, eager_fallback=False)` traces every call. The counts are approximate
when several threads call one function (no lock: a miscount moves one call to the other
tier, and both give the same results).
"""

from __future__ import annotations

from collections import OrderedDict

WINDOW = 8        # traced calls within which a second recompile makes the function unsettled
SIGNATURES = 64   # argument types remembered (the most recent calls')


class EagerBackoff:
    """Per compiled function: whether a call runs eagerly, from the recompiles of its
    traced calls and the argument types of its calls."""

    __slots__ = ("traced", "last_recompile", "unsettled", "seen", "eager_calls")

    def __init__(self):
        self.traced = 0              # traced calls so far
        self.last_recompile = None   # the traced call (its number) that last recompiled
        self.unsettled = False
        self.seen: OrderedDict = OrderedDict()  # argument types of recent calls made while unsettled
        self.eager_calls = 0         # calls run eagerly so far

    def take_eager(self, types: tuple) -> bool:
        """Whether a call with argument types `types` runs eagerly, the function being
        unsettled (and count it)."""
        seen = self.seen
        if types in seen:
            seen.move_to_end(types)
            return False
        seen[types] = True
        if len(seen) > SIGNATURES:
            seen.popitem(last=False)
        self.eager_calls += 1
        return True

    def traced_call(self, types: tuple | None, recompiled: bool) -> None:
        """Count a traced call with argument types `types` (None: not computed), and whether
        it made a new graph other than the first call's."""
        self.traced += 1
        if not recompiled:
            self.unsettled = False
            return
        last, self.last_recompile = self.last_recompile, self.traced
        if last is not None and self.traced - last <= WINDOW:
            self.unsettled = True
        if types is not None:
            self.seen[types] = True
            self.seen.move_to_end(types)

    def clear(self) -> None:
        """Forget the calls (`cache_clear`): the next calls trace."""
        self.__init__()
