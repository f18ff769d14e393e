"""`Chain`: transforms run one after another."""

from collections.abc import Sequence
from typing import Any

import equinox as eqx

from .._core._base import AbstractTransform, Grads, Params, State
from ._wrapper import AbstractComposite, checked_transform, keywords_for


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


def _names(names: Sequence[str], links: Sequence[Any]) -> tuple[str, ...]:
    names = tuple(names)
    if len(names) != len(links) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"names must be {len(links)} strings, one per link, got {names!r}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"names must be unique, got {names!r}")
    return names


class Chain(AbstractComposite):
    r"""Transforms applied one after another: the updates of each link are the
    gradients of the next, as in `optax.chain`.

    $$
    u_0 = \mathrm{grads}, \qquad
    (u_i, s_i) = \mathrm{links}[i].\mathrm{transform}(u_{i-1}, s_i, \mathrm{params})
    $$

    The last link is usually an optimizer (its updates include the learning rate);
    links before it transform gradients (clipping, noise, ...), links after it
    transform updates (`DecoupledWeightDecay`, `ReduceOnPlateau`). Keyword arguments
    of `update`/`step` (such as `value=`) go to the links that take them.

    **Arguments:**

    - `*links`: eqxopt transforms, at least one.
    - `names`: optional names for the links' states; by default each link's class
      name (`"ClipByGlobalNorm"`, `"AdamW"`), with `_1`, `_2`, ... on repeats.

    The state is a `ChainState`: `state["AdamW"].mu` reads the Adam moments.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    opt = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.SGD(0.1))
    params = {"w": jnp.zeros(2)}
    grads = {"w": jnp.array([3.0, 4.0])}  # norm 5, clipped to norm 1
    state = opt.init(params)
    params, state = opt.step(grads, state, params)
    assert jnp.allclose(params["w"], -0.1 * jnp.array([0.6, 0.8]))
    assert int(state["SGD"].step) == 1  # each link's state, by name
    ```
    """

    reduces_over = "nothing"

    links: tuple[AbstractTransform, ...]
    names: tuple[str, ...] = eqx.field(static=True)

    def __init__(self, *links: AbstractTransform, names: Sequence[str] | None = None):
        if not links:
            raise ValueError("Chain needs at least one link")
        self.links = tuple(
            checked_transform(f"links[{i}]", x) for i, x in enumerate(links)
        )
        self.names = (
            _default_names(self.links) if names is None else _names(names, links)
        )
        for i, link in enumerate(self.links[1:], 1):
            if link.takes_per_example_grads():
                raise ValueError(
                    f"links[{i}] ({type(link).__name__}) takes per-example gradients, "
                    "so it must be the first link (the links after it get its "
                    "aggregated updates)"
                )

    def takes_per_example_grads(self) -> bool:
        return self.links[0].takes_per_example_grads()

    @property
    def inners(self) -> tuple[AbstractTransform, ...]:
        return self.links

    def init(self, params: Params) -> ChainState:
        return ChainState(
            names=self.names, states=tuple(link.init(params) for link in self.links)
        )

    def run_inners(
        self, method: str, grads: Grads, state: ChainState, params: Params, extra: dict
    ) -> tuple[Any, ChainState]:
        # `method` for the last link only: where it forms the new parameters in the
        # pass that makes its updates (the per-leaf engine), a chain keeps that.
        out = grads
        new_states: list[State] = []
        for i, (link, link_state) in enumerate(zip(self.links, state.states)):
            name = method if i == len(self.links) - 1 else "transform"
            out, link_state = getattr(link, name)(
                out, link_state, params, **keywords_for(link, extra)
            )
            new_states.append(link_state)
        return out, ChainState(names=self.names, states=tuple(new_states))
