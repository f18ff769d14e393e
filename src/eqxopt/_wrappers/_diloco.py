"""DiLoCo (Douillard et al., 2023): local steps on each data-parallel replica, and
every `sync_every` steps an outer optimizer step on the replicas' average distance
from a shared anchor."""

from collections.abc import Hashable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._core import _shards
from .._core._base import AbstractTransform, Grads, Params, Updates, checked_transform
from .._core._checks import static_count
from .._core._fields import axis_name_field, checked_field
from .._core._shards import AxisName
from .._core._tree import compute_dtype, increment, is_float_leaf, zero_step
from ._wrapper import AbstractWrapper, inner_field, keywords_for, leaves_of


class DiLoCoState(eqx.Module):
    """State of `DiLoCo`, one per replica (the same on every replica but `inner`).

    **Fields:**

    - `step`: int32 scalar, the inner steps taken.
    - `anchor`: the parameters at the last synchronisation (the outer
      optimizer's parameters), shaped like params, in at least float32 (`None` at
      non-float leaves).
    - `inner`: the inner optimizer's state (this replica's own: not reset at a
      synchronisation, as in the paper).
    - `outer`: the outer optimizer's state (for the anchor).
    """

    step: Int[Array, ""]
    anchor: PyTree[Float[Array, "..."] | None]
    inner: Any
    outer: Any


def _checked_outer(name: str, value: AbstractTransform | None) -> AbstractTransform:
    """The outer optimizer: the paper's Nesterov SGD for `None`."""
    if value is None:
        from .._optimizers._sgd._sgd import SGD

        return SGD(0.7, momentum=0.9, nesterov=True)
    return checked_transform(name, value)


def _check_bound(axis_name: tuple[Hashable, ...]) -> None:
    for name in axis_name:
        try:
            jax.lax.axis_index(name)
        except NameError as e:
            raise ValueError(
                f"DiLoCo: axis_name {name!r} is not bound here: call the step "
                "inside jax.shard_map over a mesh with that axis, or inside "
                f"jax.vmap(..., axis_name={name!r}) (or leave axis_name=None for "
                "one replica)"
            ) from e


class DiLoCo(AbstractWrapper):
    r"""DiLoCo (Douillard et al., 2023, "DiLoCo: Distributed Low-Communication
    Training of Language Models", arXiv:2311.08105): each data-parallel replica
    takes `sync_every` = $H$ steps of `inner` on its own data with no
    communication; then the replicas average their distance from the shared
    anchor $\theta$ (the parameters at the last synchronisation), the `outer`
    optimizer steps the anchor with that average as its gradient, and every
    replica restarts from the new anchor:

    $$
    \begin{aligned}
    \theta_r &\leftarrow \theta_r + \mathrm{inner}(g_r)
        && \text{every step, on each replica } r \\
    \Delta &= \frac{1}{R} \sum_{r=1}^{R} (\theta - \theta_r), \quad
    \theta \leftarrow \mathrm{outer}(\theta, \Delta), \quad
    \theta_r \leftarrow \theta
        && \text{every } H\text{-th step}
    \end{aligned}
    $$

    The average is one `jax.lax.pmean` per leaf over `axis_name`, so a replica is
    a slice of a data-parallel mesh axis under `jax.shard_map` (or of a
    `jax.vmap(..., axis_name=...)`), and the replicas communicate once every $H$
    steps instead of once a step (data parallelism's gradient all-reduce). Each
    replica keeps its own inner state (Adam's moments of its own gradients; not
    reset at a synchronisation); the anchor and the outer state are the same on
    every replica.

    `update`/`step` take the inner step and, on every $H$-th step, the
    synchronisation, inside a `lax.cond` (its all-reduces run on those steps
    only; the update then moves the parameters to the new anchor). For programs
    that hold no collective at all on the inner steps, call `local_step` on the
    inner steps and `sync` every $H$ steps instead: the same numbers, with the
    communication in a program of its own.

    **Arguments:**

    - `inner`: the optimizer each replica runs (the paper's: AdamW).
    - `sync_every`: $H$, the inner steps between synchronisations, an int `>= 1`
      (static; the paper's: 500).
    - `outer`: the optimizer of the anchor, any eqxopt optimizer; `None`
      (default) is the paper's Nesterov SGD,
      `eqxopt.SGD(0.7, momentum=0.9, nesterov=True)` (tuned for hundreds of
      inner steps a round: with a few, a smaller momentum).
    - `axis_name`: keyword-only: the mesh axis name (or tuple of them) the
      replicas lie along, inside `jax.shard_map` or `jax.vmap`; `None` for a
      single replica (the outer step on its own distance).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    opt = eqxopt.DiLoCo(eqxopt.AdamW(1e-3), sync_every=4, axis_name="replica")
    params = jnp.zeros((2, 3))  # two replicas (a leading axis, vmapped)
    state = jax.vmap(opt.init)(params)
    grads = jnp.stack([jnp.ones(3), -jnp.ones(3)])
    step = jax.vmap(opt.step, axis_name="replica")
    for _ in range(4):
        params, state = step(grads, state, params)
    assert bool(jnp.all(params[0] == params[1]))  # synchronised after 4 steps
    ```
    """

    # Its own maths (the distance from the anchor, its mean over the replicas)
    # is element by element; the inner and outer optimizers answer for theirs.
    reduces_over = "nothing"

    reads_params = "distance from the anchor"

    inner: AbstractTransform = inner_field()
    sync_every: int = checked_field(static_count, 8, static=True)
    outer: AbstractTransform = checked_field(_checked_outer, None)
    axis_name: AxisName = axis_name_field()

    @property
    def inners(self) -> tuple[AbstractTransform, ...]:
        return (self.inner,)

    def init(self, params: Params) -> DiLoCoState:
        anchor = jax.tree.map(
            lambda p: (
                jnp.array(p, dtype=compute_dtype(p.dtype), copy=True)
                if is_float_leaf(p)
                else None
            ),
            params,
        )
        return DiLoCoState(
            step=zero_step(),
            anchor=anchor,
            inner=self.inner.init(params),
            outer=self.outer.init(_anchored(anchor, params)),
        )

    def transform(
        self, grads: Grads, state: DiLoCoState, params: Params, **extra: Any
    ) -> tuple[Updates, DiLoCoState]:
        self.check_keywords(extra)
        updates, inner_state = self.inner.transform(
            grads, state.inner, params, **keywords_for(self.inner, extra)
        )
        moved = jax.tree.map(
            lambda p, u: p if u is None else (p + u.astype(p.dtype)),
            params,
            updates,
            is_leaf=lambda x: x is None,
        )
        state = DiLoCoState(state.step, state.anchor, inner_state, state.outer)

        def synced() -> tuple[Updates, DiLoCoState]:
            new_params, new_state = self._sync(state, moved, updates)
            to_anchor = jax.tree.map(
                lambda u, q, p: (
                    None if u is None else q.astype(u.dtype) - p.astype(u.dtype)
                ),
                updates,
                new_params,
                params,
                is_leaf=lambda x: x is None,
            )
            return to_anchor, new_state

        return self._maybe_sync(updates, state, synced)

    def transform_step(
        self, grads: Grads, state: DiLoCoState, params: Params, **extra: Any
    ) -> tuple[Params, DiLoCoState]:
        self.check_keywords(extra)
        moved, inner_state = self.inner.transform_step(
            grads, state.inner, params, **keywords_for(self.inner, extra)
        )
        updates = jax.tree.map(
            lambda g, p: None if g is None else p,
            grads,
            params,
            is_leaf=lambda x: x is None,
        )
        state = DiLoCoState(state.step, state.anchor, inner_state, state.outer)
        return self._maybe_sync(moved, state, lambda: self._sync(state, moved, updates))

    def _maybe_sync(self, out: Any, state: DiLoCoState, synced: Any) -> Any:
        """`synced()` on every `sync_every`-th step, else `out` with the step
        counted."""
        step = increment(state.step)

        def local() -> tuple[Any, DiLoCoState]:
            return out, DiLoCoState(step, state.anchor, state.inner, state.outer)

        def sync() -> tuple[Any, DiLoCoState]:
            new_out, new_state = synced()
            return new_out, DiLoCoState(
                step, new_state.anchor, new_state.inner, new_state.outer
            )

        if self.sync_every == 1:
            return sync()

        # The branches return the array leaves only (a whole Equinox model's
        # functions are kept aside, the same in both).
        def arrays(branch: Any) -> Any:
            def run() -> tuple[Any, DiLoCoState]:
                got, new_state = branch()
                return eqx.filter(got, eqx.is_array), new_state

            return run

        got, new_state = _shards.cond(
            step % self.sync_every == 0, arrays(sync), arrays(local)
        )
        return eqx.combine(got, eqx.filter(out, eqx.is_array, inverse=True)), new_state

    def _sync(
        self, state: DiLoCoState, params: Params, which: PyTree
    ) -> tuple[Params, DiLoCoState]:
        """The outer step at `params` (this replica's): every leaf where `which`
        is not `None` moves to the new anchor."""
        if self.axis_name is not None:
            _check_bound(self.axis_name)
        param_leaves, treedef = jax.tree.flatten(params)
        anchor_leaves = treedef.flatten_up_to(state.anchor)
        deltas = []
        for p, a, w in zip(param_leaves, anchor_leaves, leaves_of(which, params)):
            if a is None or w is None:
                deltas.append(None)
                continue
            delta = a - p.astype(a.dtype)
            if self.axis_name is not None:
                delta = jax.lax.pmean(delta, self.axis_name)
            deltas.append(delta)
        anchored = _anchored(state.anchor, params)
        new_anchored, outer_state = self.outer.transform_step(
            treedef.unflatten(deltas), state.outer, anchored
        )
        new_leaves = treedef.flatten_up_to(new_anchored)
        new_anchor = treedef.unflatten(
            [None if a is None else q for a, q in zip(anchor_leaves, new_leaves)]
        )
        new_params = treedef.unflatten(
            [
                p if d is None else q.astype(p.dtype)
                for p, d, q in zip(param_leaves, deltas, new_leaves)
            ]
        )
        return new_params, DiLoCoState(state.step, new_anchor, state.inner, outer_state)

    def local_step(
        self, grads: Grads, state: DiLoCoState, params: Params, **extra: Any
    ) -> tuple[Params, DiLoCoState]:
        """An inner step alone: `inner.step` on this replica, no communication
        (however many steps it is since the last `sync`). With `sync` every
        `sync_every` steps, the numbers of `step`.

        **Returns:** `(new_params, new_state)`.
        """
        new_params, inner_state = self.inner.step(grads, state.inner, params, **extra)
        return new_params, DiLoCoState(
            increment(state.step), state.anchor, inner_state, state.outer
        )

    def sync(self, state: DiLoCoState, params: Params) -> tuple[Params, DiLoCoState]:
        """The synchronisation alone: the replicas' average distance from the
        anchor (one `pmean` per float leaf over `axis_name`), the outer step of the
        anchor, and every float parameter set to the new anchor (in its dtype).

        **Returns:** `(new_params, new_state)`.
        """
        which = jax.tree.map(lambda p: p if is_float_leaf(p) else None, params)
        return self._sync(state, params, which)


def _anchored(anchor: PyTree, params: Params) -> Params:
    """`params` with each float leaf replaced by the anchor's (the outer
    optimizer's parameters)."""
    return jax.tree.map(
        lambda a, p: p if a is None else a, anchor, params, is_leaf=lambda x: x is None
    )
