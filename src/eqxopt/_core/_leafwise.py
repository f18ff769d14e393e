"""The engine that runs an optimizer's per-leaf maths over a parameter tree.

An optimizer writes its rule for one leaf, `rule(g, p, *moments) -> (u, *moments)`,
on arrays already cast to the compute dtype (at least float32). `map_leaves` does the
rest once for everybody: it pairs every float parameter with its gradient and state,
skips leaves whose gradient is `None` (their state is kept as it was), upcasts
low-precision inputs, and casts new state back to the dtype it is stored in (a
block-wise quantized moment, `_storage.QuantizedArray`, is dequantized on load and
quantized again on store).

Each leaf gets its own element-wise code, on purpose: XLA's CPU backend compiles
identical per-leaf fusions once and reuses the kernel, whereas gathering leaves into
flat or stacked buffers needs one slice per leaf to hand the results back, and every
slice (a different offset) is a kernel of its own to compile (benchmarks/README).
With `elementwise=True`, a registered backend may run the rule on the leaves it
takes (`_backend.AbstractBackend.leaf_kernels`): the native CPU kernels run it as
one C loop per float32 leaf in the steps that write in place, fused with the apply
inside `step` (`map_leaves(..., apply=True)` returns the new parameters); results
agree to rounding.
"""

import abc
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, PyTree

from . import _backend
from ._base import AbstractTransform, Grads, Params, Updates
from ._checks import leaf_mismatch
from ._fields import values_at
from ._jax_api import is_tracer
from ._masks import decay_flags
from ._moments import FieldRef, field_name, moment_like
from ._storage import load, store
from ._tree import (
    align_grads,
    apply_update,
    compute_dtype,
    increment,
    is_float_leaf,
    leaf_paths,
    zero_step,
)
from ._types import RuleState

LeafRule = Callable[..., tuple[Array, ...]]


class _LeafError(Exception):
    """What is wrong with what a rule returned for one leaf (`map_leaves` adds
    the rule's name and the leaf's path)."""


def map_leaves(
    rule: LeafRule,
    grads: PyTree,
    params: PyTree,
    moments: Sequence[PyTree] = (),
    *,
    elementwise: bool = False,
    flags: Sequence[Any] | None = None,
    apply: bool = False,
) -> tuple[PyTree, tuple[PyTree, ...]]:
    """Applies `rule` to every float leaf of `params` that has a gradient.

    **Arguments:**

    - `rule`: `rule(g, p, *moment_leaves) -> (update, *new_moment_leaves)`, called
      with float arrays in the compute dtype.
    - `grads`: gradients with the structure of `params` (`None` allowed).
    - `params`: the parameters.
    - `moments`: state trees shaped like `params` (`None` at non-float leaves).
    - `elementwise`: promise that `rule` treats every element on its own (no norms,
      reductions or shape-dependent maths). The engine may then run it as a native
      loop over the elements; the promise is checked (a rule that reads a leaf's
      shape or size keeps XLA's code), and the results are the same.
    - `flags`: optional hashable Python values, one per leaf of `params` (in
      `jax.tree.leaves` order, such as a resolved weight-decay mask); each is passed
      to `rule` as its last argument. Leaves are only ever grouped with leaves of the
      same flag.
    - `apply`: return the new parameters instead of the updates (`p + update` in
      `p`'s dtype; `p` where there is no update), formed in the same pass as the
      updates where the native kernels run (an optimizer's `transform_step`).

    **Returns:** `(updates, new_moments)`: updates in the compute dtype (`None` where
    there is no update), or the new parameters with `apply`; and each moment tree
    with its stored dtypes.
    """
    param_leaves, param_def = jax.tree.flatten(params)
    grad_leaves = align_grads(grads, params)
    # Moment trees hold None at non-float leaves, so they flatten up to params.
    moment_leaves = [param_def.flatten_up_to(m) for m in moments]
    updates: list[Any] = []
    new_moments: list[list[Any]] = [[] for _ in moments]
    # A backend's kernels (the native CPU kernels, in steps that write in place),
    # for the leaves they take; XLA's code for the rest.
    kernels = None
    no_kernels = _backend.NOT_ELEMENTWISE
    if (backend := _backend.active()) is None:
        no_kernels = "the native kernels are not in use"
    elif elementwise:
        kernels = backend.leaf_kernels(rule, len(moments), apply, grad_leaves)
        no_kernels = "the kernels run only in steps that write in place"

    def xla_leaf(g: Any, p: Any, old: list[Any], flag: Any) -> tuple[Any, list[Any]]:
        # XLA's code for one leaf: its update (or new parameter with `apply`) and
        # new moments, stored as the old ones are.
        dtype = compute_dtype(p.dtype)
        args = [g.astype(dtype), p.astype(dtype), *(load(m, dtype) for m in old)]
        outs = rule(*args) if flags is None else rule(*args, flag)
        if not isinstance(outs, tuple) or len(outs) != 1 + len(old):
            got = len(outs) if isinstance(outs, tuple) else type(outs).__name__
            raise _LeafError(
                f"returned {got} values, not the update and one new value per "
                f"moment ({1 + len(old)})"
            )
        if apply:  # before the apply, which would broadcast another shape
            why = leaf_mismatch(outs[0], p, exact=False)
            if why is not None:
                raise _LeafError(f"returned an update {why}")
        new = [store(value, stored) for value, stored in zip(outs[1:], old)]
        return (apply_update(outs[0], p) if apply else outs[0]), new

    # Inside a trace: traced once per kind of leaf (shapes, dtypes, flag: `jax.jit`
    # caches it) and that trace called on every leaf of the kind; XLA inlines the
    # calls, so the program is the one a trace per leaf makes, which took most of a
    # step's trace and lowering. (Outside one, each map would compile it anew.)
    per_kind = jax.jit(xla_leaf, static_argnums=3)
    for i, (g, p) in enumerate(zip(grad_leaves, param_leaves)):
        old = [m[i] for m in moment_leaves]
        if g is None or not is_float_leaf(p):
            updates.append(p if apply else None)
            for column, value in zip(new_moments, old):
                column.append(value)
            continue
        flag = None if flags is None else flags[i]
        if kernels is not None:
            why = kernels.refusal(g, p, old)
            if why is None:
                try:
                    kernels.add(i, g, p, old, () if flags is None else (flag,))
                except _backend.NotLowered as error:
                    why = str(error)
                else:
                    _backend.report(rule, p, None)
                    updates.append(None)  # filled in from `kernels.finish()` below
                    for column in new_moments:
                        column.append(None)
                    continue
            _backend.report(rule, p, why)
        elif _backend.recording:
            _backend.report(rule, p, no_kernels)
        run = per_kind if is_tracer(g) else xla_leaf
        try:
            out, new = run(g, p, old, flag)
        except _LeafError as error:
            path = leaf_paths(params)[i]
            raise TypeError(
                f"{_backend.rule_name(rule)} {error} for params{path} "
                f"({p.dtype}{list(p.shape)})"
            ) from None
        updates.append(out)
        for column, value in zip(new_moments, new):
            column.append(value)
    if kernels is not None:
        for i, result in kernels.finish().items():
            updates[i] = result.param if apply else result.update
            for column, value in zip(new_moments, result.moments):
                column[i] = value
    return (
        param_def.unflatten(updates),
        tuple(param_def.unflatten(column) for column in new_moments),
    )


class AbstractEngineTransform(AbstractTransform):
    """A transform whose per-leaf work runs through `map_leaves`, written once as
    `run(grads, state, params, *, apply, **extra) -> (out, new_state)`: with
    `apply=False` it is `transform` (`out` is the updates), with `apply=True` it is
    `transform_step` (`out` is the new parameters, `map_leaves(..., apply=True)`), so
    that a `step` can form each new parameter in the pass that makes its update."""

    @abc.abstractmethod
    def run(
        self, grads: Grads, state: Any, params: Params, *, apply: bool
    ) -> tuple[Any, Any]:
        """See the class docstring."""

    def transform(
        self, grads: Grads, state: RuleState, params: Params, **extra: Any
    ) -> tuple[Updates, RuleState]:
        return self.run(grads, state, params, apply=False, **extra)

    def transform_step(
        self, grads: Grads, state: RuleState, params: Params, **extra: Any
    ) -> tuple[Params, RuleState]:
        if type(self).transform is not AbstractEngineTransform.transform:
            # A subclass that rewrote `transform` itself (rather than `run`): its
            # updates, applied as usual.
            return super().transform_step(grads, state, params, **extra)
        return self.run(grads, state, params, apply=True, **extra)


_Opt = TypeVar("_Opt", bound="AbstractLeafwiseOptimizer")


class AbstractLeafwiseOptimizer(AbstractEngineTransform):
    """The base of an optimizer whose maths is one rule per parameter leaf, over a
    few params-shaped pieces of state (its moments). eqxopt's SGD, Adam family,
    Lion, Adagrad, RMSProp and most others are this: their fields, a few class
    attributes and a `leaf` method of a few lines.

    A subclass declares:

    - its options as fields, with the field helpers (`learning_rate_field`,
      `hyper`, `mask_field`, `dtype_field`, ...), which validate them and make
      them arrays (so new values never recompile);
    - `state_type`: its state module, with a `step` field (the number of updates
      done) and one field per moment;
    - `moments`: a tuple of `Moment` declarations, in the order `leaf` takes them:
      each refers to its storage option, says whether it is never negative, what
      it starts at;
    - `decay_mask` (optional): the `mask_field` that selects the leaves `leaf` is
      told to decay (`decayed`), referred to as the field itself (`decay_mask =
      mask` in the class body that declares `mask`, or
      `extend.fields_of(Base).mask`);
    - `decoupled_decay` (optional): the field holding the rate of a decoupled
      weight decay, referred to likewise: a promise that at the decayed leaves
      `leaf` adds exactly `-learning_rate * rate * p` to the update it gives
      undecayed (`split_decoupled_decay`; wrappers such as `Cautious` then leave
      the decay alone);
    - `elementwise`: whether `leaf` treats every element on its own (no norms, no
      reductions, nothing that depends on the leaf's shape), which lets a backend
      such as the native CPU kernels run it (and a packed model, `eqxopt.pack`,
      be stepped with it: `init` refuses one otherwise);
    - `leaf(h, t, g, p, *moments[, flag]) -> (update, *new_moments)`: the rule for
      one leaf, on arrays in the compute dtype (at least float32). `h` is the
      optimizer itself at this step (`step_values`): each hyperparameter is its
      value there (`h.learning_rate`, `h.b1`, ...: scalar arrays, schedules
      already evaluated), every other field as it is, and the `step_value()`
      fields that `step_values` computes once per step; `t` is the step count
      after this update (`step + 1`, for bias corrections); `flag` (with
      `decay_mask`, or where `leaf_flags` is overridden) is this leaf's flag, a
      bool `decayed` by default. Its parameters are checked when the class is
      made.

    The engine does the rest: creating and storing the state (dtypes, 8-bit and
    4-bit storage, placement on a mesh), `None` gradients, low-precision
    parameters, the checks, `update`/`step`, the fused apply and the native
    kernels.

    **Example:** SGD with momentum and decoupled weight decay, in full (see the
    documentation's "Writing an optimizer" page for more):

    ```python
    import equinox as eqx
    from jaxtyping import Array, Int, PyTree
    from eqxopt import extend


    class MomentumState(eqx.Module):
        step: Int[Array, ""]
        velocity: PyTree


    class DecayedMomentum(extend.AbstractLeafwiseOptimizer):
        learning_rate: extend.ScalarOrSchedule = extend.learning_rate_field()
        momentum: extend.ScalarOrSchedule = extend.hyper(0.9, low=0.0, high=1.0)
        weight_decay: extend.ScalarOrSchedule = extend.weight_decay_field(0.0)
        mask: extend.MaskLike = extend.mask_field()
        velocity_dtype: extend.StorageLike = extend.dtype_field(storage=True)

        state_type = MomentumState
        moments = (extend.Moment("velocity", dtype=velocity_dtype),)
        decay_mask = mask
        decoupled_decay = weight_decay
        elementwise = True

        def leaf(self, h, t, g, p, v, decayed):
            v = h.momentum * v + g
            u = -h.learning_rate * v
            if decayed:
                u = u - h.learning_rate * h.weight_decay * p
            return u, v
    ```
    """

    learning_rate: eqx.AbstractVar[Any]
    state_type: eqx.AbstractClassVar[type[eqx.Module]]
    elementwise: eqx.AbstractClassVar[bool]
    # The mask field whose leaves `leaf` is told to decay, or `None`.
    decay_mask: ClassVar[FieldRef | None] = None
    # The field holding the rate of a decoupled weight decay, or `None`: a promise
    # that, at the leaves `decay_mask` selects (all without one), `leaf` adds
    # `-learning_rate * rate * p` (`p` before the step) to the update it would
    # give there undecayed, and reads the rate nowhere else (`split_decoupled_decay`).
    decoupled_decay: ClassVar[FieldRef | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_leaf_signature(cls)

    # The rule for one leaf, `leaf(h, t, g, p, *moments[, flag])`; see the class
    # docstring. (A class variable rather than an abstract method: its parameters
    # follow the class's `moments`, and are checked when the class is made.)
    leaf: eqx.AbstractClassVar[Callable[..., tuple[Array, ...]]]

    def step_values(self: _Opt, step: Int[Array, ""]) -> _Opt:
        """What `leaf` gets as `h` at `step`: this optimizer with every
        hyperparameter at its value there (`values_at`). A subclass may compute
        values there once per step rather than once per leaf (bias corrections,
        ...): it declares each as a `step_value()` field and sets it with
        `extend.replace(h, name=value)`."""
        return values_at(self, step)

    def leaf_flags(self, params: Params) -> list[Any] | None:
        """Per leaf of `params`, the hashable flag `leaf` receives as its last
        argument, or `None` (it takes none). By default: with a `decay_mask`,
        whether each leaf is in it (a bad mask raises here, naming it)."""
        if self.decay_mask is None:
            return None
        name = field_name(self.decay_mask)
        return decay_flags(getattr(self, name), params, name)

    def init(self, params: Params) -> Any:
        self.leaf_flags(params)  # a bad mask fails here, not mid-training
        moments = {m.name: moment_like(self, params, m) for m in self.moments}
        return self.state_type(step=zero_step(), **moments)  # pyright: ignore

    def run(
        self, grads: Grads, state: Any, params: Params, *, apply: bool
    ) -> tuple[Any, Any]:
        # The engine's run over the leaves; a subclass may override it to add
        # checks or per-step values that need the state, calling `super().run`.
        h = self.step_values(state.step)
        t = increment(state.step)
        out, new = map_leaves(
            functools.partial(self.leaf, h, t),
            grads,
            params,
            tuple(getattr(state, m.name) for m in self.moments),
            elementwise=self.elementwise,
            flags=self.leaf_flags(params),
            apply=apply,
        )
        names = [m.name for m in self.moments]
        return out, self.state_type(step=t, **dict(zip(names, new)))  # pyright: ignore


def check_leaf_signature(cls: type) -> None:
    """Raises `TypeError` when `cls` is made if its `leaf` cannot take what the
    engine passes: `h`, `t`, `g`, `p`, one argument per moment and, with a
    `decay_mask` (or `leaf_flags` overridden), the leaf's flag. Where `moments`
    depends on the options (a property), only the first four are checked."""
    leaf = cls.__dict__.get("leaf")
    if leaf is None or getattr(leaf, "__isabstractmethod__", False):
        return
    moments = getattr(cls, "moments", None)
    names = ["h", "t", "g", "p"]
    if isinstance(moments, tuple):
        names += [m.name for m in moments]
        flagged = cls.decay_mask is not None or (
            cls.leaf_flags is not AbstractLeafwiseOptimizer.leaf_flags
        )
        if flagged:
            names.append("decayed" if cls.decay_mask is not None else "flag")
    else:
        flagged = None
    parameters = list(inspect.signature(leaf).parameters.values())[1:]
    positional = [
        q for q in parameters if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)
    ]
    variadic = any(q.kind is q.VAR_POSITIONAL for q in parameters)
    required = [q for q in positional if q.default is q.empty]
    count = len(names)
    fits = len(required) <= count and (variadic or len(positional) >= count)
    if flagged is None:  # moments set by the options: check the first four
        fits = variadic or len(positional) >= 4
    if not fits:
        given = ", ".join(["self", *(q.name for q in parameters)])
        wanted = ", ".join(["self", *names])
        raise TypeError(
            f"{cls.__name__}.leaf({given}) cannot take what the engine passes: "
            f"leaf({wanted}), that is h (the optimizer at this step), t (the step "
            "count after this update), g and p (the leaf's gradient and "
            "parameter), one argument per Moment in `moments`, in order"
            + (", then the leaf's flag" if flagged else "")
        )


def split_decoupled_decay(
    opt: AbstractTransform, grads: Grads, state: Any, params: Params
) -> tuple[AbstractTransform, list[Any]] | None:
    """An optimizer's update split into the part its decoupled weight decay adds
    and the rest, for wrappers that change an update but leave its decay alone
    (`Cautious`).

    **Returns:** `None` unless `opt` is an `AbstractLeafwiseOptimizer` that declares
    `decoupled_decay`. Otherwise `(undecayed, decay)`: `undecayed` is `opt` with the
    decay's rate set to 0 (same state, same moments), and `decay`, per leaf of
    `params` in `jax.tree.leaves` order, the decay's update at `state.step`,
    `-learning_rate * rate * p` in the compute dtype, `None` where `opt` gives no
    update or does not decay. `undecayed`'s update plus `decay` is `opt`'s update.
    """
    if not isinstance(opt, AbstractLeafwiseOptimizer) or opt.decoupled_decay is None:
        return None
    name = field_name(opt.decoupled_decay)
    h = opt.step_values(state.step)
    rate = getattr(h, name)
    flags = opt.leaf_flags(params)
    decay = []
    for i, (g, p) in enumerate(
        zip(align_grads(grads, params), jax.tree.leaves(params))
    ):
        decayed = flags is None or flags[i]
        if g is None or not is_float_leaf(p) or not decayed:
            decay.append(None)
        else:
            decay.append(-h.learning_rate * (rate * p.astype(compute_dtype(p.dtype))))
    # A rate of 0 adds `0 * p` where `leaf` decays: the undecayed update exactly.
    value = getattr(opt, name)
    zero = jnp.zeros_like(value) if eqx.is_array(value) else jnp.zeros((), jnp.float32)
    undecayed = eqx.tree_at(lambda o: getattr(o, name), opt, zero)
    return undecayed, decay
