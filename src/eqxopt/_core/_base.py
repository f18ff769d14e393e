"""The contract every optimizer and gradient transform shares."""

import abc
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import PyTree, jaxtyped

from .._native import _compat
from . import _dispatch, _placement, _seam
from ._checks import check_grads, check_state, name_converters
from ._placement import placing_init, raise_if_misplaced
from ._tree import apply_updates, cast_like, promotion_for


class _fast_method:
    """A method whose bound form is a `functools.partial` of the module, registered
    as a pytree.

    Equinox wraps every bound method of a module in a `BoundMethod` module when the
    attribute is read, which cost more (about 0.3 ms) than all the rest of a direct
    `opt.step(...)` call on a small tree. The partial is just as much a pytree (the
    module's arrays stay leaves, as with `jax.tree_util.Partial`, so
    `eqx.filter_jit(opt.step)` still traces them) and costs well under a
    microsecond to make. Read on the class, the plain function comes back (for
    `help` and documentation tools).
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self.fn
        return _Bound(self.fn, obj)


class _Bound(functools.partial):
    """`functools.partial` (made in C) registered as a pytree, like
    `jax.tree_util.Partial`, whose Python `__new__` costs more."""


jax.tree_util.register_pytree_node(
    _Bound,
    lambda b: ((b.args, b.keywords), b.func),
    lambda func, children: _Bound(func, *children[0], **children[1]),
)


# What the public methods take and return. Parameters may hold anything (activation
# functions, integer buffers); gradients and updates hold float arrays or `None`.
Params = PyTree[Any]
Grads = PyTree[Any]
Updates = PyTree[Any]
State = PyTree[Any]


class AbstractTransform(eqx.Module):
    """Base of every optimizer and gradient transform in eqxopt.

    A transform implements two methods:

    - `init(params) -> state`: the initial state for a parameter tree.
    - `transform(grads, state, params) -> (updates, state)`: the pure update rule. Its
      updates are full precision (at least float32) and `None` where a leaf gets no
      update; it does no checking and no dispatch.

    and inherits the public entry points, which check their inputs at trace time and
    run compiled:

    - `update(grads, state, params) -> (updates, state)`, optax-compatible: updates
      are deltas in each parameter's dtype, to be added with `eqxopt.apply_updates`
      (or `eqx.apply_updates`).
    - `step(grads, state, params) -> (params, state)`: the update and its
      application fused in one compiled function, keeping parameter dtypes.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name_converters(cls)  # field converters name their field in errors
        # State that no parameter shapes goes where the parameters are.
        init = cls.__dict__.get("init")
        if init is not None and not getattr(init, "__isabstractmethod__", False):
            cls.init = placing_init(init)

    @abc.abstractmethod
    def init(self, params: Params) -> State:
        """The initial state for `params` (any pytree; only float leaves count)."""

    @abc.abstractmethod
    def transform(
        self, grads: Grads, state: State, params: Params
    ) -> tuple[Updates, State]:
        """The unchecked update rule; see the class docstring. Rules that need more
        than gradients (such as `value=`, the loss) add keyword-only arguments with
        defaults and name them in `keywords`; `update`/`step` pass their extra
        keywords on."""

    def transform_step(
        self, grads: Grads, state: State, params: Params, **extra: Any
    ) -> tuple[Params, State]:
        """`transform` and the apply: `(new_params, new_state)`, each new parameter
        `p + update` in `p`'s dtype (`p` itself where the update is `None`). `step`
        runs this. A transform that can form its new parameters in the same pass as
        its updates (the per-leaf engine does, for the native kernels) overrides
        it; the results must be the same."""
        # Checked as `update` checks it: a subclass's annotations hold here too.
        transform = _typechecked(type(self).transform)
        updates, new_state = transform(self, grads, state, params, **extra)
        return apply_updates(params, updates), new_state

    @_fast_method
    def update(
        self,
        grads: Grads,
        state: State,
        params: Params,
        *,
        donate: bool = False,
        **extra: Any,
    ) -> tuple[Updates, State]:
        """Computes the updates for one step.

        **Arguments:**

        - `grads`: a tree with the structure of `params`; `None` where a parameter
          has no gradient (as `eqx.filter_grad` gives for non-float leaves). A
          parameter whose gradient is `None` is left alone: no update, no decay, and
          its state stays as it was.
        - `state`: the state from `init` or a previous `update`/`step`.
        - `params`: the current parameters.
        - `donate`: let XLA reuse the buffers of `state` for the new state. The
          state passed in must not be used afterwards. Such in-place steps of
          element-wise optimizers run eqxopt's native CPU kernels (see
          `set_native_kernels`). Inside your own `jit`, donate its arguments too, or
          XLA copies them first.
        - `**extra`: keyword arguments for rules that need more than gradients, such
          as `value=` (the loss) for `PolyakSGD`; see each optimizer. Others reject
          them with a `TypeError`.

        **Returns:** `(updates, new_state)`; each update has its parameter's shape and
        dtype (`None` for leaves that are not updated).
        """
        new_state, updates = _call(self, False, grads, state, params, donate, extra)
        return updates, new_state

    @_fast_method
    def step(
        self,
        grads: Grads,
        state: State,
        params: Params,
        *,
        donate: bool = False,
        **extra: Any,
    ) -> tuple[Params, State]:
        """`update` and the apply in one compiled function.

        **Arguments:** as `update`; with `donate=True` the buffers of `state` and
        `params` are reused for the results, so the step runs in place (neither may
        be used afterwards), as one pass of the native kernels on CPU.

        **Returns:** `(new_params, new_state)`; every parameter keeps its dtype and
        non-float leaves are passed through unchanged.
        """
        return _call(self, True, grads, state, params, donate, extra)

    # The moments of the state that are never negative (Adam's `nu`, an average of
    # squares), by state field name: the one declaration every storage choice
    # reads (`_leafwise.moment_like` makes every moment), so a quantized storage
    # (`Blockwise8bit()`, ...) keeps them in its unsigned map, twice as fine.
    nonnegative_moments: ClassVar[frozenset[str]] = frozenset()

    # The keyword arguments `transform` takes beyond grads, state and params (such
    # as "value", the loss). Wrappers (`Chain`, ...) pass a keyword on only to the
    # transforms whose `takes_keyword` says yes.
    keywords: ClassVar[frozenset[str]] = frozenset()

    def takes_keyword(self, key: str) -> bool:
        """Whether `transform` takes the keyword argument `key`: by default, whether
        `key` is in the class's `keywords`. Wrappers ask the transforms they hold;
        a transform whose keywords depend on its options says so here."""
        return key in self.keywords

    def to_optax(self) -> Any:
        """This transform as an `optax.GradientTransformationExtraArgs` (needs optax):
        `init(params)` and `update(updates, state, params, **extra)` call this
        transform's `init`/`update` (so inputs are checked, and updates come in each
        parameter's dtype). eqxopt transforms need `params`; keyword arguments this
        transform does not take are dropped, as optax does for extra arguments."""
        optax = optax_module()

        def init(params):
            return self.init(params)

        def update(updates, state, params=None, **extra):
            if params is None:
                raise ValueError(
                    f"{type(self).__name__}.to_optax(): eqxopt transforms need "
                    "params; call update(updates, state, params)"
                )
            taken = {k: v for k, v in extra.items() if self.takes_keyword(k)}
            return self.update(updates, state, params, **taken)

        return optax.GradientTransformationExtraArgs(init, update)


def optax_module() -> Any:
    """optax, an optional dependency, imported when a conversion needs it."""
    try:
        import optax
    except ImportError:  # pragma: no cover - optax is installed for the tests
        raise ImportError(
            "optax is not installed; `pip install optax` to convert between eqxopt "
            "and optax"
        ) from None
    return optax


def _check_donate(donate: Any) -> None:
    # A truthy string or number would silently pick in-place steps (or not).
    if type(donate) is not bool:
        raise TypeError(f"donate must be a bool, got {donate!r}")


def _call(
    opt: AbstractTransform,
    step: bool,
    grads: Grads,
    state: State,
    params: Params,
    donate: bool,
    extra: dict[str, Any],
) -> Any:
    """`update` (`step=False`: `(new_state, updates)`) or `step` (`(new_params,
    new_state)`), through its compiled entry."""
    _check_donate(donate)
    first, second = (params, state) if step else (state, params)
    # Where the inputs live, read once for both readers below.
    inputs = _placement.read(grads, params, state, donated=donate)
    # Gradients passed in as arrays are not computed in the step's program, so its
    # native kernels wait for none (`_seam.Entry.grads_given`).
    given = donate and not any(map(_compat.is_tracer, jax.tree.leaves(grads)))
    try:
        return _dispatch.call(
            _placement.entry_for(
                _ENTRIES[step, donate, given], _placement.signature(inputs)
            ),
            (
                opt,
                grads,
                first,
                second,
                _numbers_as_arrays(extra) if extra else extra,
                _seam.placement(inputs),
            ),
            # The donated buffers: state (`update`), params and state (`step`).
            ((2, 3) if step else (2,)) if donate else (),
            # Where Python bools may be: params and the keyword arguments.
            bools=(2, 4) if step else (3, 4),
        )
    except ValueError as error:
        raise_if_misplaced(error, opt, grads, state, params)
        raise


def _numbers_as_arrays(extra: dict[str, Any]) -> dict[str, Any]:
    # A Python number would be a static cache key (a recompile per new loss value);
    # as a (strongly typed) array it is traced. Bools stay static: they are switches.
    def convert(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        return jnp.asarray(v, dtype=float if isinstance(v, float) else int)

    return {k: convert(v) for k, v in extra.items()}


@functools.cache
def _typechecked(method: Callable) -> Callable:
    return jaxtyped(typechecker=beartype)(method)


def _checked(
    method: Callable,
    opt: AbstractTransform,
    grads: Grads,
    state: State,
    params: Params,
    extra: dict[str, Any],
) -> Any:
    # Our own checks first: they name the leaf; jaxtyping's would not.
    check_grads(grads, params)
    check_state(opt, state, params)
    with promotion_for(params, grads):
        return _typechecked(method)(opt, grads, state, params, **extra)


# XLA pairs donated input buffers with outputs of the same shape in order, so each
# entry returns its outputs in the order of the donated inputs (state first for
# `update`, params then state for `step`); otherwise a new `mu` could be written into
# the buffer of the old `nu` and XLA would add full-size copies to undo it.


# Each entry tells the engine, through the seam, whether its outputs may overwrite
# the donated inputs and (donated entries) where the inputs live: `native`, a pytree
# without leaves whose static data keys the compiled step (the native kernels run per
# shard). It places its outputs like the inputs they replace (`_placement.keep`;
# `placement` holds the concrete inputs' shardings where they span several devices),
# so that a state sharded unlike its parameters (ZeRO-1) leaves every parameter's
# sharding alone and donated buffers are reused.


def _entry(
    opt,
    grads,
    first,
    second,
    extra,
    native=None,
    *,
    step,
    donated,
    grads_given=False,
    placement=None,
):
    # `first, second` are the donated inputs' order: `state, params` for `update`,
    # `params, state` for `step`; the outputs come in the same order.
    params, state = (first, second) if step else (second, first)
    method = type(opt).transform_step if step else type(opt).transform
    new, new_state = _seam.traced(
        lambda: _checked(method, opt, grads, state, params, extra),
        in_place=donated,
        placement=native,
        inputs=(grads, params, state),
        grads_given=grads_given,
    )
    on_params, on_state = placement or (None, None)
    new_state = _placement.keep(new_state, state, on_state)
    if step:
        return _placement.keep(new, params, on_params), new_state
    return new_state, _placement.keep(cast_like(new, params), params, on_params)


# The entries, by (step, donated, gradients given as arrays): each its own object, so
# each has its own compiled functions (the dispatcher's caches are keyed by the
# entry). Donated ones come twice: for gradients computed in the caller's trace, and
# for gradients passed in as arrays.
_ENTRIES = {
    (step, donated, given): functools.partial(
        _entry, step=step, donated=donated, grads_given=given
    )
    for step in (False, True)
    for donated, given in ((False, False), (True, False), (True, True))
}
