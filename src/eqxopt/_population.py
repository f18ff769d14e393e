"""Population training: one optimizer per member of a population, stacked along a
leading axis, so that `eqx.filter_vmap` trains N models in one compiled program."""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._core._base import AbstractTransform, checked_transform
from ._core._checks import is_concrete


def population(
    make_opt: Callable[..., AbstractTransform], /, **values: Any
) -> AbstractTransform:
    r"""$N$ optimizers with different hyperparameter values, stacked into one: every
    array field of the result has a leading axis of size $N$, member $i$'s value at
    index $i$. Mapped with `eqx.filter_vmap` together with $N$ stacked models and
    their states, it trains the $N$ models in one compiled program:

    $$
    \big(\theta^{(i)}, s^{(i)}\big) \leftarrow
    \mathrm{opt}^{(i)}.\mathrm{step}\big(g^{(i)}, s^{(i)}, \theta^{(i)}\big),
    \qquad \mathrm{opt}^{(i)} = \texttt{make\_opt}(k = v_k[i], \dots),
    \quad i = 1, \dots, N.
    $$

    Each member is built on its own by `make_opt` (a float given as a scalar
    array, as the stacked values are), so its values are checked as any
    optimizer's are: a negative learning rate among the $N$ is a `ValueError`
    naming the argument and the member. The members must differ only in the values
    of array fields (float hyperparameters, a schedule's values and step counts),
    not in static ones (a mask, a dtype, a schedule of another kind). Values that
    are traced (a population built inside `jax.jit`) are mapped through
    `make_opt` with `eqx.filter_vmap` instead, unchecked, as traced values are.

    Use it through `eqx.filter_vmap` over the optimizer, the models and the
    states: `init`, `update`, `step` and a `make_train_step` step called with
    `opt=` all work on one member at a time inside the map, and mean there what
    they mean for one model. An `eqx.filter_jit` around the mapped function
    compiles it once (with `donate="all-except-first"` and the optimizer first,
    the models and states are updated in place). A `TrainStep` called on stacked
    models directly, without the map, would treat the population as one model.

    **Arguments:**

    - `make_opt`: a function of the keyword arguments named in `values` returning
      an eqxopt optimizer or transform, such as
      `lambda learning_rate, weight_decay: eqxopt.AdamW(learning_rate,
      weight_decay=weight_decay)`.
    - `**values`: per keyword of `make_opt`, one value per member: a sequence
      of $N$ values (numbers, arrays, schedules) or an array whose leading axis
      has size $N$. Every keyword must give the same $N \ge 1$.

    **Returns:** the stacked optimizer (of `make_opt`'s class).

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxopt

    opts = eqxopt.population(
        lambda learning_rate: eqxopt.SGD(learning_rate, momentum=0.9),
        learning_rate=[0.1, 0.01, 0.001],
    )
    params = jnp.ones((3, 2))  # three members' parameters, stacked
    grads = jnp.ones((3, 2))
    states = eqx.filter_vmap(lambda opt, p: opt.init(p))(opts, params)
    step = eqx.filter_vmap(lambda opt, g, s, p: opt.step(g, s, p))
    params, states = step(opts, grads, states, params)
    assert jnp.allclose(params[:, 0], jnp.array([0.9, 0.99, 0.999]))
    ```
    """
    if not callable(make_opt):
        raise TypeError(f"make_opt must be callable, got {type(make_opt).__name__}")
    if not values:
        raise TypeError(
            "population needs at least one hyperparameter with one value per "
            "member, such as population(make_opt, learning_rate=[1e-3, 1e-2])"
        )
    sizes = {name: _size(name, value) for name, value in values.items()}
    given = ", ".join(f"{name} has {n}" for name, n in sizes.items())
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"population sizes differ: {given} values; give every hyperparameter "
            "one value per member"
        )
    (size,) = set(sizes.values())
    if size == 0:
        raise ValueError(f"a population needs at least one member; {given} values")
    if not all(is_concrete(x) for x in jax.tree.leaves(values)):
        # Traced values cannot be checked now; the map gives every array field
        # its leading axis (fields that do not depend on `values` broadcast).
        stacked = {name: _stacked(value) for name, value in values.items()}
        opt = eqx.filter_vmap(lambda kw: make_opt(**kw))(stacked)
        return checked_transform("make_opt's result", opt)
    members = [_member(make_opt, values, i) for i in range(size)]
    parts = [eqx.partition(m, eqx.is_array) for m in members]
    first_arrays, first_static = parts[0]
    for i, (arrays, static) in enumerate(parts[1:], start=1):
        if jax.tree.structure(arrays) != jax.tree.structure(
            first_arrays
        ) or not eqx.tree_equal(static, first_static):
            raise ValueError(
                _mismatch(members, 0, i, "in its structure or a static field")
            )
        if _shapes(arrays) != _shapes(first_arrays):
            raise ValueError(_mismatch(members, 0, i, "in an array's shape or dtype"))
    arrays = _stacked([a for a, _ in parts])
    return eqx.combine(arrays, first_static)


def _size(name: str, value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return len(value)
    if eqx.is_array_like(value) and jnp.ndim(value) >= 1:
        return int(jnp.shape(value)[0])
    raise ValueError(
        f"{name} must hold one value per member (a list, a tuple or an array with "
        f"the members on its leading axis), got {_describe(value)}"
    )


def _describe(value: Any) -> str:
    if eqx.is_array_like(value) and not isinstance(value, (int, float, complex)):
        return f"an array of shape {jnp.shape(value)}"
    return repr(value)


def _stacked(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return jax.tree.map(lambda *xs: jnp.stack(xs), *value)
    return value


def _member(make_opt: Callable[..., Any], values: dict[str, Any], i: int) -> Any:
    # A float is passed as an array: members are stacked data, and an option that
    # a plain number decides otherwise (`SGD` keeps no momentum buffer for a
    # plain 0) must be the same for every member.
    kwargs = {name: _as_array(value[i]) for name, value in values.items()}
    try:
        opt = make_opt(**kwargs)
    except (ValueError, TypeError) as error:
        # The optimizer's own message names the argument; say which member it is.
        where = ", ".join(f"{k}={_show(v)}" for k, v in kwargs.items())
        kind = ValueError if isinstance(error, ValueError) else TypeError
        raise kind(f"population member {i} ({where}): {error}") from error
    return checked_transform("make_opt's result", opt)


def _as_array(value: Any) -> Any:
    # NumPy's, which keeps the number as given (float64) for the checks' messages.
    return np.asarray(value) if isinstance(value, float) else value


def _show(value: Any) -> str:
    if eqx.is_array(value) and np.ndim(value) == 0:
        return repr(np.asarray(value).item())
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shapes(tree: Any) -> Sequence[tuple[tuple[int, ...], Any]]:
    return [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]


def _mismatch(members: list[Any], a: int, b: int, where: str) -> str:
    return (
        f"population member {b} differs from member {a} {where} "
        f"({type(members[b]).__name__}); the members may differ only in the values "
        "of array fields (float hyperparameters, a schedule's values and step "
        "counts), not in a mask, a dtype, an option or the kind of a schedule"
    )
