"""Weight averaging: an exponential moving average of the parameters (evaluation
weights), stochastic weight averaging (their arithmetic mean) and Lookahead (slow
weights pulled towards the fast ones)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import renames
from .._core._fields import ScalarOrSchedule, count_field, hyper, values_at
from .._core._tree import (
    align_grads,
    apply_updates,
    compute_dtype,
    increment,
    is_float_leaf,
    zero_step,
)
from ._wrapper import AbstractSingleWrapper, inner_field, leaves_of, with_own_state


def _copy_float_leaves(params: Params, dtype: Any = None) -> PyTree:
    """A fresh copy (never an alias of the parameter buffers, which `donate=True`
    may reuse) of every float leaf; `None` elsewhere."""

    def copy(p):
        if not is_float_leaf(p):
            return None
        return jnp.array(
            p, dtype=p.dtype if dtype is None else dtype(p.dtype), copy=True
        )

    return jax.tree.map(copy, params)


class ParamEMAState(eqx.Module):
    """State of `ParamEMA`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (at which a scheduled
      `decay` is read).
    - `ema`: the moving average of the parameters, shaped like params, in at least
      float32 (`None` at non-float leaves).
    - `inner`: the wrapped optimizer's state.
    """

    step: Int[Array, ""]
    ema: PyTree[Float[Array, "..."] | None]
    inner: Any

    def averaged(self, params: Params) -> Params:
        """`params` with every float leaf replaced by its average, in the
        parameter's dtype (non-float leaves are kept): the evaluation weights."""

        def pick(e, p):
            return p if e is None else e.astype(p.dtype)

        return jax.tree.map(pick, self.ema, params, is_leaf=lambda x: x is None)


class ParamEMA(AbstractSingleWrapper):
    r"""Keeps an exponential moving average of the parameters alongside `inner`,
    for evaluation (Polyak averaging, "EMA weights"). The updates are `inner`'s,
    unchanged; after each step, with `p_new` the parameters it gives (`p + u` in
    `p`'s dtype)

    $$
    \mathrm{ema} \leftarrow \mathrm{decay} \cdot \mathrm{ema} + (1
        - \mathrm{decay})\, p_\mathrm{new}
    \qquad \text{(ema starts as the params)}
    $$

    Read the averaged model with `state.averaged(params)`. The average is kept in at
    least float32, so a bf16 model's average does not stall on rounding. (This
    follows timm's `ModelEmaV2` and Flax's usual EMA, without debiasing since it
    starts at the parameters. `EMA`, optax's `ema`, is another thing: a link that
    averages the updates, not the parameters.)

    **Arguments:**

    - `inner`: the optimizer.
    - `decay`: in `[0, 1]`; typical values are 0.999 to 0.9999. A schedule is read
      at the step before the update (for a warm-up of the average).
    """

    reduces_over = "nothing"

    reads_params = "average of the parameters"

    inner: AbstractTransform = inner_field()
    decay: ScalarOrSchedule = hyper(0.999, low=0.0, high=1.0)

    def init(self, params: Params) -> ParamEMAState:
        return ParamEMAState(
            step=zero_step(),
            ema=_copy_float_leaves(params, compute_dtype),
            inner=self.inner.init(params),
        )

    def transform(
        self, grads: Grads, state: ParamEMAState, params: Params, **extra: Any
    ) -> tuple[Updates, ParamEMAState]:
        updates, inner_state = self.run_inner(grads, state.inner, params, extra)
        new_params = apply_updates(params, updates)
        moved = leaves_of(updates, params)
        return updates, self._averaged(state, moved, new_params, inner_state)

    def transform_step(
        self, grads: Grads, state: ParamEMAState, params: Params, **extra: Any
    ) -> tuple[Params, ParamEMAState]:
        # The inner optimizer's own step (which may form the new parameters in the
        # pass that makes its updates); the average follows what it returns.
        self.check_keywords(extra)
        new_params, inner_state = self.inner.transform_step(
            grads, state.inner, params, **extra
        )
        moved = align_grads(grads, params)
        return new_params, self._averaged(state, moved, new_params, inner_state)

    def _averaged(
        self,
        state: ParamEMAState,
        moved: list[Any],
        new_params: Params,
        inner_state: Any,
    ) -> ParamEMAState:
        # `moved`: per leaf, `None` where the step leaves the parameter alone.
        param_leaves, treedef = jax.tree.flatten(new_params)
        ema_leaves = treedef.flatten_up_to(state.ema)
        decay = values_at(self, state.step).decay
        new_ema = []
        for m, p, e in zip(moved, param_leaves, ema_leaves):
            if m is None or e is None:
                new_ema.append(e)
            else:
                new_ema.append(decay * e + (1 - decay) * p.astype(e.dtype))
        return ParamEMAState(
            step=increment(state.step),
            ema=treedef.unflatten(new_ema),
            inner=inner_state,
        )


class SWAState(eqx.Module):
    """State of `SWA`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `n_averaged`: int32 scalar, how many parameter snapshots the mean holds
      (torch's `AveragedModel.n_averaged`).
    - `mean`: the running mean of the parameters, shaped like params, in at least
      float32 (`None` at non-float leaves); the initial parameters until the first
      snapshot.
    - `inner`: the wrapped optimizer's state.
    """

    step: Int[Array, ""]
    n_averaged: Int[Array, ""]
    mean: PyTree[Float[Array, "..."] | None]
    inner: Any

    def averaged(self, params: Params) -> Params:
        """`params` with every float leaf replaced by its mean, in the parameter's
        dtype (non-float leaves are kept): the SWA weights."""

        def pick(m, p):
            return p if m is None else m.astype(p.dtype)

        return jax.tree.map(pick, self.mean, params, is_leaf=lambda x: x is None)


class SWA(AbstractSingleWrapper):
    r"""Stochastic weight averaging (Izmailov et al., 2018): keeps the arithmetic mean
    of the parameters after every `every`-th update from `start` on, alongside
    `inner`, whose updates are unchanged.

    With `k` the number of updates done (1 after the first) and `p_k` the
    parameters they give, the snapshot after update `k` is taken when
    `k > start` and `(k - start) mod every = 0`, and with `n` the snapshots so far

    $$
    \mathrm{mean} \leftarrow \begin{cases} p_k & n = 0 \\
        \mathrm{mean} + \dfrac{p_k - \mathrm{mean}}{n + 1} & n > 0 \end{cases}
        \qquad n \leftarrow n + 1
    $$

    torch's `AveragedModel` with its default (arithmetic-mean) `avg_fn`, with
    `update_parameters` called after those steps: an epoch loop that averages from
    epoch `swa_start` on is `start = swa_start * steps_per_epoch`,
    `every = steps_per_epoch`. Read the mean with `state.averaged(params)` (the
    initial parameters before the first snapshot, as torch's copy of the model).
    Every float leaf is averaged at each snapshot, whether or not its gradient was
    `None`, as torch averages every parameter. The mean is kept in at least
    float32. `start` and `every` are array fields: new values reuse the compiled
    step. Pair it with `SWALR` for torch's learning rate.

    **Arguments:**

    - `inner`: the optimizer.
    - `start`: updates before the first snapshot, an int `>= 0`.
    - `every`: updates between snapshots, an int `>= 1`.
    """

    reduces_over = "nothing"

    reads_params = "mean of the parameters"

    inner: AbstractTransform = inner_field()
    start: Int[Array, ""] = count_field(0, at_least_one=False)
    every: Int[Array, ""] = count_field(1)

    def init(self, params: Params) -> SWAState:
        return SWAState(
            step=zero_step(),
            n_averaged=jnp.zeros((), jnp.int32),
            mean=_copy_float_leaves(params, compute_dtype),
            inner=self.inner.init(params),
        )

    def transform(
        self, grads: Grads, state: SWAState, params: Params, **extra: Any
    ) -> tuple[Updates, SWAState]:
        updates, inner_state = self.run_inner(grads, state.inner, params, extra)
        new_params = apply_updates(params, updates)
        return updates, self._averaged(state, new_params, inner_state)

    def transform_step(
        self, grads: Grads, state: SWAState, params: Params, **extra: Any
    ) -> tuple[Params, SWAState]:
        # The inner optimizer's own step; the mean follows what it returns.
        self.check_keywords(extra)
        new_params, inner_state = self.inner.transform_step(
            grads, state.inner, params, **extra
        )
        return new_params, self._averaged(state, new_params, inner_state)

    def _averaged(
        self, state: SWAState, new_params: Params, inner_state: Any
    ) -> SWAState:
        k = increment(state.step)
        since = k - self.start
        snapshot = (since > 0) & (since % self.every == 0)
        n = state.n_averaged
        param_leaves, treedef = jax.tree.flatten(new_params)
        mean_leaves = treedef.flatten_up_to(state.mean)
        new_mean = []
        for p, m in zip(param_leaves, mean_leaves):
            if m is None:
                new_mean.append(m)
                continue
            p = p.astype(m.dtype)
            # torch copies the first snapshot, then adds `(p - mean) / (n + 1)`.
            step = (p - m) / (n + 1).astype(m.real.dtype)
            moved = jnp.where(n == 0, p, m + step)
            new_mean.append(jnp.where(snapshot, moved, m))
        return SWAState(
            step=k,
            n_averaged=jnp.where(snapshot, n + 1, n).astype(jnp.int32),
            mean=treedef.unflatten(new_mean),
            inner=inner_state,
        )


class LookaheadState(eqx.Module):
    """State of `Lookahead`.

    **Fields:**

    - `steps_since_sync`: int32 scalar, fast steps since the last synchronisation.
    - `slow`: the slow weights, shaped like params (`None` at non-float leaves).
    - `inner`: the fast optimizer's state.
    """

    steps_since_sync: Int[Array, ""]
    slow: PyTree[Float[Array, "..."] | None]
    inner: Any


class Lookahead(AbstractSingleWrapper):
    r"""Lookahead (Zhang et al., 2019): `inner` takes `sync_period` fast steps, then
    the slow weights move a fraction `alpha` towards the fast ones and the fast
    weights restart from there:

    $$
    \begin{aligned}
    \mathrm{fast} &= p + u && \text{every step} \\
    \mathrm{slow} &\leftarrow \mathrm{slow} + \alpha\, (\mathrm{fast} - \mathrm{slow}),
        \quad
        p \leftarrow \mathrm{slow} && \text{every \texttt{sync\_period}-th step}
    \end{aligned}
    $$

    The parameters are the fast weights and the slow weights live in the state
    (`optax.lookahead` instead asks for a `LookaheadParams(fast, slow)` tree; the
    numbers are the same). The inner state is not reset at a sync.

    `sync_period` may change between calls (a new `Lookahead` with another value
    reuses the compiled step). Raised, the fast steps already taken count towards
    the new period; lowered to or below them, the next step synchronises. From
    then on it synchronises every `sync_period` steps, as a fresh `Lookahead`
    with the new value would.

    **Arguments:**

    - `inner`: the fast optimizer.
    - `sync_period`: fast steps per synchronisation, an int `>= 1` (an array field).
    - `alpha`: the slow step size, in `[0, 1]`.
    """

    reduces_over = "nothing"

    reads_params = "slow weights (pulled towards the parameters)"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(fast_optimizer=("inner",), slow_step_size=("alpha",))

    inner: AbstractTransform = inner_field()
    sync_period: Int[Array, ""] = count_field(6)
    # Not a schedule: `LookaheadState` keeps no step count to read one at (only the
    # fast steps since the last synchronisation).
    alpha: Float[Array, ""] = hyper(0.5, low=0.0, high=1.0, schedule=False)

    def init(self, params: Params) -> LookaheadState:
        return LookaheadState(
            steps_since_sync=jnp.zeros((), jnp.int32),
            slow=_copy_float_leaves(params),
            inner=self.inner.init(params),
        )

    def transform(
        self, grads: Grads, state: LookaheadState, params: Params, **extra: Any
    ) -> tuple[Updates, LookaheadState]:
        updates, inner_state = self.run_inner(grads, state.inner, params, extra)
        # `>=`: after sync_period is lowered below the fast steps already taken,
        # `==` would never hold again and the slow weights would never move.
        sync = state.steps_since_sync >= self.sync_period - 1
        alpha = self.alpha

        def rule(u: Any, p: Any, s: Any) -> tuple[Any, Any]:
            # optax.lookahead's merged form of "fast step, then sync".
            diff = p.astype(u.dtype) + u - s.astype(u.dtype)
            new_s = (s.astype(u.dtype) + alpha * diff).astype(s.dtype)
            return jnp.where(sync, u - (1 - alpha) * diff, u), jnp.where(sync, new_s, s)

        new_updates, slow = with_own_state(
            rule, updates, params, state.slow, keep_update=True
        )
        return jax.tree.structure(params).unflatten(new_updates), LookaheadState(
            steps_since_sync=jnp.where(
                sync, 0, increment(state.steps_since_sync)
            ).astype(jnp.int32),
            slow=slow,
            inner=inner_state,
        )
