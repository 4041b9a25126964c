"""The end of a generated program: a scalar loss over results that require grad, its
backward (`backward()`, `autograd.grad`, twice with `retain_graph`, or a non-scalar backward
with an explicit gradient), and the list of tensors `program` returns."""

from __future__ import annotations


def _terms(b) -> list:
    return [v for v in b.pool if v.requires_grad and v.is_float and v.static
            and (v.numel or b.allows("size0_reduce"))]


def _piece(b, v) -> str:
    options = [f"{v.name}.sum()", f"({v.name} * {v.name}).sum() * 0.5"]
    if v.numel:
        options.append(f"{v.name}.mean()")
    return b.rng.choice(options)


def loss_and_outputs(b) -> list[str]:
    """Emit the loss and backward; the names (expressions) `program` returns."""
    args = {v.name for v in b.args}
    returned = [v.name for v in b.pool if v.name not in args][-5:]
    terms = _terms(b)
    if not terms:
        return returned
    recent = terms[-4:]
    chosen = b.rng.sample(recent, min(len(recent), b.rng.randint(1, 3)))
    retained = None
    if b.allows("retain_grad") and b.chance(0.15):
        candidates = [v for v in terms if not v.leaf]
        if candidates:
            retained = b.rng.choice(candidates)
            b.emit(f"{retained.name}.retain_grad()", "retain_grad")
    b.emit("loss = " + " + ".join(_piece(b, v) for v in chosen), "loss")
    kind = b.rng.choices(["backward", "autograd_grad", "backward_twice", "backward_gradient"], [65, 15, 10, 10])[0]
    targets = [v.name for v in b.args if v.requires_grad]
    if kind == "autograd_grad" and targets:
        b.emit(f"grads = torch.autograd.grad(loss, [{', '.join(targets)}], allow_unused=True)", kind)
        returned.append("*grads")
    elif kind == "backward_twice":
        b.emit("loss.backward(retain_graph=True)\n    loss.backward()", kind)
    elif kind == "backward_gradient" and chosen[0].ndim:
        v = chosen[0]
        b.emit(f"{v.name}.backward(torch.ones_like({v.name}))", kind)
    else:
        b.emit("loss.backward()", "backward")
    returned.append("loss")
    if retained is not None:
        returned.append(f"{retained.name}.grad")
    returned.extend(f"{name}.grad" for name in b.fresh_leaves)
    return returned
