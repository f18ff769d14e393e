"""A backtracking (Armijo) linesearch as a link of a chain (optax's
`scale_by_backtracking_linesearch`)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Supplied, Updates, supplies
from .._core._fields import count_field, flag_field, hyper
from .._core._linesearch import add_scale, scalar_dtype, vdot
from .._core._tree import align_grads, compute_dtype, full_like_leaf, is_float_leaf


class ScaleByBacktrackingLinesearchState(eqx.Module):
    """State of `ScaleByBacktrackingLinesearch` (the fields of optax's
    `ScaleByBacktrackingLinesearchState`, its `info` as the last two).

    **Fields:**

    - `learning_rate`: scalar, the step size the last linesearch chose (the next
      one starts from it times `increase_factor`); 1 after `init`.
    - `value`: scalar, the loss where the last linesearch stopped (`inf` after
      `init`).
    - `grad`: with `store_grad`, the gradient there, shaped like params (`None`
      at non-float leaves); else `None`.
    - `linesearch_steps`: int32 scalar, the iterations of the last linesearch
      (optax's `info.num_linesearch_steps`).
    - `decrease_error`: scalar, how far the last step size missed the sufficient
      decrease (0: it met it; `inf`: no finite value was found, and the step was
      0).

    The scalars are float32, or float64 when a parameter is float64 or
    complex128.
    """

    learning_rate: Float[Array, ""]
    value: Float[Array, ""]
    grad: PyTree[Float[Array, "..."] | None] | None
    linesearch_steps: Int[Array, ""]
    decrease_error: Float[Array, ""]


class ScaleByBacktrackingLinesearch(AbstractTransform):
    r"""Scales the updates `u` that reach it by a step size $\eta$ found by
    backtracking (Armijo, 1966), so that the loss `f` decreases enough:

    $$
    f(p + \eta u) \le (1 + \mathrm{rtol})\, f(p)
        + \eta\, \mathrm{slope\_rtol} \langle u, \nabla f(p) \rangle
        + \mathrm{atol}
    $$

    It tries $\eta = \min(\mathrm{increase\_factor} \cdot \eta_\mathrm{last},
    \mathrm{max\_learning\_rate})$, then multiplies it by `decrease_factor`
    until the condition holds, at most `max_backtracking_steps` times (the last
    try is taken even if it fails, as in optax; a try whose loss is not finite
    gives a step of 0). The same as `optax.scale_by_backtracking_linesearch`.

    `update`/`step` take the loss: `value_fn=` (the loss function,
    `value_fn(params, **fn_kwargs) -> scalar`, as `LBFGS`'s), with `value=` (the
    loss at `params`) and `grad=` (its gradient there, for the slope) when the
    caller has them (else they are computed from `value_fn`), and every other
    keyword (the data) passed on to `value_fn`. `u` should be a descent
    direction (`Chain(SGD(1.0), ScaleByBacktrackingLinesearch(15))`). With
    `store_grad` the gradient where it stopped is kept in `state.grad`, to start
    the next step from (as `optax.value_and_grad_from_state`).

    **Arguments:**

    - `max_backtracking_steps`: the most decreases of the step size, an int
      `>= 0`.
    - `slope_rtol`: the fraction of the slope the decrease must reach, `>= 0`.
    - `decrease_factor`: the factor a step size that fails is multiplied by, in
      `(0, 1]`.
    - `increase_factor`: the factor the last step size is multiplied by to start
      the next search, `> 0` (`inf`: always start at `max_learning_rate`).
    - `max_learning_rate`: the largest step size tried, `> 0`.
    - `atol`: the absolute tolerance of the condition, `>= 0`.
    - `rtol`: its relative tolerance, `>= 0`.
    - `store_grad`: keep the gradient where the search stopped (a bool).
    """

    reduces_over = "tree"

    reads_params = "linesearch (the loss at points along the update)"

    max_backtracking_steps: Int[Array, ""] = count_field(at_least_one=False)
    # Not schedules: the state keeps no step count to read one at (as optax's).
    slope_rtol: Float[Array, ""] = hyper(1e-4, low=0.0, schedule=False)
    decrease_factor: Float[Array, ""] = hyper(
        0.8, low=0.0, high=1.0, low_open=True, schedule=False
    )
    increase_factor: Float[Array, ""] = hyper(
        1.5, low=0.0, low_open=True, allow_inf=True, schedule=False
    )
    max_learning_rate: Float[Array, ""] = hyper(
        1.0, low=0.0, low_open=True, schedule=False
    )
    atol: Float[Array, ""] = hyper(0.0, low=0.0, schedule=False)
    rtol: Float[Array, ""] = hyper(0.0, low=0.0, schedule=False)
    store_grad: bool = flag_field(False, kw_only=False)

    def init(self, params: Params) -> ScaleByBacktrackingLinesearchState:
        real = scalar_dtype(params)
        grad = None
        if self.store_grad:
            grad = jax.tree.map(
                lambda p: (
                    full_like_leaf(p, 0.0, compute_dtype(p.dtype))
                    if is_float_leaf(p)
                    else None
                ),
                params,
            )
        return ScaleByBacktrackingLinesearchState(
            learning_rate=jnp.ones((), real),
            value=jnp.full((), jnp.inf, real),
            grad=grad,
            linesearch_steps=jnp.zeros((), jnp.int32),
            decrease_error=jnp.full((), jnp.inf, real),
        )

    # What a train step can give it; it takes the data for `value_fn` too.
    keywords = supplies(
        value=Supplied.LOSS, grad=Supplied.GRADIENT, value_fn=Supplied.LOSS_FUNCTION
    )

    def takes_keyword(self, key: str) -> bool:
        # `value`, `grad`, `value_fn` and the data for `value_fn`: every keyword.
        return True

    def transform(
        self,
        grads: Grads,
        state: ScaleByBacktrackingLinesearchState,
        params: Params,
        *,
        value_fn: Callable[..., Any] | None = None,
        value: Any = None,
        grad: Any = None,
        **fn_kwargs: Any,
    ) -> tuple[Updates, ScaleByBacktrackingLinesearchState]:
        if value_fn is None:
            raise TypeError(
                "ScaleByBacktrackingLinesearch.update/step need value_fn=, the "
                "loss function value_fn(params, **fn_kwargs)"
            )
        param_leaves, treedef = jax.tree.flatten(params)
        update_leaves = align_grads(grads, params)
        active = [
            i
            for i, (u, p) in enumerate(zip(update_leaves, param_leaves))
            if u is not None and is_float_leaf(p)
        ]
        real = state.value.dtype
        dtypes = [compute_dtype(param_leaves[i].dtype) for i in active]
        p0 = [param_leaves[i].astype(d) for i, d in zip(active, dtypes)]
        u = [update_leaves[i].astype(d) for i, d in zip(active, dtypes)]

        def put(tree: PyTree, new: list[Any]) -> PyTree:
            leaves = list(treedef.flatten_up_to(tree))
            for i, x in zip(active, new):
                leaves[i] = x
            return treedef.unflatten(leaves)

        def loss(xs: list[Array]) -> Array:
            moved = [x.astype(param_leaves[i].dtype) for i, x in zip(active, xs)]
            return jnp.asarray(value_fn(put(params, moved), **fn_kwargs)).astype(real)

        if value is None or grad is None:
            value0, g0 = jax.value_and_grad(loss)(p0)
        else:
            value0, g0 = None, None
        if value is not None:
            value0 = jnp.asarray(value).astype(real)
        if grad is not None:
            given = align_grads(grad, params)
            g0 = [given[i].astype(d) for i, d in zip(active, dtypes)]
        assert value0 is not None and g0 is not None
        # optax's slope: the real part of <u, conj(grad)> (`vdot` conjugates u).
        slope = vdot(
            u, [jnp.conj(g) for g in g0], owner="ScaleByBacktrackingLinesearch"
        )
        slope = slope.astype(real)

        def scalar(x: Any) -> Array:
            return jnp.asarray(x).astype(real)

        slope_rtol, rtol, atol = map(scalar, (self.slope_rtol, self.rtol, self.atol))
        decrease_factor = scalar(self.decrease_factor)

        def decrease_error(stepsize: Array, new_value: Array) -> Array:
            error = new_value - (1.0 + rtol) * value0 - stepsize * slope_rtol * slope
            error = jnp.where(jnp.isnan(error), jnp.inf, error)
            return jnp.maximum(error, 0.0)

        def keep_going(s: dict[str, Any]) -> Array:
            return ~(s["error"] <= atol) & (s["count"] <= self.max_backtracking_steps)

        def body(s: dict[str, Any]) -> dict[str, Any]:
            stepsize = jnp.where(
                s["count"] > 0, decrease_factor * s["stepsize"], s["stepsize"]
            )
            moved = add_scale(p0, stepsize, u)
            if self.store_grad:
                new_value, new_grad = jax.value_and_grad(loss)(moved)
            else:
                new_value, new_grad = loss(moved), s["grad"]
            return dict(
                stepsize=stepsize,
                value=new_value,
                grad=new_grad,
                error=decrease_error(stepsize, new_value),
                count=s["count"] + 1,
            )

        start = jnp.minimum(
            scalar(self.increase_factor) * state.learning_rate,
            scalar(self.max_learning_rate),
        )
        found = jax.lax.while_loop(
            keep_going,
            body,
            dict(
                stepsize=start,
                value=value0,
                grad=[jnp.zeros_like(x) for x in p0],
                error=jnp.full((), jnp.inf, real),
                count=jnp.zeros((), jnp.int32),
            ),
        )
        # No finite value found: no step, rather than NaN or infinite parameters.
        stepsize = jnp.where(jnp.isinf(found["error"]), 0.0, found["stepsize"])
        updates = put(
            treedef.unflatten([None] * len(param_leaves)),
            [stepsize.astype(x.dtype) * x for x in u],
        )
        return updates, ScaleByBacktrackingLinesearchState(
            learning_rate=stepsize,
            value=found["value"],
            grad=put(state.grad, found["grad"]) if self.store_grad else None,
            linesearch_steps=found["count"],
            decrease_error=found["error"],
        )
