"""From optax to eqxopt: `from_optax(tx)` (the other way, `opt.to_optax()`, is a
method of every transform).

optax is an optional dependency: it is imported only when these are used."""

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import equinox as eqx
import jax
import jax.numpy as jnp

from ._core._base import (
    AbstractTransform,
    Grads,
    Params,
    Supplied,
    Updates,
    optax_module,
)
from ._core._fields import checked_field
from ._core._tree import align_grads, compute_dtype, is_float_leaf


class OptaxTransformation(Protocol):
    """What `from_optax` takes: an optax gradient transformation (`init` and
    `update`)."""

    init: Callable[..., Any]
    update: Callable[..., Any]


def _gradient_transformation(name: str, value: OptaxTransformation) -> Any:
    if not isinstance(value, optax_module().GradientTransformation):
        raise TypeError(
            f"{name} must be an optax.GradientTransformation, got "
            f"{type(value).__name__}"
        )
    return value


def _optax_promotion():
    # optax's code promotes implicitly (a Python float to the power of its int32
    # count): JAX's standard promotion for it, whatever the caller's setting.
    return jax.numpy_dtype_promotion("standard")


class FromOptaxState(eqx.Module):
    """State of `FromOptax`.

    **Fields:**

    - `inner`: the optax state, as `tx.init` made it (for the float leaves only),
      with its plain Python numbers as arrays (as `jax.jit` passes them).
    """

    inner: Any


class FromOptax(AbstractTransform):
    """Any optax `GradientTransformation` as an eqxopt transform, so it can be
    chained with eqxopt ones and used through `update`/`step` (checked inputs, the
    compiled dispatch, dtype-keeping `step`, whole Equinox models without
    `eqx.filter`). Build it with `eqxopt.from_optax(tx)`.

    optax sees only the float leaves of the parameters (other leaves are `None` to
    it). Where a gradient is `None`, optax is given zeros and the update is dropped,
    but optax's state for that leaf advances as for a zero gradient (optax states
    are opaque, so it cannot be held back as eqxopt's own transforms do).
    Hyperparameters inside `tx` are baked into its functions: a new `tx` compiles a
    new step. Keyword arguments (`value=`, ...) are passed on when `tx` is a
    `GradientTransformationExtraArgs`.

    **Arguments:**

    - `tx`: an `optax.GradientTransformation`.
    """

    # An optax transformation may read the parameters (weight decay, ...), and
    # nothing here says whether it does: `update` needs them.
    reads_params = "optax transformation, which may read them"

    tx: Any = checked_field(_gradient_transformation)

    def takes_keyword(self, key: str) -> bool:
        # Every keyword, when `tx` takes extra arguments (optax's own transforms
        # ignore those they do not use); none otherwise.
        return isinstance(self.tx, optax_module().GradientTransformationExtraArgs)

    def wanted_keywords(self) -> Mapping[str, Supplied]:
        # What optax's own transforms that take extra arguments read (its
        # linesearches: the loss, its gradient and the loss as a function).
        if not self.takes_keyword("value"):
            return {}
        return {
            "value": Supplied.LOSS,
            "grad": Supplied.GRADIENT,
            "value_fn": Supplied.LOSS_FUNCTION,
        }

    def init(self, params: Params) -> FromOptaxState:
        with _optax_promotion():
            inner = self.tx.init(_float_only(params))
        return FromOptaxState(inner=jax.tree.map(_number_as_array, inner))

    def transform(
        self, grads: Grads, state: FromOptaxState, params: Params, **extra: Any
    ) -> tuple[Updates, FromOptaxState]:
        optax = optax_module()
        param_leaves, treedef = jax.tree.flatten(params)
        aligned = align_grads(grads, params)
        given = []
        for g, p in zip(aligned, param_leaves):
            if not is_float_leaf(p):
                given.append(None)
            elif g is None:
                given.append(jnp.zeros_like(p))
            else:
                given.append(g.astype(p.dtype))
        if extra and not isinstance(self.tx, optax.GradientTransformationExtraArgs):
            raise TypeError(
                f"this optax transformation takes no keyword arguments, got "
                f"{', '.join(map(repr, extra))}"
            )
        with _optax_promotion():
            updates, inner = self.tx.update(
                treedef.unflatten(given), state.inner, _float_only(params), **extra
            )
        update_leaves = treedef.flatten_up_to(updates)
        out = [
            None if g is None or u is None else u.astype(compute_dtype(p.dtype))
            for g, u, p in zip(aligned, update_leaves, param_leaves)
        ]
        return treedef.unflatten(out), FromOptaxState(inner=inner)


def _number_as_array(x: Any) -> Any:
    # A plain Python number in an optax state (a counter `tx.init` starts at 0) is
    # an array, as `jax.jit` makes it of every argument: a number would be a static
    # part of the compiled step, compiled again for each new value.
    if isinstance(x, (bool, int, float, complex)):
        return jnp.asarray(x)
    return x


def _float_only(params: Params) -> Params:
    return jax.tree.map(lambda p: p if is_float_leaf(p) else None, params)


def from_optax(tx: Any) -> FromOptax:
    """Wraps an optax `GradientTransformation` as an eqxopt transform
    (`FromOptax`), e.g.
    `eqxopt.Chain(eqxopt.from_optax(optax.clip(1.0)), eqxopt.Adam(1e-3))`.

    **Arguments:**

    - `tx`: an `optax.GradientTransformation`.

    **Example:**

    ```python
    import jax.numpy as jnp
    import optax
    import eqxopt

    opt = eqxopt.Chain(eqxopt.from_optax(optax.clip(1.0)), eqxopt.SGD(0.1))
    params = {"w": jnp.zeros(2)}
    grads = {"w": jnp.array([5.0, -0.5])}
    state = opt.init(params)
    params, state = opt.step(grads, state, params)
    assert jnp.allclose(params["w"], jnp.array([-0.1, 0.05]))  # clipped to [-1, 1]
    ```
    """
    return FromOptax(tx)
