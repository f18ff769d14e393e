"""Field declarations that validate: each optimizer, transform and schedule states
its options as fields with one of these, and the checks (with messages naming the
argument) run as the field's converter when the module is built.

```python
class Lion(AbstractLeafwiseOptimizer):
    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    mask: MaskLike = mask_field()
```

One semantics for every optimizer: a float hyperparameter (`hyper`) is a number, a
scalar array or a schedule module, read at the current step with `values_at`; a
`mask` takes the same forms everywhere and is frozen into a static value.
"""

import dataclasses
import inspect
import math
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeAlias, TypeVar

import equinox as eqx
import jax
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from ._checks import (
    NamedConverter,
    check_bool,
    check_choice,
    float_dtype_or_none,
    hyperparameter,
    positive_count,
    step_count,
)
from ._masks import Mask, freeze_mask
from ._schedule import AbstractSchedule, check_range, checked_schedule, value_at
from ._shards import checked_axis_name, checked_param_specs
from ._storage import AbstractStateStorage

# What users may pass for a float hyperparameter, and what a field then holds (a
# scalar array, or the schedule as given). A rule reads it from `h`, the
# optimizer at the step, where it is a scalar array: a type checker sees it as
# any value, so that the rule's arithmetic is not refused (constructors show the
# union itself, from the field's converter).
if typing.TYPE_CHECKING:
    ScalarOrSchedule: TypeAlias = Any
else:
    ScalarOrSchedule: TypeAlias = float | ArrayLike | AbstractSchedule
MaskLike: TypeAlias = Mask
# A float dtype (`jnp.bfloat16`, `"float32"`, ...), or `None`: each parameter's.
DTypeLike: TypeAlias = jax.typing.DTypeLike | None
# How a moment is stored: a float dtype, `None` (each parameter's dtype), or a
# block-wise quantized storage such as `eqxopt.Blockwise8bit()`.
StorageLike: TypeAlias = jax.typing.DTypeLike | AbstractStateStorage | None


class _Hyper(NamedConverter):
    def __init__(
        self,
        schedule: bool,
        bounds: dict[str, Any],
        optional: bool = False,
        reads_params: bool = False,
    ):
        self.schedule = schedule
        self.bounds = bounds
        self.optional = optional
        # The option reads the parameters unless it is 0 (`params_needed`).
        self.reads_params = reads_params

    def __call__(self, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if isinstance(value, AbstractSchedule) and self.schedule:
            # A schedule's values are checked as a number is (where known now).
            check_range(self.name, value, **self.bounds)
            return value
        if callable(value):
            allowed = "a float, a scalar array or an eqxopt schedule module"
            if not self.schedule:
                allowed = "a float or a scalar array (not a schedule)"
            got = type(value).__name__ if isinstance(value, eqx.Module) else value
            raise TypeError(f"{self.name} must be {allowed}; got {got!r}")
        return hyperparameter(self.name, value, **self.bounds)


class _LearningRate(NamedConverter):
    def __init__(self, optional: bool = False):
        self.optional = optional

    def __call__(self, value: Any) -> AbstractSchedule | None:
        if value is None and self.optional:
            return None
        return checked_schedule(self.name, value)


class _Mask(NamedConverter):
    def __call__(self, value: Any) -> Any:
        return freeze_mask(value, self.name)


class _DType(NamedConverter):
    def __init__(self, storage: bool):
        self.storage = storage

    def __call__(self, value: Any) -> Any:
        if isinstance(value, AbstractStateStorage):
            if self.storage:
                return value
            raise TypeError(
                f"{self.name} takes a float dtype or None, not a quantized storage "
                f"({type(value).__name__}): block-wise storage holds a moment kept "
                "element by element for each parameter (AdamW's mu_dtype and "
                "nu_dtype, Lion's mu_dtype, SGD's velocity_dtype, ...), and this "
                "state is not one"
            )
        return float_dtype_or_none(self.name, value)


class _Flag(NamedConverter):
    def __init__(self, reads_params: bool = False):
        # The option reads the parameters when it is on (`params_needed`).
        self.reads_params = reads_params

    def __call__(self, value: Any) -> bool:
        return check_bool(self.name, value)


class _Choice(NamedConverter):
    def __init__(self, choices: tuple[Any, ...]):
        self.choices = choices

    def __call__(self, value: Any) -> Any:
        return check_choice(self.name, value, self.choices)


class _Count(NamedConverter):
    def __init__(self, at_least_one: bool):
        self.at_least_one = at_least_one

    def __call__(self, value: Any) -> Int[Array, ""]:
        check = positive_count if self.at_least_one else step_count
        return check(self.name, value)


class _Check(NamedConverter):
    def __init__(self, check: Callable[[str, Any], Any]):
        self.check = check

    def __call__(self, value: Any) -> Any:
        return self.check(self.name, value)


_REQUIRED: Any = dataclasses.MISSING


def hyper(
    default: Any = _REQUIRED,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
    schedule: bool = True,
    optional: bool = False,
    kw_only: bool = False,
    reads_params: bool = False,
) -> Any:
    """A float hyperparameter: a number or scalar array (checked against the bounds,
    stored as a scalar array) or, unless `schedule=False`, a schedule module (used
    as it is; `values_at` calls it at the step). With `optional=True`, `None` is
    kept as `None` (an option that is off, or that defaults to another field).
    With `reads_params=True` the option reads the parameters unless it is 0 or
    `None` (`AbstractTransform.params_needed`)."""
    bounds = dict(
        low=low, high=high, low_open=low_open, high_open=high_open, allow_inf=allow_inf
    )
    converter = _Hyper(schedule, bounds, optional, reads_params)
    accepts: Any = ScalarOrSchedule if schedule else float | ArrayLike
    converter.accepting(accepts | None if optional else accepts)
    return eqx.field(default=default, converter=converter, kw_only=kw_only)


def weight_decay_field(default: Any = _REQUIRED, *, kw_only: bool = True) -> Any:
    """A weight decay (`>= 0`, a number, scalar array or schedule), which reads the
    parameters unless it is 0: `update(grads, state)` without them is refused
    naming it. Keyword-only unless the optax counterpart takes it at the same
    position."""
    return hyper(default, low=0.0, kw_only=kw_only, reads_params=True)


def learning_rate_field(
    default: Any = _REQUIRED, *, optional: bool = False, kw_only: bool = False
) -> Any:
    """The learning rate: a float `>= 0`, a scalar array or a schedule; always held
    as a schedule (`Constant` for a number). With `optional=True`, `None` is kept as
    `None` (for an optimizer that then uses a rule of its own)."""
    converter = _LearningRate(optional)
    converter.accepting(ScalarOrSchedule | None if optional else ScalarOrSchedule)
    return eqx.field(default=default, converter=converter, kw_only=kw_only)


def mask_field(default: Any = None, *, kw_only: bool = True) -> Any:
    """Which leaves an option applies to: `None` (all), a tree of bools (or a prefix
    of the params' structure) or a function of the params returning one. Frozen into
    a static value, so a new copy of the same mask reuses the compiled step."""
    converter = _Mask().accepting(MaskLike)
    return eqx.field(default=default, converter=converter, static=True, kw_only=kw_only)


def dtype_field(*, kw_only: bool = True, storage: bool = False) -> Any:
    """A float dtype to store a piece of state in, or `None` (each parameter's).

    Declare `storage=True` for a moment that `map_leaves` loads and stores (created
    by `float_leaves_like`): then it may also be a block-wise quantized storage
    such as `Blockwise8bit()`. Everywhere else (state kept in a form of its own:
    projected, factored, an iterate) a storage is refused at construction, a
    `TypeError` naming the field, rather than failing inside `init` or a step; so
    a new optimizer takes a storage only where it says so. Floats of under 16 bits
    (`float8_*`, `float4_*`) are a `ValueError`: without a scale they round small
    moments to 0."""
    converter = _DType(storage).accepting(StorageLike if storage else DTypeLike)
    return eqx.field(default=None, converter=converter, static=True, kw_only=kw_only)


def flag_field(
    default: bool, *, kw_only: bool = True, reads_params: bool = False
) -> Any:
    """A bool option (static: each value compiles its own code). With
    `reads_params=True` it reads the parameters when on."""
    converter = _Flag(reads_params).accepting(bool)
    return eqx.field(default=default, converter=converter, static=True, kw_only=kw_only)


def choice_field(
    default: Any, choices: tuple[Any, ...], *, kw_only: bool = True
) -> Any:
    """One of `choices` (static)."""
    converter = _Choice(choices).accepting(Literal[choices])  # pyright: ignore
    return eqx.field(default=default, converter=converter, static=True, kw_only=kw_only)


def count_field(
    default: Any = _REQUIRED, *, at_least_one: bool = True, kw_only: bool = False
) -> Any:
    """A number of steps: a non-negative (or, by default, positive) integer, held
    as a scalar array so that a new value reuses the compiled step."""
    converter = _Count(at_least_one).accepting(int | Int[ArrayLike, ""])
    return eqx.field(default=default, converter=converter, kw_only=kw_only)


def checked_field(
    check: Callable[[str, Any], Any],
    default: Any = _REQUIRED,
    *,
    static: bool = False,
    kw_only: bool = False,
) -> Any:
    """A field converted by `check(name, value)`, for options of their own kind."""
    converter = _Check(check).accepting(_accepted_by(check))
    return eqx.field(
        default=default, converter=converter, static=static, kw_only=kw_only
    )


def _accepted_by(check: Callable[[str, Any], Any]) -> Any:
    """What `check(name, value)` takes as `value`, from its annotation."""
    try:
        hints = typing.get_type_hints(check)
    except Exception:  # an annotation that does not resolve: say nothing
        return Any
    names = list(inspect.signature(check).parameters)
    return hints.get(names[1], Any) if len(names) > 1 else Any


def axis_name_field() -> Any:
    """`axis_name`: `None` (default: reduce over this device's values only, as
    outside `shard_map`), or a mesh axis name or tuple of them, over which reductions
    over parameters are completed inside `jax.shard_map` (`_shards.shard_sum`).
    Static and keyword-only."""
    return checked_field(checked_axis_name, None, static=True, kw_only=True)


def param_specs_field() -> Any:
    """`param_specs`: with `axis_name`, the `PartitionSpec` of each parameter leaf
    inside `shard_map` (one spec or a pytree prefix of params; `None` in it: not
    split), for reductions over some dimensions only. `None` (default): a leaf that
    varies over a named axis is split along its leading dimension. Static and
    keyword-only."""
    return checked_field(checked_param_specs, None, static=True, kw_only=True)


def _is_value(field: dataclasses.Field) -> bool:
    return isinstance(field.metadata.get("converter"), (_Hyper, _LearningRate))


_M = TypeVar("_M")  # an Equinox module

# A `step_value()` field: a scalar computed once per step, `None` outside one (a
# type checker reads it as set: rules read it inside a step only).
if typing.TYPE_CHECKING:
    StepValue: TypeAlias = Any
else:
    StepValue: TypeAlias = Float[Array, ""] | Bool[Array, ""] | None


def _fields(module: Any) -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(module)


def hyperparameter_fields(module: Any) -> tuple[str, ...]:
    """The names of `module`'s hyperparameters: its fields declared with `hyper`,
    `learning_rate_field` or `weight_decay_field` (what `values_at` evaluates).

    **Arguments:**

    - `module`: an eqxopt transform (or its class).
    """
    return tuple(f.name for f in _fields(module) if _is_value(f))


def values_at(module: _M, step: Int[Array, ""]) -> _M:
    """`module` with each of its hyperparameters (its `hyper` and
    `learning_rate` fields) replaced by its value at `step`: a schedule called
    there, a number as its array. What a per-leaf rule reads (`leaf`'s `h`):
    `h.learning_rate` is a scalar array; every other field is as it was."""
    names = hyperparameter_fields(module)
    values = [value_at(getattr(module, name), step) for name in names]
    return replace(module, **dict(zip(names, values)))


def replace(module: _M, **values: Any) -> _M:
    """`module` with the fields `values` names set to them, as they are (no
    converter runs, so a traced value or a value computed in a step goes in
    unchecked): for `step_values`, to set `step_value()` fields or to change a
    hyperparameter's value at a step.

    **Arguments:**

    - `module`: an Equinox module.
    - `**values`: field name -> value.
    """
    fields = {f.name for f in _fields(module)}
    unknown = sorted(values.keys() - fields)
    if unknown:
        raise TypeError(
            f"replace: {type(module).__name__} has no field(s) {', '.join(unknown)}; "
            "a value computed once per step is declared as a field: "
            "`name: Float[Array, ''] | None = extend.step_value()`"
        )
    if not values:
        return module
    # As the module's pytree unflattening makes one: its fields set as they are.
    new = object.__new__(type(module))
    for field in _fields(module):
        value = (
            values[field.name] if field.name in values else getattr(module, field.name)
        )
        object.__setattr__(new, field.name, value)
    return new


def step_value() -> Any:
    """A value a per-leaf optimizer computes once per step in `step_values` (a
    bias correction, a step size), for `leaf` to read from `h`: `None` outside a
    step, not a constructor argument, and not shown in the module's repr. Set it
    with `extend.replace(h, name=value)`."""
    return eqx.field(
        default=None, init=False, repr=False, metadata={"step_value": True}
    )
