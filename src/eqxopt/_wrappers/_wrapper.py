"""The base of transforms that hold other transforms, and what they share: which
keyword arguments reach which inner transform, running an inner transform (or
holding its state), and sub-trees of selected leaves."""

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PyTree

from .._core import _shards
from .._core._base import (
    AbstractTransform,
    Grads,
    Params,
    State,
    Supplied,
    Updates,
    checked_transform,
)
from .._core._fields import checked_field


def inner_field() -> Any:
    """The field of a wrapper's inner transform, checked to be an eqxopt one."""
    return checked_field(checked_transform)


class AbstractWrapper(AbstractTransform):
    """A transform that holds other transforms (`inners`: `Chain`'s links, the
    groups of `Partition`, the optimizer inside `MultiSteps`, ...).

    Keyword arguments of `update`/`step` (such as `value=`, the loss) reach the
    inner transforms that take them (`takes_keyword`); a keyword that none of them
    takes is a `TypeError` naming it (`check_keywords`, called by `transform`).
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    @property
    @abc.abstractmethod
    def inners(self) -> tuple[AbstractTransform, ...]:
        """The transforms it holds."""

    def takes_keyword(self, key: str) -> bool:
        return any(t.takes_keyword(key) for t in self.inners)

    def wanted_keywords(self) -> Mapping[str, Supplied]:
        wanted: dict[str, Supplied] = dict(self.keywords)
        for inner in self.inners:
            wanted.update(inner.wanted_keywords())
        return wanted

    def state_in_host_memory(self) -> bool:
        return any(t.state_in_host_memory() for t in self.inners)

    def params_needed(self) -> str | None:
        # Its own rule's (`reads_params`, fields), else the first inner one's.
        needed = super().params_needed()
        for inner in self.inners:
            if needed is not None:
                break
            needed = inner.params_needed()
        return needed

    def check_keywords(self, extra: dict[str, Any]) -> None:
        """Raises `TypeError` for keyword arguments that no inner transform takes."""
        unused = [k for k in extra if not self.takes_keyword(k)]
        if unused:
            names = ", ".join(type(t).__name__ for t in self.inners)
            raise TypeError(
                f"{type(self).__name__} got the keyword argument(s) "
                f"{', '.join(map(repr, unused))}, which no transform inside it "
                f"({names}) takes (a transform names those it takes in its class "
                "attribute `keywords`)"
            )


class AbstractComposite(AbstractWrapper):
    """A wrapper whose update rule and step are one method, `run_inners`, told which
    method of its inner transforms makes the result: `"transform"` (updates) or
    `"transform_step"` (new parameters; an inner transform run by the per-leaf
    engine forms them in the pass that makes its updates). The keyword arguments
    are checked first."""

    @abc.abstractmethod
    def run_inners(
        self, method: str, grads: Grads, state: Any, params: Params, extra: dict
    ) -> tuple[Any, Any]:
        """`(updates, new_state)` for `"transform"`, `(new_params, new_state)` for
        `"transform_step"`."""

    def transform(
        self, grads: Grads, state: Any, params: Params, **extra: Any
    ) -> tuple[Updates, Any]:
        self.check_keywords(extra)
        return self.run_inners("transform", grads, state, params, extra)

    def transform_step(
        self, grads: Grads, state: Any, params: Params, **extra: Any
    ) -> tuple[Params, Any]:
        self.check_keywords(extra)
        return self.run_inners("transform_step", grads, state, params, extra)


def keywords_for(transform: AbstractTransform, extra: dict[str, Any]) -> dict:
    """The part of `extra` that `transform` takes."""
    return {k: v for k, v in extra.items() if transform.takes_keyword(k)}


class AbstractSingleWrapper(AbstractWrapper):
    """A wrapper around one transform, `inner` (declared by each subclass as
    `inner: AbstractTransform = inner_field()`), which gets every keyword argument
    (those it does not take are rejected first)."""

    inner: eqx.AbstractVar[AbstractTransform]

    @property
    def inners(self) -> tuple[AbstractTransform, ...]:
        return (self.inner,)

    def run_inner(
        self,
        grads: Grads,
        inner_state: State,
        params: Params,
        extra: dict[str, Any],
        *,
        when: Any = True,
    ) -> tuple[Updates, State]:
        """`inner.transform` with the keyword arguments (checked first). With
        `when` (a bool scalar), only where it holds: else zero updates (shaped like
        `inner`'s) and `inner_state` as it was, in a `lax.cond` (the skipped
        branch costs nothing but the zeros)."""
        self.check_keywords(extra)

        def run() -> tuple[Updates, State]:
            return self.inner.transform(grads, inner_state, params, **extra)

        if when is True:
            return run()
        updates_shape, _ = jax.eval_shape(run)

        def hold() -> tuple[Updates, State]:
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), updates_shape)
            return zeros, inner_state

        # Inside shard_map the zeros and the held state are typed invariant where
        # the run branch's results vary over the mesh axes: `_shards.cond` types
        # both branches alike.
        return _shards.cond(when, run, hold)


class AbstractGate(AbstractSingleWrapper):
    """A wrapper that runs `inner` only on the steps it accepts (`run_inner`'s
    `when`), keeping beside `inner`'s state a few scalars of its own. A subclass
    declares `state_type` (its fields: the scalars, then `inner`), `start` (the
    scalars at `init`, which may follow the parameters' dtypes) and `gate`
    (whether a step is accepted, and the new scalars)."""

    state_type: eqx.AbstractClassVar[type[Any]]

    @abc.abstractmethod
    def start(self, params: Params) -> dict[str, Any]:
        """The state's own scalars at `init` for `params`, by field name."""

    @abc.abstractmethod
    def gate(
        self, grads: Grads, state: Any, params: Params
    ) -> tuple[Any, dict[str, Any]]:
        """`(accept, scalars)`: whether `inner` runs at this step (a bool scalar)
        and the state's new scalars, by field name."""

    def init(self, params: Params) -> Any:
        return self.state_type(**self.start(params), inner=self.inner.init(params))

    def transform(
        self, grads: Grads, state: Any, params: Params, **extra: Any
    ) -> tuple[Updates, Any]:
        accept, scalars = self.gate(grads, state, params)
        updates, inner_state = self.run_inner(
            grads, state.inner, params, extra, when=accept
        )
        return updates, self.state_type(**scalars, inner=inner_state)


# ---------------------------------------------------------------------------------
# Selecting leaves: a tree with `None` in place of the leaves not selected, so an
# inner transform keeps no state for them and sees no gradient there.


def select_leaves(tree: PyTree, keep: Sequence[bool]) -> PyTree:
    """`tree` with every leaf whose `keep` entry is False replaced by `None`."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten([x if k else None for x, k in zip(leaves, keep)])


def select_aligned(
    aligned: Sequence[Any], params: PyTree, keep: Sequence[bool]
) -> PyTree:
    """A gradient tree from per-leaf gradients (`align_grads`), `None` where
    `keep` is False."""
    treedef = jax.tree.structure(params)
    return treedef.unflatten([g if k else None for g, k in zip(aligned, keep)])


def leaves_of(updates: PyTree, params: PyTree) -> list[Any]:
    """Each update for a leaf of `params` (`None` where there is none); `updates`
    has `None` in place of whole leaves."""
    return jax.tree.structure(params).flatten_up_to(updates)


def with_own_state(
    rule: Callable[[Any, Any, Any], tuple[Any, Any]],
    updates: Updates,
    params: Params,
    own: PyTree,
    *,
    keep_update: bool = False,
) -> tuple[list[Any], PyTree]:
    """A wrapper's per-leaf pass over `inner`'s updates and a state tree of its own
    shaped like `params` (`own`: slow weights, a compensation, ...): per leaf of
    `params`, `rule(u, p, s) -> (out, new_s)` for its update `u`, parameter `p` and
    own leaf `s`. Where `u` or `s` is `None`, `s` stays and `out` is `None`, or `u`
    as it is (`keep_update`). Returns the `out` per leaf of `params` (a list) and
    the new own tree."""
    leaves, treedef = jax.tree.flatten(params)
    outs, new_own = [], []
    for u, p, s in zip(leaves_of(updates, params), leaves, treedef.flatten_up_to(own)):
        if u is None or s is None:
            outs.append(u if keep_update else None)
            new_own.append(s)
            continue
        out, s = rule(u, p, s)
        outs.append(out)
        new_own.append(s)
    return outs, treedef.unflatten(new_own)
