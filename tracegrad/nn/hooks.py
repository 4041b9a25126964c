"""Module hooks: `RemovableHandle` (what `register_forward_hook` and friends return) and
`call_with_hooks`, which runs a module's forward between its forward-pre hooks and its
forward hooks with PyTorch's arguments, order (`prepend`) and return-value rules."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any

_ids = itertools.count()


class RemovableHandle:
    """Removes its hook from the dicts it was added to (`handle.remove()`, or leaving a
    `with handle:` block)."""

    def __init__(self, *hooks_dicts: OrderedDict, extra_dicts: tuple[dict, ...] = ()):
        self.id = next(_ids)
        self._dicts = hooks_dicts + extra_dicts

    def remove(self) -> None:
        for hooks in self._dicts:
            hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()


def add_hook(hooks: OrderedDict, hook, prepend: bool, flags: dict[int, Any] | None = None,
             flag: Any = None) -> RemovableHandle:
    """Put `hook` in `hooks` (first if `prepend`), and its option in `flags`."""
    handle = RemovableHandle(hooks, extra_dicts=(flags,) if flags is not None else ())
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    if flags is not None and flag:
        flags[handle.id] = flag
    return handle


def call_with_hooks(module, args: tuple, kwargs: dict) -> Any:
    """Forward-pre hooks may replace the arguments (a non-tuple result becomes the one
    argument; with `with_kwargs`, a pair (args, kwargs)); forward hooks may replace the
    result. A hook registered with `always_call` runs even if forward raises."""
    for hook_id, hook in list(module._forward_pre_hooks.items()):
        if hook_id in module._forward_pre_hooks_with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                       f"but got {result}.")
                args, kwargs = result
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    called = set()
    try:
        output = module.forward(*args, **kwargs)
        for hook_id, hook in list(module._forward_hooks.items()):
            called.add(hook_id)
            if hook_id in module._forward_hooks_with_kwargs:
                result = hook(module, args, kwargs, output)
            else:
                result = hook(module, args, output)
            if result is not None:
                output = result
    except Exception:
        for hook_id, hook in list(module._forward_hooks.items()):
            if hook_id in module._forward_hooks_always_called and hook_id not in called:
                try:
                    if hook_id in module._forward_hooks_with_kwargs:
                        hook(module, args, kwargs, None)
                    else:
                        hook(module, args, None)
                except Exception:  # noqa: BLE001 - the forward's own error is the one to raise
                    pass
        raise
    return output
