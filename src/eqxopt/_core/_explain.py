"""`explain_kernels`: which leaves of a step the native CPU kernels run, and why the
others run XLA's code."""

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from . import _backend
from ._base import AbstractTransform, Params
from ._fields import _Hyper
from ._schedule import Constant
from ._tree import leaf_paths


def explain_kernels(opt: AbstractTransform, params: Params, **extra: Any) -> str:
    """Says, leaf by leaf, whether a donated `opt.step` on `params` runs the native
    CPU kernels or XLA's code, and why (a rule that uses an operation the kernels
    do not translate, a leaf that is not float32, a rule that reads whole leaves,
    the kernels switched off, ...). Nothing is computed: the step is traced once
    on abstract values (`jax.eval_shape`), which builds the kernels it would use.

    The same reasons are logged at the DEBUG level of the `"eqxopt"` logger when a
    step is traced.

    **Arguments:**

    - `opt`: the optimizer. A transform of per-example gradients (`DPSGD`) is
      explained for a batch of them; a population (`eqxopt.population`) for the
      step of each member inside `eqx.filter_vmap`.
    - `params`: the parameters (arrays, or `jax.ShapeDtypeStruct`s); for a
      population, one member's or all of them stacked.
    - `**extra`: the keyword arguments its `step` needs (such as `value=`).

    **Returns:** the explanation, one line per parameter leaf and rule.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt.extend

    params = {"w": jnp.zeros((3, 4)), "h": jnp.zeros(4, jnp.bfloat16)}
    print(eqxopt.extend.explain_kernels(eqxopt.AdamW(1e-3), params))
    ```
    """
    backend = _backend.registered()
    if backend is None:
        return (
            "This installation has no native CPU kernels: every step runs XLA's code."
        )
    if not backend.usable():
        return f"The native CPU kernels are not in use: {backend.why_unusable()}."
    abstract = jax.eval_shape(lambda p: p, params)
    members = population_size(opt)
    if members is not None:
        abstract = _stacked(abstract, members)
    leaves = jax.tree.leaves(abstract)
    paths = dict(zip(range(len(leaves)), leaf_paths(abstract)))
    batch = (1,) if opt.takes_per_example_grads() else ()

    def gradient(p: Any) -> Any:
        if not jnp.issubdtype(p.dtype, jnp.inexact):
            return None
        if members is None:
            return jax.ShapeDtypeStruct((*batch, *p.shape), p.dtype)
        return jax.ShapeDtypeStruct((members, *batch, *p.shape[1:]), p.dtype)

    grads = jax.tree.map(gradient, abstract)
    log: list[tuple[str, Any, str | None]] = []
    names: dict[int, str] = {}

    def init(o: Any, p: Any) -> Any:
        return o.init(p)

    def step(o: Any, g: Any, s: Any, p: Any) -> Any:
        for i, leaf in enumerate(jax.tree.leaves(p)):
            names[id(leaf)] = paths[i]
        return o.step(g, s, p, donate=True, **extra)

    if members is not None:
        init, step = eqx.filter_vmap(init), eqx.filter_vmap(step)
    state = eqx.filter_eval_shape(init, opt, abstract)
    _backend.recording.append(log)
    try:
        eqx.filter_eval_shape(step, opt, grads, state, abstract)
    finally:
        _backend.recording.remove(log)
    name = type(opt).__name__
    if not log:
        return (
            f"{name} runs no per-leaf rule through the engine: its step is XLA's code."
        )
    if members is None:
        lines = [f"A donated {name}.step on these parameters:"]
    else:
        lines = [
            f"A donated {name}.step of each of the {members} members of the "
            "population (inside eqx.filter_vmap), on these parameters:"
        ]
    for rule, p, why in log:
        where = names.get(id(p), f"a leaf {p.dtype}{list(p.shape)}")
        how = "native kernel" if why is None else f"XLA's code: {why}"
        lines.append(f"  {rule} on {where}: {how}")
    return "\n".join(lines)


def population_size(opt: AbstractTransform) -> int | None:
    """The number of members of `opt` if it is a population (`eqxopt.population`:
    every array field stacked on a leading axis), else `None`: read from its float
    hyperparameters, which are scalars in one optimizer."""
    for module in _modules_in(opt):
        for field in dataclasses.fields(module):
            scalar = isinstance(field.metadata.get("converter"), _Hyper) or (
                isinstance(module, Constant) and field.name == "value"
            )
            value = getattr(module, field.name, None)
            if scalar and isinstance(value, jax.Array) and value.ndim >= 1:
                return int(value.shape[0])
    return None


def _modules_in(tree: Any) -> list[eqx.Module]:
    """Every Equinox module in `tree`, `tree` itself first."""
    found = []

    def visit(node: Any) -> None:
        if isinstance(node, eqx.Module):
            found.append(node)
            for field in dataclasses.fields(node):
                visit(getattr(node, field.name, None))
        elif isinstance(node, (list, tuple)):
            for item in node:
                visit(item)
        elif isinstance(node, dict):
            for item in node.values():
                visit(item)

    visit(tree)
    return found


def _stacked(abstract: Any, members: int) -> Any:
    """A population's parameters: `abstract` as given where every array has the
    leading axis of the members, else one member's stacked `members` times."""
    leaves = jax.tree.leaves(abstract)
    if leaves and all(x.ndim >= 1 and x.shape[0] == members for x in leaves):
        return abstract
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((members, *x.shape), x.dtype), abstract
    )
