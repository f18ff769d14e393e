"""The contract every optimizer and gradient transform shares."""

import abc
import dataclasses
import enum
import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped

from . import _backend, _placement, _repr
from ._checks import (
    Renamed,
    check_grads,
    check_outputs,
    check_state,
    name_converters,
    refuse_renamed,
    renames,
)
from ._compile import FilteredJit
from ._jax_api import holds_tracer, is_tracer
from ._moments import Moment, check_declarations
from ._placement import placing_init, raise_if_misplaced
from ._structure import state_shaped_leaves
from ._tree import align_grads, apply_updates, cast_like, promotion_for
from ._types import (
    Extra,
    Grads,
    Params,
    PerExampleGrads,
    RuleState,
    State,
    Updates,
)


class _EntryMethod:
    """How `update` and `step` are methods: read on an instance, the method bound
    to it as a `functools.partial` registered as a pytree (the module's arrays stay
    leaves, so `eqx.filter_jit(opt.step)` traces them), with `.lower`; read on the
    class, the plain function (for `help` and documentation tools).

    Equinox binds a module's own methods by wrapping them in a module made on every
    attribute read; a partial costs far less, and these two are read on every
    step."""

    def __init__(self, call: Callable):
        self.call = call
        self.__doc__ = call.__doc__
        self.__wrapped__ = call

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self.call
        return _BoundEntry(self.call, obj)


class _BoundEntry(functools.partial):
    """`update` or `step` bound to an optimizer (see `_EntryMethod`)."""

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """The program this call would run, lowered (`jax.jit`'s `lower`), for the
        same arguments: `.compile()` it to read XLA's `memory_analysis()` or the
        optimized HLO (`.as_text()`)."""
        step = self.func.__name__ == "step"
        return _call(step, *self.args, *args, lower=True, **kwargs)


jax.tree_util.register_pytree_node(
    _BoundEntry,
    lambda b: ((b.args, b.keywords), b.func),
    lambda func, children: _BoundEntry(func, *children[0], **children[1]),
)


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
        _refuse_missing_fields(cls)
        self = super().__new__(cls)
        # The values a step computes once (`step_value()` fields) are not
        # constructor arguments: `None` until `step_values` sets them.
        for name in _step_value_fields(cls):
            object.__setattr__(self, name, None)
        return self

    # Printed with the values, not Equinox's `f32[]` (`_repr`).
    def __repr__(self) -> str:
        return _repr.pformat(self)

    def __pdoc__(self, **kwargs: Any) -> Any:
        return _repr.pdoc(self, **kwargs)

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
        self, grads: Grads, state: RuleState, params: Params
    ) -> tuple[Updates, RuleState]:
        """The unchecked update rule; see the class docstring. Rules that need more
        than gradients (such as `value=`, the loss) add keyword-only arguments with
        defaults and name them in `keywords`; `update`/`step` pass their extra
        keywords on."""

    def transform_step(
        self, grads: Grads, state: RuleState, params: Params, **extra: Any
    ) -> tuple[Params, RuleState]:
        """`transform` and the apply: `(new_params, new_state)`, each new parameter
        `p + update` in `p`'s dtype (`p` itself where the update is `None`). `step`
        runs this. A transform that can form its new parameters in the same pass as
        its updates (the per-leaf engine does, for the native kernels) overrides
        it; the results must be the same."""
        updates, new_state = self.transform(grads, state, params, **extra)
        # Before the apply, which would broadcast an update of another shape.
        updates = check_outputs(self, False, updates, params)
        return apply_updates(params, updates), new_state

    def reduction(self) -> str:
        """What this transform's own maths reduces over (`reduces_over`):
        `"nothing"` where its class declares `elementwise = True`."""
        if getattr(type(self), "elementwise", None) is True:
            return "nothing"
        return self.reduces_over

    def state_in_host_memory(self) -> bool:
        """Whether this transform keeps (some of) its state in host memory between
        steps (`OffloadState`; wrappers ask the transforms they hold). An `update`
        with `donate=True`, and `make_train_step`'s step, then donate nothing: JAX
        pairs donated buffers with outputs by shape and dtype, not by memory kind,
        and the updates (or the loss) come in device memory beside the new
        state."""
        return False

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

    def _update(
        self,
        grads: Grads,
        state: State,
        params: Params | None = None,
        *,
        donate: bool = False,
        **extra: Extra,
    ) -> tuple[Updates, State]:
        """Computes the updates for one step.

        `update` and `step` are `eqx.filter_jit` methods: their arrays are traced
        and every other leaf (an activation function, a Python number, a string)
        is static, so new hyperparameter values reuse the compiled step, and a
        `eqx.error_if` traced into them raises `eqx.EquinoxRuntimeError`. Their
        annotations are checked by beartype each time they are traced: the
        gradients (and the updates) have the parameters' structure and, leaf by
        leaf, their shapes; the state is this optimizer's state class.

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
        new_state, updates = _call(False, self, grads, state, params, donate, **extra)
        return updates, new_state

    def _step(
        self,
        grads: Grads,
        state: State,
        params: Params,
        *,
        donate: bool = False,
        **extra: Extra,
    ) -> tuple[Params, State]:
        """`update` and the apply in one compiled function (an `eqx.filter_jit`
        method, as `update` is).

        **Arguments:** as `update`; with `donate=True` the buffers of `state` and
        `params` are reused for the results, so the step runs in place (neither may
        be used afterwards), as one pass of the native kernels on CPU.

        **Returns:** `(new_params, new_state)`; every parameter keeps its dtype and
        non-float leaves are passed through unchanged.
        """
        return _call(True, self, grads, state, params, donate, **extra)

    _update.__name__ = "update"
    _update.__qualname__ = "AbstractTransform.update"
    _step.__name__ = "step"
    _step.__qualname__ = "AbstractTransform.step"
    update = _EntryMethod(_update)
    step = _EntryMethod(_step)
    del _update, _step

    # The params-shaped pieces of the state (`Moment`: its storage option, its
    # sign, its start), the one declaration every storage choice reads
    # (`_moments.moment_like` makes every moment).
    moments: ClassVar[tuple[Moment, ...]] = ()

    # The keyword arguments `transform` takes beyond grads, state and params, each
    # with what it is (`Supplied`: the loss, the loss as a function of the
    # parameters, ...). Wrappers (`Chain`, ...) pass a keyword on only to the
    # transforms whose `takes_keyword` says yes, and `make_train_step` supplies
    # those `wanted_keywords` names.
    keywords: ClassVar[Mapping[str, "Supplied"]] = types.MappingProxyType({})

    def takes_keyword(self, key: str) -> bool:
        """Whether `transform` takes the keyword argument `key`: by default, whether
        `key` is in the class's `keywords`. Wrappers ask the transforms they hold;
        a transform whose keywords depend on its options says so here."""
        return key in self.keywords

    def wanted_keywords(self) -> Mapping[str, "Supplied"]:
        """The keyword arguments this transform would be given, by what each one
        is (`Supplied`), for a caller that has them in hand (`make_train_step`):
        by default the class's `keywords`; wrappers add those of the transforms
        they hold."""
        return self.keywords

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


# How to declare a field that a base class requires (`eqx.AbstractVar`), for the
# error of a class that does not.
_DECLARE = {
    "axis_name": "axis_name: extend.AxisName = extend.axis_name_field()",
    "learning_rate": (
        "learning_rate: extend.ScalarOrSchedule = extend.learning_rate_field()"
    ),
}


@functools.cache
def _missing_fields(cls: type) -> tuple[tuple[str, str], ...]:
    """The fields `cls`'s bases require (`eqx.AbstractVar`) that it does not
    declare, each with the base that requires it."""
    # A field, or a class attribute or property of the same name.
    provided = {f.name for f in dataclasses.fields(cls)}
    provided |= {name for base in cls.__mro__ for name in vars(base)}
    missing = []
    for base in cls.__mro__:
        for name, hint in inspect.get_annotations(base).items():
            if typing.get_origin(hint) is eqx.AbstractVar and name not in provided:
                if not any(m == name for m, _ in missing):
                    missing.append((name, base.__name__))
    return tuple(missing)


def _refuse_missing_fields(cls: type) -> None:
    if getattr(cls, "__abstractmethods__", None):
        return  # Equinox refuses a class with abstract methods itself
    missing = _missing_fields(cls)
    if missing:
        lines = "; ".join(
            f"{base} requires the field `{name}`: declare "
            f"`{_DECLARE.get(name, name + ': ... = ...')}`"
            for name, base in missing
        )
        raise TypeError(f"{cls.__name__} cannot be built: {lines}")


@functools.cache
def _step_value_fields(cls: type) -> tuple[str, ...]:
    return tuple(
        f.name for f in dataclasses.fields(cls) if f.metadata.get("step_value", False)
    )


def checked_transform(name: str, value: "AbstractTransform") -> AbstractTransform:
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


class Supplied(enum.Enum):
    """What a keyword argument of a transform's rule is, for a caller that can
    supply it (`make_train_step`): a transform declares its keywords in its class
    attribute `keywords`, each with one of these.

    - `LOSS`: the loss at the current parameters (`value=`).
    - `GRADIENT`: the gradient there (what `grads` is).
    - `LOSS_FUNCTION`: the loss on the step's batch as a function of the
      parameters, `f(params, *args, **kwargs)` (further arguments ignored), for
      a linesearch or a Hessian estimate.
    - `GRAD_FUNCTION`: the gradient of that loss as a function of the parameters,
      for a second gradient at other parameters (SAM's adversarial point).
    - `AUX`: the loss function's auxiliary output (`make_train_step(...,
      has_aux=True)`), for a value only the forward pass computes (the largest
      attention logits `QKClip` reads).
    - `CALLER`: only the caller knows it (data for a `value_fn`, a Hessian
      estimate of its own); never supplied.
    """

    LOSS = "the loss"
    GRADIENT = "the gradient"
    LOSS_FUNCTION = "the loss as a function of the parameters"
    GRAD_FUNCTION = "the gradient as a function of the parameters"
    AUX = "the loss function's auxiliary output"
    CALLER = "a value only the caller has"


def supplies(**keywords: Supplied) -> Mapping[str, Supplied]:
    """A class's `keywords` (read-only): keyword name -> what it is."""
    for key, what in keywords.items():
        if not isinstance(what, Supplied):
            raise TypeError(f"keywords: {key}= must be a Supplied, got {what!r}")
    return types.MappingProxyType(keywords)


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
    """What selects an entry's program besides the arrays it is given (the static
    argument of the compiled entry; a tuple: made and hashed on every call).

    - `step`: `step` (new parameters) rather than `update` (updates).
    - `donated`: `donate=True`: the outputs may overwrite the inputs.
    - `params_given`: `update` was given the parameters.
    - `grads_given`: the gradients are arrays passed in (not computed in the
      program being compiled), which the backend's kernels need not wait for.
    - `shardings`: the concrete inputs' shardings where they span several devices
      (`_placement.signature`), for placing the outputs on Auto meshes.
    - `backend_placement`: the backend's static data of where a donated call's
      inputs live (`_backend.AbstractBackend.placement`).
    - `backend`: the backend in use, so that a program traced with another one
      (native kernels switched off) is not reused.
    """

    step: bool
    donated: bool
    params_given: bool
    grads_given: bool
    shardings: Any
    backend_placement: Any
    backend: Any


def _call(
    step: bool,
    opt: AbstractTransform,
    grads: Grads,
    state: State,
    params: Params | None,
    donate: bool = False,
    lower: bool = False,
    **extra: Extra,
) -> Any:
    """`update` (`step=False`: `(new_state, updates)`) or `step` (`(new_params,
    new_state)`), run through its compiled entry, or with `lower` the program it
    would run, lowered."""
    _check_donate(donate)
    if donate and not step and opt.state_in_host_memory():
        # `update` returns updates shaped like the state's moments, in device
        # memory: a donated host buffer would be paired with one of them.
        donate = False
    params_given = params is not None
    if not params_given:
        if step:
            raise TypeError(
                f"{type(opt).__name__}.step needs params: step(grads, state, params)"
            )
        _check_params_given(opt)
    # Where the inputs live (`None` in a process of one device), read once for the
    # outputs' placement and the backend.
    inputs = _placement.read(grads, params, state, donated=donate)
    backend = _backend.active()
    backend_placement = None
    if donate and inputs is not None and backend is not None:
        backend_placement = backend.placement(inputs.leaves, inputs.shardings)
    key = _EntryKey(
        step,
        donate,
        params_given,
        donate and not holds_tracer(grads),
        _placement.signature(inputs),
        backend_placement,
        backend,
    )
    extra = _numbers_as_arrays(extra) if extra else extra
    # The donated buffers come last: the state (`update`), the params and the
    # state (`step`).
    if step:
        compiled, args = _STEP, (opt, grads, extra, params, state)
    else:
        compiled, args = _UPDATE, (opt, grads, params, extra, state)
    if lower:
        return compiled.lower(key, *args, donate=donate)
    try:
        out = compiled(key, *args, donate=donate)
    except ValueError as error:
        raise_if_misplaced(error, opt, grads, state, params)
        raise
    if donate and step:  # (the fast path keeps them itself)
        return callers_leaves(out[0], params), out[1]
    return out


def callers_leaves(new: Any, given: Any) -> Any:
    """`new` (a tree of `given`'s structure that a compiled call returned) with each
    non-array leaf the caller's own object from `given`: `eqx.filter_jit` gives
    back the objects its trace saw, which are only equal to them."""
    if jax.tree.structure(new) != jax.tree.structure(given):
        return new
    return jax.tree.map(lambda n, g: n if eqx.is_array(n) else g, new, given)


def _numbers_as_arrays(extra: dict[str, Any]) -> dict[str, Any]:
    # A Python number would be a static cache key (a recompile per new loss value);
    # as a (strongly typed) array it is traced. Bools stay static: they are switches.
    def convert(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        return jnp.asarray(v, dtype=float if isinstance(v, float) else int)

    return {k: convert(v) for k, v in extra.items()}


def state_class(cls: type) -> type:
    """The state class a transform declares: its `state_type` (the per-leaf
    engine's optimizers), else the class its `init` is annotated to return, else
    any value (a transform of one's own may keep its state in any pytree; eqxopt's
    own are Equinox modules)."""
    declared = getattr(cls, "state_type", None)
    if isinstance(declared, type):
        return declared
    returns = getattr(cls.init, "__annotations__", {}).get("return")
    if isinstance(returns, type) and issubclass(returns, eqx.Module):
        return returns
    return object


class _NoParameter:
    """Where a stand-in for the parameters has a leaf whose gradient is `None`: a
    leaf that is not an array (as an Equinox model's activation functions are),
    so the stand-in has the parameters' structure and gets no update there."""

    def __repr__(self) -> str:
        return "<no parameter given>"


_NO_PARAMETER = _NoParameter()


def _stand_in(
    grads: Grads, per_example: bool = False, state: State | None = None
) -> Params:
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


@functools.cache
def checked_rule(cls: type, step: bool, per_example: bool) -> Callable[..., Any]:
    """`cls`'s rule (`transform`, or `transform_step` for `step`) behind the public
    method's signature, `rule(opt, grads, state, params, extra, params_given,
    results)`, checked by jaxtyping and beartype when it is traced: the
    gradients have the parameters' structure and shapes (with a leading batch
    axis for a transform that takes per-example gradients), the state is `cls`'s
    state class, and so are the outputs. (`results` is a list the rule appends
    its outputs to, for naming the leaf when the return annotation fails.)

    What the annotations cannot say is checked by hand inside, each check naming
    the leaf: a gradient's dtype against its parameter's (jaxtyping binds shapes
    across arguments, not dtypes), an array gradient for a parameter that is not a
    float array (`None` and a function are both leaves to it), the state's
    shapes and dtypes against what `init` makes, and an update's dtype."""
    state_type = state_class(cls)
    grads_type = PerExampleGrads if per_example else Grads
    method = cls.transform_step if step else cls.transform
    owner = cls.__name__ if per_example else None

    def rule(
        opt: Any,
        grads: Any,
        state: Any,
        params: Any,
        extra: Any,
        params_given: bool,
        results: Any,
    ) -> Any:
        check_grads(grads, params, owner)
        try:
            check_state(opt, state, params)
        except (TypeError, ValueError) as error:
            if params_given:
                raise
            raise type(error)(
                f"{error} (update was called without params, so the state is "
                "checked against the gradients: a float parameter whose gradient "
                "is None still has state; call update(grads, state, params))"
            ) from None
        with promotion_for(params, grads):
            out, new_state = method(opt, grads, state, params, **extra)
        results.append((out, new_state))
        out = check_outputs(opt, step, out, params)
        if type(new_state) is state_type or state_type is object:
            # (Another class is the return annotation's to refuse.)
            check_state(opt, new_state, params, method.__name__)
        return out, new_state

    rule.__annotations__ = {
        "opt": cls,
        "grads": grads_type,
        "state": state_type,
        "params": Params,
        "extra": dict[str, Extra],
        "params_given": bool,
        "results": list,
        "return": tuple[Params if step else Updates, state_type],
    }
    rule.__name__ = rule.__qualname__ = "step" if step else "update"
    rule.__module__ = cls.__module__
    return jaxtyped(typechecker=beartype)(rule)


def _checked(
    opt: AbstractTransform,
    step: bool,
    grads: Grads,
    state: State,
    params: Params,
    extra: dict[str, Any],
    params_given: bool,
) -> Any:
    """`opt`'s rule through `checked_rule`. Where an annotation is not met, the
    error names the leaf: the hand checks find it and raise from jaxtyping's
    error (which shows the whole trees)."""
    per_example = opt.takes_per_example_grads()
    rule = checked_rule(type(opt), step, per_example)
    # Gradients or updates that are `None` over a whole subtree (where the
    # parameters have several leaves) stand for a `None` at each of them.
    grads = per_leaf(grads, params)
    results: list = []
    try:
        return rule(opt, grads, state, params, extra, params_given, results)
    except TypeCheckError as error:
        method = "transform_step" if step else "transform"
        try:
            check_grads(grads, params, type(opt).__name__ if per_example else None)
            check_state(opt, state, params)
            if results:
                out, new_state = results[0]
                check_outputs(opt, step, out, params)
                check_state(opt, new_state, params, method)
        except (TypeError, ValueError) as named:
            raise named from error
        raise TypeError(
            f"{type(opt).__name__}.{'step' if step else 'update'}: the arguments or "
            f"results do not match their annotations ({_first_line(error)}; "
            "see the error above)"
        ) from error


def _first_line(error: Exception) -> str:
    return str(error).split("\n", 1)[0]


def per_leaf(tree: Any, params: Params) -> Any:
    """`tree` (gradients or updates) with the structure of `params`, `None` at
    each leaf where `tree` has `None` at or above it."""
    return jax.tree.structure(params).unflatten(align_grads(tree, params))


# XLA pairs donated input buffers with outputs of the same shape in order, so the
# entry returns its outputs in the order of the donated inputs (state first for
# `update`, params then state for `step`); otherwise a new `mu` could be written into
# the buffer of the old `nu` and XLA would add full-size copies to undo it. It places
# its outputs like the inputs they replace (`_placement.keep`), so that a state
# sharded unlike its parameters (ZeRO-1) leaves every parameter's sharding alone and
# donated buffers are reused.


def _run(key: _EntryKey, opt, grads, params, state, extra):
    """The traced body of `update` and `step`."""
    if not key.params_given:  # `update(grads, state)`: `params_needed()` said none
        params = _stand_in(grads, opt.takes_per_example_grads(), state)
    backend = key.backend

    def run(opt, grads, params, state, extra, backend_placement):
        def checked():
            return _checked(
                opt, key.step, grads, state, params, extra, key.params_given
            )

        if backend is None:
            return checked()
        trace = _backend.EntryTrace(
            key.donated, key.grads_given, backend_placement, (grads, params, state)
        )
        with backend.tracing(trace):
            return checked()

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


def _update_entry(key, opt, grads, params, extra, state):
    return _run(key, opt, grads, params, state, extra)


def _step_entry(key, opt, grads, extra, params, state):
    return _run(key, opt, grads, params, state, extra)


# The optimizer is held: usually the same object call after call.
_UPDATE = FilteredJit(_update_entry, donate_from=4, held=0)
_STEP = FilteredJit(_step_entry, donate_from=3, held=0)
