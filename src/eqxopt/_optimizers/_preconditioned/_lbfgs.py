"""L-BFGS with a zoom linesearch (Nocedal & Wright, Algorithms 7.4, 3.5 and 3.6)."""

from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core import _shards
from ..._core._base import AbstractTransform, Grads, Params, Supplied, Updates
from ..._core._checks import array_count, check_bool, static_count
from ..._core._compile import FilteredJit
from ..._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    checked_field,
    flag_field,
    hyper,
    learning_rate_field,
    values_at,
)
from ..._core._linesearch import add_scale, scalar_dtype, vdot
from ..._core._shards import AxisName
from ..._core._tree import (
    align_grads,
    compute_dtype,
    full_like_leaf,
    increment,
    is_float_leaf,
    zero_step,
)


class LBFGSState(eqx.Module):
    """State of `LBFGS`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `prev_params`, `prev_grads`: the parameters and gradients of the previous
      update, shaped like params (float32 or wider; `None` at non-float leaves).
    - `diff_params`, `diff_grads`: the last `memory_size` differences of
      parameters and of gradients, each leaf of shape `(memory_size, *shape)`.
    - `weights`: `(memory_size,)`, the `1 / <diff_grads, diff_params>` of each pair.
    - `learning_rate`: scalar, the step size the linesearch chose last.
    - `value`: scalar, the loss at the parameters the last update led to (`inf`
      before the first update, or without linesearch).

    `weights`, `learning_rate` and `value` are float32, or float64 when a parameter
    is float64 or complex128 (so the linesearch keeps the parameters' precision).
    - `grad`: the gradient there, shaped like params (zeros without linesearch).
    - `linesearch_steps`: int32 scalar, the linesearch iterations of the last
      update.
    """

    step: Int[Array, ""]
    prev_params: PyTree[Float[Array, "..."] | None]
    prev_grads: PyTree[Float[Array, "..."] | None]
    diff_params: PyTree[Float[Array, "m ..."] | None]
    diff_grads: PyTree[Float[Array, "m ..."] | None]
    weights: Float[Array, " m"]
    learning_rate: Float[Array, ""]
    value: Float[Array, ""]
    grad: PyTree[Float[Array, "..."] | None]
    linesearch_steps: Int[Array, ""]


# Operations on lists of leaves (the float leaves that have a gradient); the
# linesearches' shared ones are in `_core/_linesearch.py`.


def _where(c: Array, a: list[Any], b: list[Any]) -> list[Any]:
    return jax.tree.map(lambda x, y: jnp.where(c, x, y), a, b)


def _cubicmin(a, fa, fpa, b, fb, c, fc):
    """The critical point of the cubic through (a, fa), (b, fb), (c, fc) with slope
    fpa at a (NaN if there is none; then it is not used)."""
    db = b - a
    dc = c - a
    denom = (db * dc) ** 2 * (db - dc)
    d1 = jnp.array([[dc**2, -(db**2)], [-(dc**3), db**3]])
    big_a, big_b = (
        jnp.dot(
            d1,
            jnp.array([fb - fa - fpa * db, fc - fa - fpa * dc]),
            precision=jax.lax.Precision.HIGHEST,
        )
        / denom
    )
    radical = big_b * big_b - 3.0 * big_a * fpa
    return a + (-big_b + jnp.sqrt(radical)) / (3.0 * big_a)


def _quadmin(a, fa, fpa, b, fb):
    """The critical point of the quadratic through (a, fa), (b, fb) with slope fpa
    at a."""
    db = b - a
    big_b = (fb - fa - fpa * db) / (db**2)
    return a - fpa / (2.0 * big_b)


def _zoom_linesearch(
    h: "LBFGS",
    max_steps: Int[Array, ""],
    value_and_grad: Callable[[list[Array]], tuple[Array, list[Array]]],
    params: list[Array],
    direction: list[Array],
    value0: Array,
    grad0: list[Array],
    axis_name: AxisName = None,
) -> dict[str, Any]:
    """A step size along `direction` with sufficient decrease and small curvature
    (strong Wolfe conditions), as `optax.scale_by_zoom_linesearch` finds it; `h`
    holds the optimizer's hyperparameters at this step."""
    # Every scalar in value0's dtype: the branches of the loop's conds must agree,
    # and hyperparameters are float64 under jax_enable_x64 whatever the params.
    dtype = value0.dtype

    def scalar(x: Any) -> Any:
        return None if x is None else jnp.asarray(x).astype(dtype)

    tol = scalar(h.tol)
    slope_rtol, curv_rtol = scalar(h.slope_rtol), scalar(h.curv_rtol)
    approx_dec_rtol = scalar(h.approx_dec_rtol)
    threshold = scalar(h.stepsize_precision)
    increase_factor = scalar(h.increase_factor)
    max_learning_rate = scalar(h.max_learning_rate)

    def on_line(stepsize):
        value, grad = value_and_grad(add_scale(params, stepsize, direction))
        slope = scalar(vdot([jnp.conj(g) for g in grad], direction, axis_name))
        return scalar(value), grad, slope

    slope0 = scalar(vdot(direction, grad0, axis_name))

    def decrease_error(stepsize, value, slope):
        error = value - value0 - slope_rtol * stepsize * slope0
        if approx_dec_rtol is not None:
            approx = slope - (2 * slope_rtol - 1.0) * slope0
            delta = value - value0 - approx_dec_rtol * jnp.abs(value0)
            error = jnp.minimum(jnp.maximum(approx, delta), error)
        error = jnp.maximum(error, 0.0)
        return jnp.where(jnp.isnan(error), jnp.inf, error)

    def curvature_error(slope):
        error = jnp.maximum(jnp.abs(slope) - curv_rtol * jnp.abs(slope0), 0.0)
        return jnp.where(jnp.isnan(error), jnp.inf, error)

    def search_interval(s):
        count = s["count"]
        new = jnp.where(count == 0, scalar(1.0), increase_factor * s["stepsize"])
        if max_learning_rate is not None:
            max_reached = new >= max_learning_rate
            new = jnp.minimum(new, max_learning_rate)
        else:
            max_reached = jnp.asarray(False)
        value, grad, slope = on_line(new)
        dec = decrease_error(new, value, slope)
        curv = curvature_error(slope)
        error = jnp.maximum(dec, curv)
        safe = _where(
            dec <= tol,
            [new, value, grad],
            [s["safe_stepsize"], s["safe_value"], s["safe_grad"]],
        )
        set_high_to_new = (dec > 0.0) | ((value >= s["value"]) & (count > 0))
        set_low_to_new = (slope >= 0.0) & ~set_high_to_new
        prev = [s["stepsize"], s["value"], s["slope"]]
        low, value_low, slope_low, high, value_high, slope_high = _where(
            set_low_to_new, [new, value, slope, *prev], [*prev, new, value, slope]
        )
        interval_found = set_high_to_new | set_low_to_new | (error <= tol)
        done = (error <= tol) | (max_reached & ~interval_found)
        return {
            **s,
            "count": count + 1,
            "stepsize": new,
            "value": value,
            "grad": grad,
            "slope": slope,
            "decrease_error": dec,
            "curvature_error": curv,
            "interval_found": interval_found,
            "done": done,
            "failed": (count + 1 >= max_steps) & ~done,
            "low": low,
            "value_low": value_low,
            "slope_low": slope_low,
            "high": high,
            "value_high": value_high,
            "slope_high": slope_high,
            "cubic_ref": low,
            "value_cubic_ref": value_low,
            "safe_stepsize": safe[0],
            "safe_value": safe[1],
            "safe_grad": safe[2],
        }

    def zoom(s):
        low, value_low, slope_low = s["low"], s["value_low"], s["slope_low"]
        high, value_high, slope_high = s["high"], s["value_high"], s["slope_high"]
        delta = jnp.abs(high - low)
        left, right = jnp.minimum(high, low), jnp.maximum(high, low)
        cubic = _cubicmin(
            low,
            value_low,
            slope_low,
            high,
            value_high,
            s["cubic_ref"],
            s["value_cubic_ref"],
        )
        use_cubic = (cubic > left + 0.2 * delta) & (cubic < right - 0.2 * delta)
        quad = _quadmin(low, value_low, slope_low, high, value_high)
        use_quad = (
            ~use_cubic & (quad > left + 0.1 * delta) & (quad < right - 0.1 * delta)
        )
        middle = jnp.where(use_cubic, cubic, s["cubic_ref"])
        middle = jnp.where(use_quad, quad, middle)
        middle = jnp.where(~use_cubic & ~use_quad, (low + high) / 2.0, middle)
        value, grad, slope = on_line(middle)
        dec = decrease_error(middle, value, slope)
        curv = curvature_error(slope)
        error = jnp.maximum(dec, curv)
        safe = _where(
            (dec <= tol) & (value < s["safe_value"]),
            [middle, value, grad],
            [s["safe_stepsize"], s["safe_value"], s["safe_grad"]],
        )
        done = error <= tol
        set_high_to_middle = (dec > 0.0) | (value >= value_low)
        set_high_to_low = (slope * (high - low) >= 0.0) & ~set_high_to_middle
        set_low_to_middle = ~set_high_to_middle
        new_high = _where(
            set_high_to_middle, [middle, value, slope], [high, value_high, slope_high]
        )
        new_high = _where(set_high_to_low, [low, value_low, slope_low], new_high)
        new_low = _where(
            set_low_to_middle, [middle, value, slope], [low, value_low, slope_low]
        )
        cubic_ref = _where(
            set_high_to_middle | set_high_to_low, [high, value_high], [low, value_low]
        )
        presumably_failed = (s["count"] + 1 >= max_steps) | (
            (delta <= threshold) & (safe[0] > 0.0)
        )
        return {
            **s,
            "count": s["count"] + 1,
            "stepsize": middle,
            "value": value,
            "grad": grad,
            "slope": slope,
            "decrease_error": dec,
            "curvature_error": curv,
            "done": done,
            "failed": presumably_failed & ~done,
            "low": new_low[0],
            "value_low": new_low[1],
            "slope_low": new_low[2],
            "high": new_high[0],
            "value_high": new_high[1],
            "slope_high": new_high[2],
            "cubic_ref": cubic_ref[0],
            "value_cubic_ref": cubic_ref[1],
            "safe_stepsize": safe[0],
            "safe_value": safe[1],
            "safe_grad": safe[2],
        }

    def try_safe_step(s):
        # Out of steps: fall back on the best step with sufficient decrease.
        use_safe = (s["safe_stepsize"] > 0.0) | jnp.isinf(s["decrease_error"])
        stepsize, value, grad = _where(
            use_safe,
            [s["safe_stepsize"], s["safe_value"], s["safe_grad"]],
            [s["stepsize"], s["value"], s["grad"]],
        )
        return {**s, "stepsize": stepsize, "value": value, "grad": grad}

    def body(s):
        # Inside shard_map the carry may vary over mesh axes (_shards' loops).
        s = _shards.cond(s["interval_found"], zoom, search_interval, s)
        return _shards.cond(s["failed"], try_safe_step, lambda s: s, s)

    zero = jnp.zeros((), value0.dtype)
    inf = jnp.full((), jnp.inf, value0.dtype)
    false = jnp.asarray(False)
    init = {
        "count": jnp.zeros((), jnp.int32),
        "stepsize": zero,
        "value": value0,
        "grad": grad0,
        "slope": slope0,
        "decrease_error": inf,
        "curvature_error": inf,
        "interval_found": false,
        "done": false,
        "failed": false,
        "low": zero,
        "value_low": value0,
        "slope_low": slope0,
        "high": zero,
        "value_high": value0,
        "slope_high": slope0,
        "cubic_ref": zero,
        "value_cubic_ref": value0,
        "safe_stepsize": zero,
        "safe_value": value0,
        "safe_grad": grad0,
    }
    return _shards.while_loop(lambda s: ~(s["done"] | s["failed"]), body, init)


def _two_loop(
    g: list[Array],
    diff_params: list[Array],
    diff_grads: list[Array],
    weights: Array,
    scale: Array,
    memory_idx: Array,
    axis_name: AxisName = None,
) -> list[Array]:
    """`H g` by the L-BFGS two-loop recursion (Nocedal & Wright, Algorithm 7.4),
    newest pair first."""
    m = weights.shape[0]
    indices = (memory_idx + jnp.arange(m)) % m

    def right(vec, i):
        alpha = weights[i] * vdot([x[i] for x in diff_params], vec, axis_name)
        return add_scale(vec, -alpha, [x[i] for x in diff_grads]), alpha

    vec, alphas = _shards.scan(right, g, indices, reverse=True)
    vec = [scale * v for v in vec]

    def left(vec, i_alpha):
        i, alpha = i_alpha
        beta = weights[i] * vdot([x[i] for x in diff_grads], vec, axis_name)
        return add_scale(vec, alpha - beta, [x[i] for x in diff_params]), beta

    vec, _ = _shards.scan(left, vec, (indices, alphas))
    return vec


def _linesearch(name: str, value: bool) -> bool:
    """`linesearch`: a bool. optax's linesearch transformations (what
    `optax.lbfgs(linesearch=...)` takes) are refused, naming eqxopt's way to the
    same search."""
    update = getattr(value, "update", None)
    made_by = getattr(update, "__qualname__", "").split(".")[0]
    if made_by == "scale_by_zoom_linesearch":
        raise TypeError(
            f"{name} takes True or False, not optax.scale_by_zoom_linesearch(...): "
            "LBFGS's own linesearch is that zoom linesearch (linesearch=True, the "
            "default); give its options to LBFGS itself: max_linesearch_steps=, "
            "max_learning_rate=, tol=, increase_factor=, slope_rtol=, curv_rtol=, "
            "approx_dec_rtol=, stepsize_precision="
        )
    if made_by == "scale_by_backtracking_linesearch":
        raise TypeError(
            f"{name} takes True or False, not "
            "optax.scale_by_backtracking_linesearch(...): for L-BFGS with a "
            "backtracking linesearch, chain eqxopt's after it: "
            "eqxopt.Chain(eqxopt.LBFGS(learning_rate, linesearch=False), "
            "eqxopt.ScaleByBacktrackingLinesearch(max_backtracking_steps, ...)), "
            "called with value= and value_fn="
        )
    return check_bool(name, value)


class LBFGS(AbstractTransform):
    r"""L-BFGS (Liu & Nocedal, 1989) with a zoom linesearch, for deterministic
    (full-batch) problems.

    With `s_i = p_{i+1} - p_i`, `y_i = g_{i+1} - g_i` over the last `memory_size`
    updates, `H` the L-BFGS inverse-Hessian estimate (two-loop recursion, initial
    scale `<s, y> / <y, y>` of the newest pair, or `min(1, 1 / |g|)` at the first
    update when `scale_init_precond`), `lr` the learning rate at `step`, and the
    step size $\eta$ from a zoom line search for the strong Wolfe conditions
    (sufficient decrease and small curvature):

    $$
    \begin{aligned}
    d &= -\mathrm{lr} \cdot H g \\
    \eta &= \operatorname{zoom\_linesearch}(\mathrm{value\_fn}, p, d)
        && \text{(strong Wolfe)} \\
    p &\leftarrow p + \eta\, d
    \end{aligned}
    $$

    The update that `update` returns is the step to add, $\eta d = -\eta \cdot
    \mathrm{lr} \cdot H g$ (with `linesearch=False`, $-\mathrm{lr} \cdot H g$):
    a descent step, as `optax.lbfgs`'s. `optax.scale_by_lbfgs` returns `+H g`, for
    a following `scale_by_learning_rate` to negate; eqxopt's building block with
    that sign is `ScaleByLBFGS`.

    The linesearch is Nocedal & Wright's Algorithms 3.5 and 3.6 with the
    approximate-decrease criterion of Hager & Zhang, as `optax.lbfgs` (whose
    default is this linesearch with `max_linesearch_steps=20`, initial guess 1).
    The gradient differences, dot products and sums run in float32 or wider
    whatever the parameter dtype, and the state is kept in that dtype.

    **Calling it.** `update` and `step` need the loss and the loss function:

    ```python
    value, grads = jax.value_and_grad(loss)(params, x, y)
    params, state = opt.step(grads, state, params, value=value, value_fn=loss,
                             x=x, y=y)
    ```

    - `value`: the loss at `params` (a JAX scalar; `None` computes it with
      `value_fn`, one extra evaluation).
    - `value_fn`: the loss, `value_fn(params, **fn_kwargs) -> scalar`; the
      linesearch evaluates it and its gradient at trial points.
    - `grad`: accepted and ignored (the positional gradients are used), since
      optax's L-BFGS loop passes `grad=` too.
    - `**fn_kwargs`: every other keyword is passed on to `value_fn`. Pass data
      here, as arrays: arrays are inputs of the compiled step, so new data does
      not recompile.

    Without linesearch (`linesearch=False`) `update` takes none of these; inside
    a `Chain` or through `to_optax()` they are dropped, as optax drops them.

    `value_fn` itself is part of the compiled step's cache key (by identity):
    pass the same function object every step, such as a module-level function or
    an Equinox module (whose arrays are inputs). A fresh `lambda` or
    `functools.partial` each step recompiles each step (Python numbers passed as
    keywords, `value` included, are turned into arrays and do not). After an
    update, `state.value` and `state.grad` hold the loss and its gradient at the
    new parameters, computed by the linesearch;
    `opt.value_and_grad(state, params, value_fn, **fn_kwargs)` returns them (or
    evaluates the loss before the first update), saving one evaluation per update.

    Leaves whose gradient is `None` stay fixed: the search runs over the others.

    **Arguments:**

    - `learning_rate`: scales the direction before the linesearch (a float `>= 0`,
      a scalar array or a schedule; default `1.0`, which is `optax.lbfgs`'s
      `learning_rate=None`).
    - `memory_size`: the number of pairs kept (static int `>= 1`).
    - `scale_init_precond`: scale the initial inverse Hessian as above (static).
    - `linesearch`: run the zoom linesearch (static; `False` steps by `d`). A
      bool: optax's linesearch objects are refused, naming eqxopt's way to the
      same search (the zoom linesearch's options are `LBFGS`'s own; a
      backtracking one is `Chain(LBFGS(..., linesearch=False),
      ScaleByBacktrackingLinesearch(...))`).
    - `max_linesearch_steps`: the most linesearch iterations per update (an int
      `>= 1`; an array field).
    - `max_learning_rate`: the largest step size tried; `None` for no bound.
    - `tol`: tolerance on both criteria, `>= 0`.
    - `increase_factor`: growth of the trial step while searching an interval,
      `> 1`.
    - `slope_rtol`: the sufficient-decrease constant `c1`, in `(0, 1)`.
    - `curv_rtol`: the curvature constant `c2`, in `(0, 1)`.
    - `approx_dec_rtol`: the relative tolerance of the approximate-decrease
      criterion, `>= 0`; `None` uses Armijo's criterion only (static choice).
    - `stepsize_precision`: when the search interval is shorter than this and a
      step with sufficient decrease is known, take it, `>= 0`.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      inner products over the tree (the two-loop recursion, the slopes of the
      linesearch) cover the whole model (each leaf summed over the named axes it
      is split over), as the unsharded run. `None` (default): this device's
      blocks only. `value_fn` is the caller's: with `axis_name` it must return
      the whole model's loss (summed over the mesh), the same on every device.
    """

    reduces_over = "tree"

    reads_params = "memory of parameter differences"

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    # Static: it decides the shapes of the state.
    memory_size: int = checked_field(static_count, 10, static=True)
    scale_init_precond: bool = flag_field(True, kw_only=False)
    linesearch: bool = checked_field(_linesearch, True, static=True, kw_only=True)
    max_linesearch_steps: Int[Array, ""] = checked_field(array_count, 20, kw_only=True)
    max_learning_rate: ScalarOrSchedule | None = hyper(
        None, low=0.0, low_open=True, optional=True, kw_only=True
    )
    tol: ScalarOrSchedule = hyper(0.0, low=0.0, kw_only=True)
    increase_factor: ScalarOrSchedule = hyper(2.0, low=1.0, low_open=True, kw_only=True)
    slope_rtol: ScalarOrSchedule = hyper(
        1e-4, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=True
    )
    curv_rtol: ScalarOrSchedule = hyper(
        0.9, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=True
    )
    approx_dec_rtol: ScalarOrSchedule | None = hyper(
        1e-6, low=0.0, optional=True, kw_only=True
    )
    stepsize_precision: ScalarOrSchedule = hyper(1e-5, low=0.0, kw_only=True)
    axis_name: AxisName = axis_name_field()

    def init(self, params: Params) -> LBFGSState:
        def zeros(shape=()):
            def make(p):
                if not is_float_leaf(p):
                    return None
                return full_like_leaf(p, 0.0, compute_dtype(p.dtype), stack=shape)

            return jax.tree.map(make, params)

        memory = zeros((self.memory_size,))
        real = scalar_dtype(params)
        return LBFGSState(
            step=zero_step(),
            prev_params=zeros(),
            prev_grads=zeros(),
            diff_params=memory,
            diff_grads=jax.tree.map(jnp.copy, memory),
            weights=jnp.zeros((self.memory_size,), real),
            learning_rate=jnp.ones((), real),
            value=jnp.full((), jnp.inf, real),
            grad=zeros(),
            linesearch_steps=jnp.zeros((), jnp.int32),
        )

    def transform(
        self,
        grads: Grads,
        state: LBFGSState,
        params: Params,
        *,
        value_fn: Callable[..., Any] | None = None,
        value: Any = None,
        grad: Any = None,
        **fn_kwargs: Any,
    ) -> tuple[Updates, LBFGSState]:
        del grad  # optax's loop passes it; it is `grads`
        if self.linesearch and value_fn is None:
            raise TypeError(
                "LBFGS.update/step need value_fn=, the loss function "
                "value_fn(params, **fn_kwargs), for the linesearch (or build "
                "LBFGS(linesearch=False))"
            )
        if not self.linesearch and (value_fn is not None or fn_kwargs):
            raise TypeError(
                "LBFGS(linesearch=False) takes no value_fn or data keywords"
            )
        param_leaves, treedef = jax.tree.flatten(params)
        grad_leaves = align_grads(grads, params)
        active = [
            i
            for i, (g, p) in enumerate(zip(grad_leaves, param_leaves))
            if g is not None and is_float_leaf(p)
        ]

        def pick(tree: PyTree) -> list[Any]:
            leaves = treedef.flatten_up_to(tree)
            return [leaves[i] for i in active]

        def put(tree: PyTree, new: list[Any]) -> PyTree:
            leaves = list(treedef.flatten_up_to(tree))
            for i, x in zip(active, new):
                leaves[i] = x
            return treedef.unflatten(leaves)

        dtypes = [compute_dtype(param_leaves[i].dtype) for i in active]
        real = state.value.dtype
        p = [param_leaves[i].astype(d) for i, d in zip(active, dtypes)]
        g = [grad_leaves[i].astype(d) for i, d in zip(active, dtypes)]
        count = state.step
        m = self.memory_size
        memory_idx = count % m
        prev_idx = (count - 1) % m

        # Store the newest pair (none before the first update).
        first = count == 0
        dp = [jnp.where(first, 0.0, x - y) for x, y in zip(p, pick(state.prev_params))]
        dg = [jnp.where(first, 0.0, x - y) for x, y in zip(g, pick(state.prev_grads))]
        axis_name = self.axis_name
        curvature = vdot(dg, dp, axis_name)
        weight = jnp.where(first | (curvature == 0.0), 0.0, 1.0 / curvature)
        diff_params = [
            x.at[prev_idx].set(y) for x, y in zip(pick(state.diff_params), dp)
        ]
        diff_grads = [x.at[prev_idx].set(y) for x, y in zip(pick(state.diff_grads), dg)]
        weights = state.weights.at[prev_idx].set(weight.astype(real))

        if self.scale_init_precond:
            norm_dg = vdot(dg, dg, axis_name)
            scale = jnp.where(norm_dg > 0.0, curvature / norm_dg, 1.0)
            capped = jnp.minimum(1.0, 1.0 / jnp.sqrt(vdot(g, g, axis_name)))
            scale = jnp.where(first, capped, scale)
        else:
            scale = jnp.ones((), real)
        hg = _two_loop(
            g, diff_params, diff_grads, weights, scale, memory_idx, axis_name
        )
        h = values_at(self, count)
        lr = h.learning_rate.astype(real)
        direction = [-lr * x for x in hg]

        new_grad = pick(state.grad)
        if self.linesearch:
            assert value_fn is not None

            def value_and_grad(xs):
                def f(xs):
                    moved = [
                        x.astype(param_leaves[i].dtype) for i, x in zip(active, xs)
                    ]
                    out = value_fn(put(params, moved), **fn_kwargs)
                    return jnp.asarray(out).astype(real)

                v, gs = jax.value_and_grad(f)(xs)
                return v, [x.astype(d) for x, d in zip(gs, dtypes)]

            if value is None:
                value0 = value_and_grad(p)[0]
            else:
                value0 = jnp.asarray(value).astype(real)
            found = _zoom_linesearch(
                h,
                self.max_linesearch_steps,
                value_and_grad,
                p,
                direction,
                value0,
                g,
                axis_name,
            )
            stepsize = found["stepsize"]
            new_value = found["value"].astype(real)
            new_grad = found["grad"]
            steps = found["count"].astype(jnp.int32)
        else:
            stepsize = jnp.ones((), real)
            new_value = state.value
            steps = state.linesearch_steps
        update_leaves = [stepsize * d for d in direction]
        updates = treedef.unflatten([None] * len(param_leaves))  # filled below
        updates = put(updates, update_leaves)
        new_state = LBFGSState(
            step=increment(count),
            prev_params=put(state.prev_params, p),
            prev_grads=put(state.prev_grads, g),
            diff_params=put(state.diff_params, diff_params),
            diff_grads=put(state.diff_grads, diff_grads),
            weights=weights,
            learning_rate=jnp.asarray(stepsize, real),
            value=new_value,
            grad=put(state.grad, new_grad),
            linesearch_steps=steps,
        )
        return updates, new_state

    def wanted_keywords(self) -> Mapping[str, Supplied]:
        """With the linesearch: the loss and the loss as a function of the
        parameters (`value`, `value_fn`), as a train step supplies them."""
        if not self.linesearch:
            return {}
        return {"value": Supplied.LOSS, "value_fn": Supplied.LOSS_FUNCTION}

    def takes_keyword(self, key: str) -> bool:
        """Whether `update` uses the keyword argument `key`: every keyword with
        the linesearch (`value`, `value_fn`, `grad`, and data for `value_fn`),
        none without (a direct `update` still accepts `value` there). `Chain`
        and `to_optax()` drop the keywords it does not use."""
        return self.linesearch

    def value_and_grad(
        self,
        state: LBFGSState,
        params: Params,
        value_fn: Callable[..., Any],
        **fn_kwargs: Any,
    ) -> tuple[Float[Array, ""], Grads]:
        """The loss and its gradient at `params`, reusing what the last update's
        linesearch computed there (as `optax.value_and_grad_from_state`), which
        saves one evaluation of `value_fn` and its gradient per update.

        Valid when `params` are the parameters the last `step` returned and the
        loss (`value_fn` and `fn_kwargs`) has not changed since; before the first
        update, and without linesearch, it evaluates `value_fn`. Compiled, with
        `value_fn` in the cache key as for `update`.

        **Returns:** `(value, grads)`: the loss, in the dtype of `state.value`;
        gradients with `None` at
        non-float leaves, each in its parameter's dtype.
        """
        return _VALUE_AND_GRAD(None, state, params, value_fn, fn_kwargs)


def _value_and_grad_entry(_, state, params, value_fn, fn_kwargs):
    def compute(_):
        value, grads = eqx.filter_value_and_grad(value_fn)(params, **fn_kwargs)
        return jnp.asarray(value).astype(state.value.dtype), grads

    def reuse(_):
        grads = jax.tree.map(
            lambda g, p: None if g is None else g.astype(p.dtype),
            state.grad,
            params,
            is_leaf=lambda x: x is None,
        )
        return state.value, grads

    stored = jnp.isfinite(state.value) & (state.step > 0)
    return jax.lax.cond(stored, reuse, compute, None)


_VALUE_AND_GRAD = FilteredJit(_value_and_grad_entry)
