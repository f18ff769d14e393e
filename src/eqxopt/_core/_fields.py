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
import math
import types
from collections.abc import Callable
from typing import Any, TypeAlias

import equinox as eqx
from jaxtyping import Array, ArrayLike, Int

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
# scalar array, or the schedule as given).
ScalarOrSchedule: TypeAlias = float | ArrayLike | AbstractSchedule
MaskLike: TypeAlias = Mask
DTypeLike: TypeAlias = Any


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
    return eqx.field(default=default, converter=converter, kw_only=kw_only)


def mask_field(default: Any = None, *, kw_only: bool = True) -> Any:
    """Which leaves an option applies to: `None` (all), a tree of bools (or a prefix
    of the params' structure) or a function of the params returning one. Frozen into
    a static value, so a new copy of the same mask reuses the compiled step."""
    return eqx.field(default=default, converter=_Mask(), static=True, kw_only=kw_only)


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
    converter = _DType(storage)
    return eqx.field(default=None, converter=converter, static=True, kw_only=kw_only)


def flag_field(
    default: bool, *, kw_only: bool = True, reads_params: bool = False
) -> Any:
    """A bool option (static: each value compiles its own code). With
    `reads_params=True` it reads the parameters when on."""
    converter = _Flag(reads_params)
    return eqx.field(default=default, converter=converter, static=True, kw_only=kw_only)


def choice_field(
    default: Any, choices: tuple[Any, ...], *, kw_only: bool = True
) -> Any:
    """One of `choices` (static)."""
    converter = _Choice(choices)
    return eqx.field(default=default, converter=converter, static=True, kw_only=kw_only)


def count_field(
    default: Any = _REQUIRED, *, at_least_one: bool = True, kw_only: bool = False
) -> Any:
    """A number of steps: a non-negative (or, by default, positive) integer, held
    as a scalar array so that a new value reuses the compiled step."""
    converter = _Count(at_least_one)
    return eqx.field(default=default, converter=converter, kw_only=kw_only)


def checked_field(
    check: Callable[[str, Any], Any],
    default: Any = _REQUIRED,
    *,
    static: bool = False,
    kw_only: bool = False,
) -> Any:
    """A field converted by `check(name, value)`, for options of their own kind."""
    converter = _Check(check)
    return eqx.field(
        default=default, converter=converter, static=static, kw_only=kw_only
    )


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


def values_at(module: eqx.Module, step: Int[Array, ""]) -> types.SimpleNamespace:
    """Every `hyper` and `learning_rate` field of `module`, by name, at `step`
    (schedules called, numbers as their arrays)."""
    values = {}
    for field in dataclasses.fields(module):
        if isinstance(field.metadata.get("converter"), (_Hyper, _LearningRate)):
            values[field.name] = value_at(getattr(module, field.name), step)
    return types.SimpleNamespace(**values)
