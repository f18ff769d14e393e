"""Parameter groups: `Partition` (a transform per labelled group of leaves),
`Masked` (a transform on some leaves, the rest passed through) and `Freeze` (no
update and no state for frozen leaves)."""

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import equinox as eqx
import jax
from jaxtyping import PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import renames
from .._core._fields import MaskLike, checked_field
from .._core._masks import Mask, decay_flags, freeze_mask
from .._core._structure import structure_mismatch
from .._core._tree import align_grads, compute_dtype, is_float_leaf, leaf_paths
from ._wrapper import (
    AbstractComposite,
    AbstractSingleWrapper,
    checked_transform,
    inner_field,
    keywords_for,
    leaves_of,
    select_aligned,
    select_leaves,
)


def _is_label_fn(x: Any) -> bool:
    return callable(x) and not isinstance(x, eqx.Module)


def resolve_labels(labels: Any, params: PyTree) -> list[Hashable | None]:
    """One label per leaf of `params` (in `jax.tree.leaves` order); `None` for
    non-float leaves and for leaves labelled `None`."""

    def is_leaf(x):
        return x is None or _is_label_fn(x)

    label_leaves, label_def = jax.tree.flatten(labels, is_leaf=is_leaf)
    try:
        subtrees = label_def.flatten_up_to(params)
    except (ValueError, TypeError):
        raise structure_mismatch(labels, "labels", params, "params") from None
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree.leaves_with_path(labels, is_leaf=is_leaf)
    ]
    out: list[Hashable | None] = []
    for path, label, sub in zip(paths, label_leaves, subtrees):
        for leaf in jax.tree.leaves(sub):
            if not is_float_leaf(leaf):
                out.append(None)
                continue
            value = label(leaf) if _is_label_fn(label) else label
            try:
                hash(value)
            except TypeError:
                hint = ""
                if _is_label_fn(label):
                    hint = (
                        "; a function given as labels is called on each leaf, as "
                        "eqx.filter calls a filter (for an optax-style function of "
                        "the whole tree, pass labels=label_fn(params))"
                    )
                raise TypeError(
                    f"labels{path} must give a hashable label, got {value!r}{hint}"
                ) from None
            out.append(value)
    return out


class PartitionState(eqx.Module):
    """State of `Partition`.

    **Fields:**

    - `groups`: a dict from each label to the state of that group's transform
      (which holds state only for that group's leaves; `None` elsewhere).
    """

    groups: dict[Any, Any]

    def __getitem__(self, label: Hashable) -> Any:
        return self.groups[label]


def _transforms(
    name: str, value: Mapping[Hashable, AbstractTransform]
) -> dict[Any, AbstractTransform]:
    if not isinstance(value, Mapping) or not value:
        raise TypeError(
            f"{name} must be a non-empty dict from label to eqxopt transform, "
            f"got {value!r}"
        )
    return {
        label: checked_transform(f"{name}[{label!r}]", t) for label, t in value.items()
    }


def _labels(
    name: str, value: PyTree[Hashable] | Callable[[PyTree], PyTree[Hashable]]
) -> Any:
    if value is None:
        raise TypeError(f"{name} must be a tree of labels or a function, got None")
    return value


class Partition(AbstractComposite):
    """Parameter groups: a separate transform for each labelled group of leaves,
    like `optax.partition` (`multi_transform`) or torch's param groups.

    Each group's transform sees only its own leaves (the others are `None` to it), so
    it keeps state only for them and its hyperparameters apply only to them.

    **Arguments:**

    - `transforms`: a dict from label to eqxopt transform.
    - `labels`: the label of every parameter leaf, given as
        - a tree shaped like the parameters (or a prefix of it: a label covers the
          whole subtree below it) whose entries are labels, `None` (not optimised:
          no update, no state), or functions of one leaf returning its label;
        - or one such function, applied to every float leaf, as `eqx.filter`
          applies a filter function (optax instead calls a function with the whole
          tree; for an optax-style `label_fn`, pass `labels=label_fn(params)`).

      An Equinox module given as labels is read as a tree, never called (optax
      calls a callable module; equinox issue 193). Non-float leaves need no label.
      Labels are static (part of the compiled step's key): reuse one function
      rather than a new lambda for every optimizer you build.

    Keyword arguments of `update`/`step` go to the transforms that take them.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    grads = {"w": jnp.ones(2), "b": jnp.ones(2)}
    opt = eqxopt.Partition(
        {"fast": eqxopt.SGD(0.1), "slow": eqxopt.SGD(0.01)},
        labels={"w": "fast", "b": "slow"},
    )
    state = opt.init(params)
    params, state = opt.step(grads, state, params)
    assert jnp.allclose(params["w"], 0.9) and jnp.allclose(params["b"], 0.99)
    print(state["slow"])  # each group's state, by label
    ```
    """

    reduces_over = "nothing"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(param_labels=("labels",))

    transforms: dict[Any, AbstractTransform] = checked_field(_transforms)
    labels: Any = checked_field(_labels)

    @property
    def inners(self) -> tuple[AbstractTransform, ...]:
        return tuple(self.transforms.values())

    def _resolve(self, params: Params) -> list[Hashable | None]:
        resolved = resolve_labels(self.labels, params)
        for path, label in zip(leaf_paths(params), resolved):
            if label is not None and label not in self.transforms:
                raise ValueError(
                    f"params{path} has the label {label!r}, which is not a key of "
                    f"transforms ({', '.join(map(repr, self.transforms))})"
                )
        return resolved

    def init(self, params: Params) -> PartitionState:
        labels = self._resolve(params)
        return PartitionState(
            groups={
                label: t.init(select_leaves(params, [x == label for x in labels]))
                for label, t in self.transforms.items()
            }
        )

    def run_inners(
        self,
        method: str,
        grads: Grads,
        state: PartitionState,
        params: Params,
        extra: dict[str, Any],
    ) -> tuple[Any, PartitionState]:
        # Each group's `method` on its leaves, merged: updates (`None` at leaves of
        # no group) or new parameters (the old ones at leaves of no group). Each
        # group's own `transform_step`, so that a group run by the per-leaf engine
        # forms its new parameters in the pass that makes its updates.
        labels = self._resolve(params)
        aligned = align_grads(grads, params)
        param_leaves, treedef = jax.tree.flatten(params)
        merged = (
            list(param_leaves) if method == "transform_step" else [None] * len(labels)
        )
        groups = {}
        for label, t in self.transforms.items():
            keep = [x == label and x is not None for x in labels]
            out, groups[label] = getattr(t, method)(
                select_aligned(aligned, params, keep),
                state.groups[label],
                select_leaves(params, keep),
                **keywords_for(t, extra),
            )
            for i, x in enumerate(leaves_of(out, params)):
                if keep[i]:
                    merged[i] = x
        return treedef.unflatten(merged), PartitionState(groups=groups)


class MaskedState(eqx.Module):
    """State of `Masked` and `Freeze`.

    **Fields:**

    - `inner`: the wrapped transform's state, holding state only for the leaves it
      sees (`None` elsewhere).
    """

    inner: Any


def _required_mask(name: str, value: Mask) -> Any:
    if value is None:
        raise TypeError(f"{name} must be a tree of bools or a function, got None")
    return freeze_mask(value, name)


def _mask_field() -> Any:
    # As `mask_field()`, but required and positional: `None` (all leaves) would make
    # `Masked` and `Freeze` pointless.
    return checked_field(_required_mask, static=True)


def _run_on(
    wrapper: AbstractSingleWrapper,
    keep: list[bool],
    grads: Grads,
    state: MaskedState,
    params: Params,
    extra: dict,
) -> tuple[list[Any], list[Any], MaskedState]:
    aligned = align_grads(grads, params)
    updates, inner_state = wrapper.run_inner(
        select_aligned(aligned, params, keep),
        state.inner,
        select_leaves(params, keep),
        extra,
    )
    return aligned, leaves_of(updates, params), MaskedState(inner=inner_state)


class Masked(AbstractSingleWrapper):
    """Applies `inner` to the masked leaves only; the other leaves' gradients pass
    through unchanged, as `optax.masked`. `inner` keeps no state for them.

    Use it for a gradient transform inside a `Chain`
    (`Masked(ClipByValue(1.0), mask)`). Do not wrap a whole optimizer in it: the
    leaves outside the mask would get their raw gradient as the update (as in
    optax). To keep leaves from changing at all use `Freeze`; for different
    optimizers per group use `Partition`.

    **Arguments:**

    - `inner`: an eqxopt transform.
    - `mask`: which leaves `inner` applies to: a tree of bools shaped like the
      parameters (or a prefix of it), or a function of the whole parameter tree
      returning one (as optax's `mask`). An Equinox module is read as a tree, never
      called (equinox issue 193). The mask is static (part of the compiled step's
      key), checked at `init`: reuse one function rather than a new lambda for
      every optimizer you build.
    """

    reduces_over = "nothing"

    inner: AbstractTransform = inner_field()
    mask: MaskLike = _mask_field()

    def init(self, params: Params) -> MaskedState:
        return MaskedState(
            inner=self.inner.init(select_leaves(params, decay_flags(self.mask, params)))
        )

    def transform(
        self, grads: Grads, state: MaskedState, params: Params, **extra: Any
    ) -> tuple[Updates, MaskedState]:
        keep = decay_flags(self.mask, params)
        aligned, inner_updates, new_state = _run_on(
            self, keep, grads, state, params, extra
        )
        param_leaves, treedef = jax.tree.flatten(params)
        out = []
        for k, g, u, p in zip(keep, aligned, inner_updates, param_leaves):
            if k:
                out.append(u)
            elif g is None or not is_float_leaf(p):
                out.append(None)
            else:
                out.append(g.astype(compute_dtype(p.dtype)))
        return treedef.unflatten(out), new_state


class Freeze(AbstractSingleWrapper):
    """Freezes some leaves: they get no update (`None`) and `inner` keeps no state
    for them; every other leaf is updated by `inner`.

    `opt.step`, `eqxopt.apply_updates` and `eqx.apply_updates` leave a frozen
    leaf as it is; `optax.apply_updates` adds every leaf and cannot add `None`
    (optax's `set_to_zero` gives zeros instead, at the cost of an array per
    frozen leaf).

    **Arguments:**

    - `inner`: the optimizer for the leaves that train.
    - `frozen`: which leaves to freeze, as `Masked`'s `mask` (`True` = frozen).
    """

    reduces_over = "nothing"

    inner: AbstractTransform = inner_field()
    frozen: MaskLike = _mask_field()

    def _trainable(self, params: Params) -> list[bool]:
        return [not f for f in decay_flags(self.frozen, params, "frozen")]

    def init(self, params: Params) -> MaskedState:
        return MaskedState(
            inner=self.inner.init(select_leaves(params, self._trainable(params)))
        )

    def transform(
        self, grads: Grads, state: MaskedState, params: Params, **extra: Any
    ) -> tuple[Updates, MaskedState]:
        keep = self._trainable(params)
        _, inner_updates, new_state = _run_on(self, keep, grads, state, params, extra)
        treedef = jax.tree.structure(params)
        return treedef.unflatten(
            [u if k else None for k, u in zip(keep, inner_updates)]
        ), new_state

    def transform_step(
        self, grads: Grads, state: MaskedState, params: Params, **extra: Any
    ) -> tuple[Params, MaskedState]:
        # `inner`'s own step on the leaves that train (it may form their new
        # parameters in the pass that makes their updates); frozen leaves stay.
        self.check_keywords(extra)
        keep = self._trainable(params)
        new_params, inner_state = self.inner.transform_step(
            select_aligned(align_grads(grads, params), params, keep),
            state.inner,
            select_leaves(params, keep),
            **extra,
        )
        param_leaves, treedef = jax.tree.flatten(params)
        new_leaves = leaves_of(new_params, params)
        return treedef.unflatten(
            [n if k else p for k, n, p in zip(keep, new_leaves, param_leaves)]
        ), MaskedState(inner=inner_state)
