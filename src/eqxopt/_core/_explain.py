"""`explain_kernels`: which leaves of a step the native CPU kernels run, and why the
others run XLA's code."""

from typing import Any

import jax
import jax.numpy as jnp

from . import _backend
from ._base import AbstractTransform, Params
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

    - `opt`: the optimizer.
    - `params`: the parameters (arrays, or `jax.ShapeDtypeStruct`s).
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
    paths = dict(zip(range(len(jax.tree.leaves(abstract))), leaf_paths(abstract)))
    grads = jax.tree.map(
        lambda p: p if jnp.issubdtype(p.dtype, jnp.inexact) else None, abstract
    )
    state = jax.eval_shape(opt.init, abstract)
    log: list[tuple[str, Any, str | None]] = []
    names: dict[int, str] = {}

    def step(g: Any, s: Any, p: Any) -> Any:
        for i, leaf in enumerate(jax.tree.leaves(p)):
            names[id(leaf)] = paths[i]
        return opt.step(g, s, p, donate=True, **extra)

    _backend.recording.append(log)
    try:
        jax.eval_shape(step, grads, state, abstract)
    finally:
        _backend.recording.remove(log)
    if not log:
        return (
            f"{type(opt).__name__} runs no per-leaf rule through the engine: its "
            "step is XLA's code."
        )
    lines = [f"A donated {type(opt).__name__}.step on these parameters:"]
    for rule, p, why in log:
        where = names.get(id(p), f"a leaf {p.dtype}{list(p.shape)}")
        how = "native kernel" if why is None else f"XLA's code: {why}"
        lines.append(f"  {rule} on {where}: {how}")
    return "\n".join(lines)
