"""Running an inner transform only at the steps a predicate of the step count picks
(optax's `conditionally_transform` and `conditionally_mask`)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._core import _shards
from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._fields import checked_field, flag_field
from .._core._leafwise import map_leaves
from .._core._tree import increment, zero_step
from ._wrapper import AbstractSingleWrapper, inner_field, keywords_for


def _predicate(name: str, value: Callable[..., Any]) -> Callable:
    if not callable(value) or isinstance(value, eqx.Module):
        raise TypeError(
            f"{name} must be a function of the step count, got {type(value).__name__}"
        )
    return value


class ConditionallyTransformState(eqx.Module):
    """State of `ConditionallyTransform` (the fields of optax's
    `ConditionallyTransformState`).

    **Fields:**

    - `step`: int32 scalar, the number of calls so far (taken or not), the
      predicate's argument.
    - `inner`: the inner transform's state (unchanged on the steps not taken).
    """

    step: Int[Array, ""]
    inner: Any


class ConditionallyMaskState(eqx.Module):
    """State of `ConditionallyMask` (the fields of optax's
    `ConditionallyMaskState`).

    **Fields:**

    - `step`: int32 scalar, the number of calls so far (taken or not), the
      predicate's argument.
    - `inner`: the inner transform's state (unchanged on the steps not taken).
    """

    step: Int[Array, ""]
    inner: Any


class AbstractConditional(AbstractSingleWrapper):
    """A wrapper that runs `inner` only at the steps where
    `should_transform_fn(step)` holds, inside a `lax.cond`; a subclass says what
    the other steps' updates are (`masks`: zeros, else the updates unchanged) and
    its state type."""

    inner: eqx.AbstractVar[AbstractTransform]
    should_transform_fn: eqx.AbstractVar[Callable]
    forward_extra_args: eqx.AbstractVar[bool]
    masks: eqx.AbstractClassVar[bool]
    state_type: eqx.AbstractClassVar[type[Any]]

    def takes_keyword(self, key: str) -> bool:
        # A predicate given the keywords takes any of them.
        return self.forward_extra_args or super().takes_keyword(key)

    def init(self, params: Params) -> Any:
        return self.state_type(step=zero_step(), inner=self.inner.init(params))

    def transform(
        self, grads: Grads, state: Any, params: Params, **extra: Any
    ) -> tuple[Updates, Any]:
        self.check_keywords(extra)
        told = extra if self.forward_extra_args else {}
        taken = jnp.asarray(self.should_transform_fn(state.step, **told))
        if taken.shape != ():
            raise TypeError(
                f"{type(self).__name__}'s should_transform_fn must return a bool "
                f"scalar, got an array of shape {taken.shape}"
            )

        def run() -> tuple[Updates, Any]:
            return self.inner.transform(
                grads, state.inner, params, **keywords_for(self.inner, extra)
            )

        shapes, _ = jax.eval_shape(run)

        def hold() -> tuple[Updates, Any]:
            if self.masks:
                updates = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            else:
                passed, _ = map_leaves(lambda g, p: (g,), grads, params)
                updates = jax.tree.map(lambda u, s: u.astype(s.dtype), passed, shapes)
            return updates, state.inner

        # `_shards.cond` types both branches alike inside shard_map.
        updates, inner_state = _shards.cond(taken.astype(bool), run, hold)
        return updates, self.state_type(step=increment(state.step), inner=inner_state)


class ConditionallyTransform(AbstractConditional):
    """Runs `inner` only at the steps where `should_transform_fn(step)` holds;
    at the others the updates pass through unchanged and `inner`'s state stays as
    it was. The same as `optax.conditionally_transform`; `ConditionallyMask`
    zeroes the updates instead.

    `step` is the number of calls before this one (0 at the first), an int32
    scalar, counted whether `inner` ran or not; the predicate returns a bool
    scalar of the traced step (`step % 2 == 0`, `step >= 100`: no Python `if`).
    It is static, part of the compiled step's key: pass the same function each
    time (one defined at module level), not a new `lambda` per optimizer.
    `inner` runs inside a `lax.cond`, so a step not taken costs only the
    pass-through.

    **Arguments:**

    - `inner`: the transform to run at the chosen steps.
    - `should_transform_fn`: a function `step -> bool scalar`.
    - `forward_extra_args`: also give the predicate the keyword arguments of
      `update`/`step` (such as `value=`), as `should_transform_fn(step,
      **extra)` (a bool).
    """

    reduces_over = "nothing"

    inner: AbstractTransform = inner_field()
    should_transform_fn: Callable = checked_field(_predicate, static=True)
    forward_extra_args: bool = flag_field(False, kw_only=False)

    masks = False
    state_type = ConditionallyTransformState


class ConditionallyMask(AbstractConditional):
    """Runs `inner` only at the steps where `should_transform_fn(step)` holds;
    at the others the updates are zero and `inner`'s state stays as it was. The
    same as `optax.conditionally_mask`; `ConditionallyTransform` passes the
    updates through instead.

    `step` is the number of calls before this one (0 at the first), an int32
    scalar, counted whether `inner` ran or not; the predicate returns a bool
    scalar of the traced step (no Python `if`). It is static, part of the
    compiled step's key: pass the same function each time, not a new `lambda`
    per optimizer. `inner` runs inside a `lax.cond`.

    **Arguments:**

    - `inner`: the transform to run at the chosen steps.
    - `should_transform_fn`: a function `step -> bool scalar`.
    - `forward_extra_args`: also give the predicate the keyword arguments of
      `update`/`step` (such as `value=`), as `should_transform_fn(step,
      **extra)` (a bool).
    """

    reduces_over = "nothing"

    inner: AbstractTransform = inner_field()
    should_transform_fn: Callable = checked_field(_predicate, static=True)
    forward_extra_args: bool = flag_field(False, kw_only=False)

    masks = True
    state_type = ConditionallyMaskState
