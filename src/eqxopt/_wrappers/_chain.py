"""`Chain`: transforms run one after another; and the helpers every wrapper shares
(which keyword arguments reach which transform, sub-trees of selected leaves)."""

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PyTree

from .._core._base import AbstractTransform, Grads, Params, State, Updates


class EmptyState(eqx.Module):
    """State of a transform that keeps nothing between steps (clipping,
    centralisation, ...). It has no fields."""


# ---------------------------------------------------------------------------------
# Keyword arguments (`value=` the loss, ...) forwarded only to what takes them.


@functools.cache
def _signature(cls: type) -> tuple[frozenset[str], bool]:
    parameters = inspect.signature(cls.transform).parameters
    named = frozenset(
        name
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and name not in ("self", "grads", "state", "params")
    )
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    return named, takes_any


def inner_transforms(module: eqx.Module) -> list[AbstractTransform]:
    """The transforms held in `module`'s fields (directly or in tuples/dicts)."""
    found: list[AbstractTransform] = []
    for f in dataclasses.fields(module):
        value = getattr(module, f.name, None)
        leaves = jax.tree.leaves(
            value, is_leaf=lambda x: isinstance(x, AbstractTransform)
        )
        found.extend(x for x in leaves if isinstance(x, AbstractTransform))
    return found


def accepts_keyword(transform: AbstractTransform, key: str) -> bool:
    """Whether `transform.transform` uses the keyword argument `key`: it names it, or
    it takes `**extra` and some transform inside it uses `key` (a `**extra` with no
    transform inside, as `FromOptax` has, takes everything). A transform whose
    keywords depend on its configuration says so with a `takes_keyword(key)`
    method (`LBFGS` takes none without its linesearch)."""
    takes_keyword = getattr(transform, "takes_keyword", None)
    if takes_keyword is not None:
        return takes_keyword(key)
    named, takes_any = _signature(type(transform))
    if key in named:
        return True
    if not takes_any:
        return False
    inner = inner_transforms(transform)
    return not inner or any(accepts_keyword(t, key) for t in inner)


def check_extra(owner: str, inner: Sequence[AbstractTransform], extra: dict) -> None:
    """Raises `TypeError` for keyword arguments that no transform in `inner` takes."""
    unused = [k for k in extra if not any(accepts_keyword(t, k) for t in inner)]
    if unused:
        names = ", ".join(type(t).__name__ for t in inner)
        raise TypeError(
            f"{owner} got the keyword argument(s) {', '.join(map(repr, unused))}, "
            f"which no transform inside it ({names}) takes"
        )


def extra_for(transform: AbstractTransform, extra: dict) -> dict:
    """The part of `extra` that `transform` takes."""
    return {k: v for k, v in extra.items() if accepts_keyword(transform, k)}


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


def checked_transform(name: str, value: Any) -> AbstractTransform:
    if not isinstance(value, AbstractTransform):
        hint = ""
        if type(value).__name__.startswith("GradientTransformation"):
            hint = "; wrap optax transformations with eqxopt.from_optax(...)"
        raise TypeError(
            f"{name} must be an eqxopt transform, got {type(value).__name__}{hint}"
        )
    return value


# ---------------------------------------------------------------------------------


class ChainState(eqx.Module):
    """State of `Chain`.

    **Fields:**

    - `names`: the name of each link (static), in order.
    - `states`: each link's state, in the same order.

    Index it by a link's name or position: `state["AdamW"].mu`, `state[0]`.
    """

    names: tuple[str, ...] = eqx.field(static=True)
    states: tuple[Any, ...]

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, str):
            if key not in self.names:
                raise KeyError(f"no link named {key!r}; the links are {self.names}")
            return self.states[self.names.index(key)]
        return self.states[key]


def _default_names(links: Sequence[AbstractTransform]) -> tuple[str, ...]:
    names: list[str] = []
    for link in links:
        base = type(link).__name__
        name, k = base, 1
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return tuple(names)


class Chain(AbstractTransform):
    """Transforms applied one after another: the updates of each link are the
    gradients of the next, as in `optax.chain`.

    ```
    u_0 = grads;  u_i, s_i = links[i].transform(u_{i-1}, s_i, params)
    ```

    The last link is usually an optimizer (its updates include the learning rate);
    links before it transform gradients (clipping, noise, ...), links after it
    transform updates (`DecoupledWeightDecay`, `ReduceOnPlateau`). Keyword arguments
    of `update`/`step` (such as `value=`) go to the links that take them.

    **Arguments:**

    - `*links`: eqxopt transforms, at least one.
    - `names`: optional names for the links' states; by default each link's class
      name (`"ClipByGlobalNorm"`, `"AdamW"`), with `_1`, `_2`, ... on repeats.

    The state is a `ChainState`: `state["AdamW"].mu` reads the Adam moments.
    """

    links: tuple[AbstractTransform, ...]
    names: tuple[str, ...] = eqx.field(static=True)

    def __init__(self, *links: AbstractTransform, names: Sequence[str] | None = None):
        if not links:
            raise ValueError("Chain needs at least one link")
        self.links = tuple(
            checked_transform(f"links[{i}]", x) for i, x in enumerate(links)
        )
        if names is None:
            self.names = _default_names(self.links)
        else:
            names = tuple(names)
            if len(names) != len(links) or not all(isinstance(n, str) for n in names):
                raise ValueError(
                    f"names must be {len(links)} strings, one per link, got {names!r}"
                )
            if len(set(names)) != len(names):
                raise ValueError(f"names must be unique, got {names!r}")
            self.names = names

    def init(self, params: Params) -> ChainState:
        return ChainState(
            names=self.names, states=tuple(link.init(params) for link in self.links)
        )

    def transform(
        self, grads: Grads, state: ChainState, params: Params, **extra: Any
    ) -> tuple[Updates, ChainState]:
        check_extra("Chain", self.links, extra)
        updates = grads
        new_states: list[State] = []
        for link, link_state in zip(self.links, state.states):
            updates, link_state = link.transform(
                updates, link_state, params, **extra_for(link, extra)
            )
            new_states.append(link_state)
        return updates, ChainState(names=self.names, states=tuple(new_states))


def run_or_hold(
    pred: Any, run: Callable[[], tuple[Updates, State]], held_state: State
) -> tuple[Updates, State]:
    """`run()` if `pred`, else zero updates (shaped like `run`'s) and `held_state`.

    A `lax.cond`: the skipped branch costs nothing but the zeros."""
    updates_shape, _ = jax.eval_shape(run)

    def hold() -> tuple[Updates, State]:
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), updates_shape)
        return zeros, held_state

    return jax.lax.cond(pred, run, hold)
