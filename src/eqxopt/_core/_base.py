"""The contract every optimizer and gradient transform shares."""

import abc
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Inexact, PyTree, jaxtyped

from . import _backend, _dispatch, _placement
from ._checks import (
    Renamed,
    check_grads,
    check_outputs,
    check_state,
    name_converters,
    refuse_renamed,
    renames,
)
from ._jax_api import holds_tracer, is_tracer
from ._moments import Moment, check_declarations
from ._placement import placing_init, raise_if_misplaced
from ._structure import state_shaped_leaves
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

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The program this call would run, lowered (`jax.jit`'s `lower`), for the
        same arguments: `.compile()` it to read XLA's `memory_analysis()` or the
        optimized HLO (`.as_text()`)."""
        lower = self.func.lower  # pyright: ignore[reportFunctionMemberAccess]
        return lower(*self.args, *args, **kwargs)


jax.tree_util.register_pytree_node(
    _Bound,
    lambda b: ((b.args, b.keywords), b.func),
    lambda func, children: _Bound(func, *children[0], **children[1]),
)


# What the public methods take and return. Parameters may hold anything (activation
# functions, integer buffers, `None` where a model was filtered); gradients and
# updates hold float arrays or `None`. That the three share one structure, leaf for
# leaf (`None` where a leaf has no gradient or gets no update), is checked by
# `check_grads` and `check_outputs`, which name the leaf where the trees part: a
# jaxtyping structure name cannot say it, since it reads `None` as a leaf in a tree
# of `Inexact | None` and as no leaf in a tree of `Any`.
Params = PyTree[Any]
_FloatOrNone = Inexact[Array, "..."] | None  # pyright: ignore[reportOperatorIssue]
Grads = PyTree[_FloatOrNone]
Updates = PyTree[_FloatOrNone]
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

    Two declarations say what a transform needs from its caller: `reads_params`
    (what of its rule reads the parameters, or `None`: `update` may then be called
    without them), and `renamed_arguments` (its optax counterpart's spellings of
    its arguments, refused with eqxopt's spelling).
    """

    # What of this transform's own rule reads the parameters, in words (named in
    # the error of an `update` without them), or `None` where it reads none.
    # Options that read them only when set (weight decay) say so in their field
    # (`_fields.weight_decay_field`) instead. A transform that declares nothing
    # needs them.
    reads_params: ClassVar[str | None] = "update rule"

    # optax's spelling of an argument -> eqxopt's (`_checks.refuse_renamed`).
    renamed_arguments: ClassVar[Mapping[str, Renamed]] = renames()

    # What this transform's own maths (not that of the transforms it holds)
    # reduces over, read where the leaves are laid out otherwise than the model's
    # (`eqxopt.pack`'s buffers, ZeRO-1's shards): "nothing" (each element on its
    # own), "tree" (also sums over the whole tree, as a global norm does: the
    # same numbers to rounding however the leaves are cut) or "leaf" (it reduces
    # over each leaf, reads a leaf's shape, or draws random numbers per leaf).
    # A per-leaf rule declared `elementwise` reduces over nothing (`reduction`).
    reduces_over: ClassVar[str] = "leaf"

    # Whether `transform` takes per-example gradients: each with a leading batch
    # axis before its parameter's shape, as `jax.vmap(jax.grad(loss))` gives
    # (`DifferentiallyPrivateAggregate`). The input checks then expect that axis.
    per_example: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        refuse_renamed(cls, kwargs)
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name_converters(cls)  # field converters name their field in errors
        check_declarations(cls)  # the fields that `moments` and masks name exist
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
        transform = _typechecked(type(self).transform, _state_type(type(self)))
        updates, new_state = transform(self, grads, state, params, **extra)
        return apply_updates(params, updates), new_state

    def reduction(self) -> str:
        """What this transform's own maths reduces over (`reduces_over`):
        `"nothing"` where its class declares `elementwise = True`."""
        if getattr(type(self), "elementwise", None) is True:
            return "nothing"
        return self.reduces_over

    def takes_per_example_grads(self) -> bool:
        """Whether `update`/`step` take per-example gradients (a leading batch axis
        on every gradient): by default the class's `per_example`; a `Chain`
        answers for its first link."""
        return self.per_example

    def params_needed(self) -> str | None:
        """What of this transform reads the parameters, as an error names it
        (`"AdamW's weight_decay"`), or `None`: then `update(grads, state)` may leave
        them out, with the same results. Wrappers also ask the transforms they
        hold."""
        name = type(self).__name__
        if self.reads_params is not None:
            return f"{name}'s {self.reads_params}"
        for field in dataclasses.fields(self):
            converter = field.metadata.get("converter")
            if getattr(converter, "reads_params", False) and not _is_off(
                getattr(self, field.name)
            ):
                return f"{name}'s {field.name}"
        return None

    @_fast_method
    def update(
        self,
        grads: Grads,
        state: State,
        params: Params = None,
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
        - `params`: the current parameters. As in optax they may be left out
          where the transform does not read them (`params_needed()` is `None`:
          SGD, Adam, AdaBelief, clipping, ...): the updates are then the same, in
          the gradients' dtypes. Where it does (weight decay, trust ratios,
          parameter-free step sizes, ...), leaving them out is a `TypeError`
          naming the option that reads them.
        - `donate`: let XLA reuse the buffers of `state` for the new state. The
          state passed in must not be used afterwards. Such in-place steps of
          element-wise optimizers run eqxopt's native CPU kernels where they are
          available (`eqxopt.native_kernels_available()`). Inside your own `jit`,
          donate its arguments too, or XLA copies them first.
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

    # The params-shaped pieces of the state (`Moment`: its storage option, its
    # sign, its start), the one declaration every storage choice reads
    # (`_moments.moment_like` makes every moment).
    moments: ClassVar[tuple[Moment, ...]] = ()

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
        parameter's dtype). `params` may be left out as for `update`; keyword
        arguments this transform does not take are dropped, as optax does for extra
        arguments."""
        optax = optax_module()

        def init(params):
            return self.init(params)

        def update(updates, state, params=None, **extra):
            taken = {k: v for k, v in extra.items() if self.takes_keyword(k)}
            return self.update(updates, state, params, **taken)

        return optax.GradientTransformationExtraArgs(init, update)


def checked_transform(name: str, value: Any) -> AbstractTransform:
    """`value` if it is an eqxopt transform, else a `TypeError` naming `name` (with
    the way in for an optax transformation: `eqxopt.from_optax`)."""
    if not isinstance(value, AbstractTransform):
        hint = ""
        if type(value).__name__.startswith("GradientTransformation"):
            hint = "; wrap an optax transformation as eqxopt.from_optax(tx)"
        raise TypeError(
            f"{name} must be an eqxopt transform (such as eqxopt.AdamW(...)), got "
            f"{type(value).__name__}{hint}"
        )
    return value


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


def _is_off(value: Any) -> bool:
    # An option that reads the parameters only when set: off when it is `None`,
    # `False` or a concrete zero (a schedule or a traced value may be anything).
    if value is None or value is False:
        return True
    if isinstance(value, jax.Array) and not is_tracer(value):
        return value.ndim == 0 and not bool(value)
    return False


def _check_params_given(opt: AbstractTransform) -> None:
    needed = opt.params_needed()
    if needed is not None:
        raise TypeError(
            f"{type(opt).__name__}.update(grads, state) was called without params, "
            f"which are read by {needed}: call update(grads, state, params)"
        )


def _check_donate(donate: Any) -> None:
    # A truthy string or number would silently pick in-place steps (or not).
    if type(donate) is not bool:
        raise TypeError(f"donate must be a bool, got {donate!r}")


class _EntryKey(NamedTuple):
    """What selects an entry's compiled program besides its arguments.

    - `step`: `step` (new parameters) rather than `update` (updates).
    - `donated`: `donate=True`: the outputs may overwrite the inputs.
    - `grads_given`: the gradients are arrays passed in (not computed in the
      program being compiled), which the backend's kernels need not wait for.
    - `shardings`: the concrete inputs' shardings where they span several devices
      (`_placement.signature`), for placing the outputs on Auto meshes.
    - `backend_placement`: the backend's static data of where a donated call's
      inputs live (`_backend.AbstractBackend.placement`).
    """

    step: bool
    donated: bool
    grads_given: bool
    shardings: Any
    backend_placement: Any


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
    try:
        return _dispatch.call(
            *_entry_call(opt, step, grads, state, params, donate, extra)
        )
    except ValueError as error:
        raise_if_misplaced(error, opt, grads, state, params)
        raise


def _entry_call(
    opt: AbstractTransform,
    step: bool,
    grads: Grads,
    state: State,
    params: Params,
    donate: bool,
    extra: dict[str, Any],
) -> tuple[Any, ...]:
    """The arguments of `_dispatch.call` (or `lower`) for one entry call."""
    _check_donate(donate)
    if params is None and not step:
        _check_params_given(opt)
    first, second = (params, state) if step else (state, params)
    # Where the inputs live (`None` in a process of one device), read once for the
    # outputs' placement and the backend.
    inputs = _placement.read(grads, params, state, donated=donate)
    backend_placement = None
    if donate and inputs is not None:
        backend = _backend.active()
        if backend is not None:
            backend_placement = backend.placement(inputs.leaves, inputs.shardings)
    key = _EntryKey(
        step,
        donate,
        donate and not holds_tracer(grads),
        _placement.signature(inputs),
        backend_placement,
    )
    extra = _numbers_as_arrays(extra) if extra else extra
    # The donated buffers: state (`update`), params and state (`step`).
    donated = ((2, 3) if step else (2,)) if donate else ()
    return _entry, key, (opt, grads, first, second, extra), donated


def _lowering(step: bool) -> Callable[..., Any]:
    def lower(
        opt: AbstractTransform,
        grads: Grads,
        state: State,
        params: Params,
        *,
        donate: bool = False,
        **extra: Any,
    ) -> Any:
        return _dispatch.lower(
            *_entry_call(opt, step, grads, state, params, donate, extra)
        )

    return lower


AbstractTransform.update.lower = _lowering(False)  # pyright: ignore
AbstractTransform.step.lower = _lowering(True)  # pyright: ignore


def _numbers_as_arrays(extra: dict[str, Any]) -> dict[str, Any]:
    # A Python number would be a static cache key (a recompile per new loss value);
    # as a (strongly typed) array it is traced. Bools stay static: they are switches.
    def convert(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        return jnp.asarray(v, dtype=float if isinstance(v, float) else int)

    return {k: convert(v) for k, v in extra.items()}


def _state_type(cls: type) -> Any:
    """The state class an optimizer declares (`state_type`, as the per-leaf engine's
    optimizers do), or `None`."""
    state_type = getattr(cls, "state_type", None)
    return state_type if isinstance(state_type, type) else None


def _annotated(method: Callable, hints: dict, state_type: type) -> Callable:
    """`method` with its `state` (and the state it returns) annotated as
    `state_type`."""

    def checked(self, grads, state, params, **extra):
        return method(self, grads, state, params, **extra)

    returns = hints.get("return", tuple[Any, Any])
    args = getattr(returns, "__args__", None)
    if args is not None and len(args) == 2:
        returns = tuple[args[0], state_type]  # pyright: ignore
    checked.__annotations__ = {**hints, "state": state_type, "return": returns}
    checked.__name__ = getattr(method, "__name__", "transform")
    checked.__qualname__ = getattr(method, "__qualname__", checked.__name__)
    checked.__module__ = getattr(method, "__module__", __name__)
    return checked


@functools.cache
def _typechecked(method: Callable, state_type: type | None = None) -> Callable:
    """`method` (a transform's `transform` or `transform_step`) checked by
    jaxtyping and beartype against its annotations; where it takes the state as
    any `State` and the class declares its `state_type`, against that class: a
    state of another optimizer is a `TypeCheckError` naming `state`."""
    hints = getattr(method, "__annotations__", {})
    if state_type is not None and hints.get("state", State) in (State, Any):
        method = _annotated(method, hints, state_type)
    return jaxtyped(typechecker=beartype)(method)


class _NoParameter:
    """Where a stand-in for the parameters has a leaf whose gradient is `None`: a
    leaf that is not an array (as an Equinox model's activation functions are),
    so the stand-in has the parameters' structure and gets no update there."""

    def __repr__(self) -> str:
        return "<no parameter given>"


_NO_PARAMETER = _NoParameter()


def _stand_in(grads: Grads, per_example: bool = False, state: State = None) -> Params:
    """For an `update` called without params (whose transform reads none): zeros
    shaped like the gradients (like one example's, for per-example gradients).
    Where a gradient is `None`, zeros shaped like the state's moment there (the
    leaf is a float parameter the state covers: it keeps its state, as with the
    parameters), else a non-array leaf. Every rule then runs as with the
    parameters (a weight decay of 0 times zeros is 0, whatever the parameters
    hold) and returns updates in the gradients' dtypes."""

    def zeros(g: Any) -> Any:
        return jnp.zeros(g.shape[1:] if per_example else g.shape, g.dtype)

    covered = iter(state_shaped_leaves(grads, state))

    def stand_in(g: Any) -> Any:
        moment = next(covered)
        if g is not None:
            return zeros(g)
        if moment is None:
            return _NO_PARAMETER
        return jax.tree.map(jnp.zeros_like, moment)

    return jax.tree.map(stand_in, grads, is_leaf=lambda g: g is None)


def _checked(
    method: Callable,
    opt: AbstractTransform,
    grads: Grads,
    state: State,
    params: Params,
    extra: dict[str, Any],
    params_given: bool = True,
) -> Any:
    # Our own checks first: they name the leaf; jaxtyping's would not.
    per_example = type(opt).__name__ if opt.takes_per_example_grads() else None
    check_grads(grads, params, per_example)
    try:
        check_state(opt, state, params)
    except (TypeError, ValueError) as error:
        if params_given:
            raise
        raise type(error)(
            f"{error} (update was called without params, so the state is checked "
            "against the gradients: a float parameter whose gradient is None still "
            "has state; call update(grads, state, params))"
        ) from None
    with promotion_for(params, grads):
        out, new_state = _typechecked(method, _state_type(type(opt)))(
            opt, grads, state, params, **extra
        )
    check_outputs(opt, method.__name__, out, params)
    return out, new_state


# XLA pairs donated input buffers with outputs of the same shape in order, so the
# entry returns its outputs in the order of the donated inputs (state first for
# `update`, params then state for `step`); otherwise a new `mu` could be written into
# the buffer of the old `nu` and XLA would add full-size copies to undo it. It places
# its outputs like the inputs they replace (`_placement.keep`), so that a state
# sharded unlike its parameters (ZeRO-1) leaves every parameter's sharding alone and
# donated buffers are reused.


def _entry(key: _EntryKey, opt, grads, first, second, extra):
    params, state = (first, second) if key.step else (second, first)
    params_given = params is not None
    if not params_given:  # `update(grads, state)`: `params_needed()` said none read
        params = _stand_in(grads, opt.takes_per_example_grads(), state)
    method = type(opt).transform_step if key.step else type(opt).transform
    backend = _backend.active()

    def run(opt, grads, params, state, extra, backend_placement):
        if backend is None:
            return _checked(method, opt, grads, state, params, extra, params_given)
        trace = _backend.EntryTrace(
            key.donated, key.grads_given, backend_placement, (grads, params, state)
        )
        with backend.tracing(trace):
            return _checked(method, opt, grads, state, params, extra, params_given)

    # On a mesh of Explicit axes the maths runs with them made Auto, and a donated
    # step inside a user's jit reads where its inputs lie from their types.
    backend_placement = key.backend_placement
    mesh = _placement.explicit_mesh((grads, params, state))
    if mesh is None:
        new, new_state = run(opt, grads, params, state, extra, backend_placement)
    else:
        if backend is not None and key.donated and backend_placement is None:
            backend_placement = backend.typed_placement(
                jax.tree.leaves((grads, params, state)), mesh
            )
        new, new_state = _placement.on_auto_axes(
            run, mesh, opt, grads, params, state, extra, backend_placement
        )
    on_params, on_state = key.shardings or (None, None)
    new_state = _placement.keep(new_state, state, on_state)
    if key.step:
        return _placement.keep(new, params, on_params), new_state
    return new_state, _placement.keep(cast_like(new, params), params, on_params)
