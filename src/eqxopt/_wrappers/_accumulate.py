"""Gradient accumulation over micro-steps (optax `MultiSteps`), and the predicates
optax ships for its `should_skip_update_fn` (`skip_not_finite`,
`skip_large_updates`)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import renames
from .._core._fields import checked_field, count_field, flag_field
from .._core._norms import sum_of_squares
from .._core._tree import (
    align_grads,
    compute_dtype,
    full_like_leaf,
    increment,
    is_float_leaf,
    scalar_for_leaf,
)
from ._wrapper import AbstractSingleWrapper, inner_field


class MultiStepsState(eqx.Module):
    """State of `MultiSteps`.

    **Fields:**

    - `mini_step`: int32 scalar, the micro-steps accumulated since the last update
      (`0 <= mini_step < every_k`, unless `every_k` was lowered since: the next call
      then updates).
    - `gradient_step`: int32 scalar, the updates made by the inner optimizer.
    - `acc`: the mean of the gradients accumulated so far, shaped like params, in at
      least float32 (`None` at non-float leaves). The only parameter-sized buffer
      `MultiSteps` adds.
    - `counts`: per float leaf, an int32 scalar: the number of gradients in its
      `acc` (the micro-steps in which it had one; `None` at non-float leaves).
    - `inner`: the inner optimizer's state.
    - `skip_state`: what `should_skip_update_fn` returned beside its decision at
      the last call (at `init`: for zero gradients); `()`, no arrays, without a
      predicate, as in optax.
    - `skipped`: with `should_skip_update_fn`, a bool scalar: whether the
      predicate skipped the call that produced this state (`False` at `init`);
      `None` without a predicate, when no call is ever skipped.
    """

    mini_step: Int[Array, ""]
    gradient_step: Int[Array, ""]
    acc: PyTree[Float[Array, "..."] | None]
    counts: PyTree[Int[Array, ""] | None]
    inner: Any
    # Last, with an empty default: without a predicate the state's array leaves
    # are those it had before the option existed (checkpoints of leaves load).
    skip_state: PyTree = ()
    # `None` without a predicate, for the same reason. A skipped call leaves the
    # counters as they were, so they alone cannot tell it from the call before it.
    skipped: Bool[Array, ""] | None = None


def skip_not_finite(
    updates: PyTree, gradient_step: Any, params: Any
) -> tuple[Array, dict[str, Array]]:
    """A `should_skip_update_fn` for `MultiSteps` (optax's `skip_not_finite`):
    skip the micro-step when any gradient is NaN or infinite.

    **Arguments:**

    - `updates`: the gradients `MultiSteps` was given (`None` leaves ignored).
    - `gradient_step`: the updates made so far (unused).
    - `params`: the parameters (unused).

    **Returns:** `(should_skip, skip_state)`: a bool scalar, and the dict
    `{"should_skip": should_skip, "num_not_finite": n}` with `n` the number of
    non-finite gradient entries (int32).
    """
    del gradient_step, params
    counts = [
        jnp.sum(jnp.logical_not(jnp.isfinite(g)), dtype=jnp.int32)
        for g in jax.tree.leaves(updates)
    ]
    num_not_finite = sum(counts, jnp.zeros((), jnp.int32))
    should_skip = num_not_finite > 0
    return should_skip, {"should_skip": should_skip, "num_not_finite": num_not_finite}


def skip_large_updates(
    updates: PyTree, gradient_step: Any, params: Any, max_squared_norm: Any
) -> tuple[Array, dict[str, Array]]:
    r"""A `should_skip_update_fn` for `MultiSteps` (optax's `skip_large_updates`):
    skip the micro-step when the gradients' squared global norm reaches
    `max_squared_norm`, or is NaN:

    $$
    \mathrm{skip} = \lnot\left(
        \sum_i \lVert g_i \rVert^2 < \mathrm{max\_squared\_norm}
    \right)
    $$

    Bind the bound first: `functools.partial(skip_large_updates,
    max_squared_norm=10.0)`. (`SkipLargeUpdates` is the same test as a wrapper of
    any optimizer.)

    **Arguments:**

    - `updates`: the gradients `MultiSteps` was given (`None` leaves ignored).
    - `gradient_step`: the updates made so far (unused).
    - `params`: the parameters (unused).
    - `max_squared_norm`: the bound on the squared global norm (a number or
      scalar array).

    **Returns:** `(should_skip, skip_state)`: a bool scalar, and the dict
    `{"should_skip": should_skip, "norm_squared": s}` with `s` the squared global
    norm (each leaf summed in at least float32).
    """
    del gradient_step, params
    norm_sq = sum_of_squares(jax.tree.leaves(updates), None, "skip_large_updates")
    should_skip = jnp.logical_not(
        norm_sq < jnp.asarray(max_squared_norm, norm_sq.dtype)
    )
    return should_skip, {"should_skip": should_skip, "norm_squared": norm_sq}


def _skip_predicate(name: str, value: Callable[..., Any] | None) -> Callable | None:
    if value is not None and (not callable(value) or isinstance(value, eqx.Module)):
        raise TypeError(
            f"{name} must be a function (updates, gradient_step, params) -> "
            f"(should_skip, skip_state), or None; got {type(value).__name__}"
        )
    return value


class MultiSteps(AbstractSingleWrapper):
    r"""Gradient accumulation: averages the gradients of `every_k` micro-steps and
    makes one update of `inner` with the mean, as `optax.MultiSteps`.

    $$
    \begin{aligned}
    n &\leftarrow n + 1, \quad
        \mathrm{acc} \leftarrow \mathrm{acc} + \frac{g - \mathrm{acc}}{n}
        && \text{(every call: a running mean)} \\
    u &= \mathrm{inner}(\mathrm{acc}), \quad \mathrm{acc} \leftarrow 0,
        \quad n \leftarrow 0
        && \text{(when mini\_step} \ge \text{every\_k} - 1 \text{)} \\
    u &= 0 && \text{(otherwise)}
    \end{aligned}
    $$

    with `n` the number of gradients a leaf has accumulated.

    `every_k` may change between calls (a new `MultiSteps` with another value
    reuses the compiled step). Raised, the micro-steps already taken count towards
    the new period. Lowered to or below the micro-steps already taken, the next
    call updates with the mean of all of them. From then on it updates every
    `every_k` calls, as a fresh `MultiSteps` with the new value would.
    (`optax.MultiSteps` wraps its counter modulo the new period there, and drops
    the gradients accumulated so far.)

    The inner optimizer runs only on the update step (a `lax.cond`), and its state
    (learning-rate schedule included) advances once per `every_k` calls. The
    accumulator is kept in at least float32 (optax's default `accumulator_dtype`),
    and is given to `inner` in float32 rather than cast back to the gradient dtype.

    A leaf whose gradient is `None` in a call is left out of that call: its
    accumulator stays as it was and `inner` sees no gradient for it. So each
    leaf's mean is over the calls in which it had a gradient (gradients 3,
    `None`, 6 average to 4.5). A leaf whose gradient is `None` on the update step
    keeps its accumulator (and `inner` sees no gradient for it then): the next
    update gives it the mean of everything it accumulated since its last one.
    Keyword arguments (such as `value=`) are passed to `inner` on the update step.

    With `should_skip_update_fn`, each call first asks
    `should_skip_update_fn(grads, gradient_step, params)` for
    `(should_skip, skip_state)`, as optax does. A skipped call is as if it never
    happened: the accumulator, the counts, `mini_step`, `gradient_step` and the
    inner state stay as they were (so a NaN gradient does not reach the mean), the
    updates are zero, and only `skip_state` and `skipped` are replaced
    (`has_updated` is then `False`). `skip_not_finite` and
    `skip_large_updates` are optax's two predicates.

    **Arguments:**

    - `inner`: the optimizer to accumulate for.
    - `every_k`: the number of micro-steps per update, an int `>= 1` (an array field:
      changing it does not recompile).
    - `mean`: average the gradients (default); `False` sums them.
    - `should_skip_update_fn`: `None` (default), or a function `(grads,
      gradient_step, params) -> (should_skip, skip_state)`: `should_skip` a bool
      scalar, `skip_state` any tree of arrays, kept in the state. Static, part of
      the compiled step's key: pass the same function (or `functools.partial`
      object) each time.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    opt = eqxopt.MultiSteps(eqxopt.SGD(1.0), every_k=2)
    params = {"w": jnp.zeros(1)}
    state = opt.init(params)
    params, state = opt.step({"w": jnp.array([1.0])}, state, params)  # accumulated
    assert jnp.allclose(params["w"], 0.0)
    # the mean applied
    params, state = opt.step({"w": jnp.array([3.0])}, state, params)
    assert jnp.allclose(params["w"], -2.0)
    ```
    """

    reduces_over = "tree"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(
        opt=("inner",), every_k_schedule=("every_k",), use_grad_mean=("mean",)
    )

    inner: AbstractTransform = inner_field()
    every_k: Int[Array, ""] = count_field()
    mean: bool = flag_field(True, kw_only=False)
    should_skip_update_fn: Callable | None = checked_field(
        _skip_predicate, None, static=True
    )

    def init(self, params: Params) -> MultiStepsState:
        def zeros(p):
            if not is_float_leaf(p):
                return None
            return full_like_leaf(p, 0.0, compute_dtype(p.dtype))

        def count(p):
            return scalar_for_leaf(p, 0, jnp.int32) if is_float_leaf(p) else None

        gradient_step = jnp.zeros((), jnp.int32)
        skip_state = ()
        if self.should_skip_update_fn is not None:
            # As optax: the predicate's state for zero gradients, which fixes its
            # structure and dtypes.
            def zero_grad(p):
                return full_like_leaf(p, 0.0) if is_float_leaf(p) else None

            _, skip_state = self.should_skip_update_fn(
                jax.tree.map(zero_grad, params), gradient_step, params
            )
        return MultiStepsState(
            mini_step=jnp.zeros((), jnp.int32),
            gradient_step=gradient_step,
            acc=jax.tree.map(zeros, params),
            counts=jax.tree.map(count, params),
            inner=self.inner.init(params),
            skip_state=skip_state,
            skipped=None if self.should_skip_update_fn is None else jnp.array(False),
        )

    def _should_skip(
        self, grads: Grads, state: MultiStepsState, params: Params
    ) -> tuple[Array | None, PyTree]:
        """`(should_skip, skip_state)`: `(None, ())` without a predicate."""
        if self.should_skip_update_fn is None:
            return None, ()
        should_skip, skip_state = self.should_skip_update_fn(
            grads, state.gradient_step, params
        )
        should_skip = jnp.asarray(should_skip)
        if should_skip.dtype != jnp.bool_ or should_skip.shape != ():
            raise ValueError(
                "MultiSteps's should_skip_update_fn must return a bool scalar "
                f"first, got an array of dtype {should_skip.dtype} and shape "
                f"{should_skip.shape}"
            )
        return should_skip, skip_state

    def transform(
        self, grads: Grads, state: MultiStepsState, params: Params, **extra: Any
    ) -> tuple[Updates, MultiStepsState]:
        treedef = jax.tree.structure(params)
        aligned = align_grads(grads, params)
        acc_leaves = treedef.flatten_up_to(state.acc)
        count_leaves = treedef.flatten_up_to(state.counts)
        # `>=`: after every_k is lowered below the micro-steps already taken, `==`
        # would never hold again and MultiSteps would never update.
        emit = state.mini_step >= self.every_k - 1
        skip, skip_state = self._should_skip(grads, state, params)
        if skip is not None:
            emit = jnp.logical_and(emit, jnp.logical_not(skip))

        # Per leaf: the new accumulator and count, and whether it had a gradient
        # (a leaf without one keeps both, also on the update step).
        new = []
        for g, a, n in zip(aligned, acc_leaves, count_leaves):
            if g is None or a is None:
                new.append((a, n, False))
                continue
            n = increment(n)  # saturating
            g = g.astype(a.dtype)
            a = a + (g - a) / n.astype(a.dtype) if self.mean else a + g
            new.append((a, n, True))
        inner_grads = treedef.unflatten([a if got else None for a, _, got in new])
        updates, inner_state = self.run_inner(
            inner_grads, state.inner, params, extra, when=emit
        )
        acc = [jnp.where(emit, jnp.zeros_like(a), a) if got else a for a, _, got in new]
        counts = [
            jnp.where(emit, 0, n).astype(jnp.int32) if got else n for _, n, got in new
        ]
        mini_step = jnp.where(emit, 0, increment(state.mini_step)).astype(jnp.int32)
        if skip is not None:
            # A skipped call leaves the accumulator and the counters as they were
            # (`emit` is already false, so `inner` did not run).
            def hold(old, new):
                return new if old is None else jnp.where(skip, old, new)

            acc = [hold(a0, a) for a0, a in zip(acc_leaves, acc)]
            counts = [hold(n0, n) for n0, n in zip(count_leaves, counts)]
            mini_step = jnp.where(skip, state.mini_step, mini_step)
        return updates, MultiStepsState(
            mini_step=mini_step,
            gradient_step=jnp.where(
                emit, increment(state.gradient_step), state.gradient_step
            ),
            acc=treedef.unflatten(acc),
            counts=treedef.unflatten(counts),
            inner=inner_state,
            skip_state=skip_state,
            skipped=skip,
        )

    def has_updated(self, state: MultiStepsState) -> Array:
        """Whether the call that produced `state` made an update (bool scalar):
        `False` after a call that `should_skip_update_fn` skipped."""
        updated = jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)
        if state.skipped is None:
            return updated
        return jnp.logical_and(updated, jnp.logical_not(state.skipped))
