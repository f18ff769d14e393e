"""Non-finite gradients: skip the step (optax `apply_if_finite`), or zero NaNs."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._fields import axis_name_field, count_field
from .._core._leafwise import map_leaves
from .._core._shards import AxisName, shard_total
from .._core._tree import align_grads, increment, is_float_leaf, scalar_for_leaf
from .._wrappers._wrapper import AbstractGate, inner_field


class SkipNonFiniteState(eqx.Module):
    """State of `SkipNonFinite` (the fields of optax's `ApplyIfFiniteState`).

    **Fields:**

    - `notfinite_count`: int32 scalar, consecutive steps with a NaN/inf gradient
      (reset to 0 by a finite one).
    - `last_finite`: bool scalar, whether the last gradients were all finite.
    - `total_notfinite`: int32 scalar, all steps with a NaN/inf gradient so far.
    - `inner`: the wrapped optimizer's state.
    """

    notfinite_count: Int[Array, ""]
    last_finite: Bool[Array, ""]
    total_notfinite: Int[Array, ""]
    inner: Any


class SkipNonFinite(AbstractGate):
    """Skips steps whose gradients hold a NaN or an infinity, as
    `optax.apply_if_finite`.

    When any gradient element is not finite, the update is zero and the inner
    state does not change (no moment, step count or schedule advance), so the bad
    values never reach the parameters. After more than `max_consecutive_errors`
    bad steps in a row it gives up and applies the inner update anyway (so a
    training run that has truly diverged shows it). The inner optimizer only runs
    on accepted steps (a `lax.cond`).

    **Arguments:**

    - `inner`: the optimizer (or chain) to protect.
    - `max_consecutive_errors`: how many bad steps in a row to skip, an int `>= 0`
      (an array field: changing it does not recompile).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      decision covers the whole model (a NaN in any device's block of a split leaf
      skips the step on every device), as the unsharded run. `None` (default):
      each device decides from its own blocks.
    """

    reduces_over = "tree"

    inner: AbstractTransform = inner_field()
    max_consecutive_errors: Int[Array, ""] = count_field(10, at_least_one=False)
    axis_name: AxisName = axis_name_field()

    state_type = SkipNonFiniteState

    def start(self, params: Params) -> dict[str, Any]:
        del params
        return dict(
            notfinite_count=jnp.zeros((), jnp.int32),
            last_finite=jnp.array(True),
            total_notfinite=jnp.zeros((), jnp.int32),
        )

    def gate(
        self, grads: Grads, state: SkipNonFiniteState, params: Params
    ) -> tuple[Any, dict[str, Any]]:
        finite = all_finite(grads, params, self.axis_name)
        count = jnp.where(finite, 0, increment(state.notfinite_count)).astype(jnp.int32)
        accept = jnp.logical_or(finite, count > self.max_consecutive_errors)
        return accept, dict(
            notfinite_count=count,
            last_finite=finite,
            total_notfinite=jnp.where(
                finite, state.total_notfinite, increment(state.total_notfinite)
            ),
        )


def apply_if_finite(
    inner: AbstractTransform, max_consecutive_errors: Any
) -> SkipNonFinite:
    """`SkipNonFinite(inner, max_consecutive_errors)`, under optax's name.

    **Arguments:**

    - `inner`: the optimizer (or chain) to protect.
    - `max_consecutive_errors`: how many bad steps in a row to skip, an int `>= 0`.
    """
    return SkipNonFinite(inner, max_consecutive_errors)


def all_finite(
    grads: Grads, params: Params, axis_name: AxisName = None
) -> Bool[Array, ""]:
    """Whether every element of every gradient (of a float parameter) is finite;
    with `axis_name`, over every device's block of the split leaves."""
    bad = [
        jnp.sum(jnp.logical_not(jnp.isfinite(g)), dtype=jnp.int32)
        for g, p in zip(align_grads(grads, params), jax.tree.leaves(params))
        if g is not None and is_float_leaf(p)
    ]
    return shard_total(bad, axis_name, "SkipNonFinite", jnp.int32) == 0


class ZeroNansState(eqx.Module):
    """State of `ZeroNans`.

    **Fields:**

    - `found_nan`: a bool scalar per float leaf (shaped like params, `None` at
      non-float leaves): whether the last gradient of that leaf held a NaN.
    """

    found_nan: PyTree[Bool[Array, ""] | None]


class ZeroNans(AbstractTransform):
    """Replaces NaN gradient elements with 0 (infinities are kept):
    `u = where(isnan(g), 0, g)`, recording per leaf whether a NaN was found. The
    same as `optax.zero_nans`."""

    reduces_over = "nothing"

    reads_params = None  # the parameters are not read (`params_needed`)

    def init(self, params: Params) -> ZeroNansState:
        return ZeroNansState(
            found_nan=jax.tree.map(
                lambda p: (
                    scalar_for_leaf(p, False, jnp.bool_) if is_float_leaf(p) else None
                ),
                params,
            )
        )

    def transform(
        self, grads: Grads, state: ZeroNansState, params: Params
    ) -> tuple[Updates, ZeroNansState]:
        updates, _ = map_leaves(
            lambda g, p: (jnp.where(jnp.isnan(g), jnp.zeros_like(g), g),),
            grads,
            params,
            elementwise=True,
        )
        treedef = jax.tree.structure(params)
        old = treedef.flatten_up_to(state.found_nan)
        found = [
            f if g is None or f is None else jnp.any(jnp.isnan(g))
            for g, f in zip(align_grads(grads, params), old)
        ]
        return updates, ZeroNansState(found_nan=treedef.unflatten(found))
