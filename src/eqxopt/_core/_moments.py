"""Moments, as optimizers declare them: the params-shaped pieces of state (Adam's
`mu` and `nu`, SGD's `velocity`) that the engine creates, loads and stores.

A transform lists its moments in its class attribute `moments`, each a `Moment`
naming the option that says how it is stored, whether it is never negative, and
what it starts at. Every moment is made by `moment_like` from that declaration, so
a storage choice (a dtype, `Blockwise8bit()`, ...) is read the same way for every
optimizer, and renaming a field cannot silently change what a moment does: the
names a declaration gives are checked when the class is created.
"""

import dataclasses
from typing import Any

from jaxtyping import PyTree

from ._fields import _DType, _Mask
from ._tree import float_leaves_like


@dataclasses.dataclass(frozen=True)
class Moment:
    """One params-shaped piece of an optimizer's state, as it declares it in its
    class attribute `moments` (a tuple of these).

    ```python
    class LaProp(eqxopt.extend.AbstractLeafwiseOptimizer):
        ...
        mu_dtype: eqxopt.extend.DTypeLike = eqxopt.extend.dtype_field(storage=True)
        nu_dtype: eqxopt.extend.DTypeLike = eqxopt.extend.dtype_field(storage=True)
        moments = (
            eqxopt.extend.Moment("mu", dtype="mu_dtype"),
            eqxopt.extend.Moment("nu", dtype="nu_dtype", nonnegative=True),
        )
    ```

    **Arguments:**

    - `name`: the field of the state that holds it. For an
      `AbstractLeafwiseOptimizer`, the order of `moments` is the order its `leaf`
      rule takes them in.
    - `dtype`: the name of the optimizer's field that says how the moment is stored
      (a field declared with `dtype_field(storage=True)`: a float dtype, or a
      block-wise storage such as `Blockwise8bit()`), or `None`: in each
      parameter's dtype.
    - `nonnegative`: the moment is never negative (an average of squares, a
      running maximum of `|g|`): a quantized storage then keeps it in its unsigned
      map, with twice the resolution.
    - `fill`: what it starts at: a number, or the name of the hyperparameter field
      that holds it (such as Adagrad's `initial_accumulator_value`).
    """

    name: str
    dtype: str | None = None
    nonnegative: bool = False
    fill: float | str = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TypeError(f"Moment: name must be a field name, got {self.name!r}")
        if self.dtype is not None and not isinstance(self.dtype, str):
            raise TypeError(
                f"Moment({self.name!r}): dtype names the field of the dtype option "
                f"(a str) or is None, got {self.dtype!r}"
            )
        if type(self.nonnegative) is not bool:
            raise TypeError(
                f"Moment({self.name!r}): nonnegative must be a bool, got "
                f"{self.nonnegative!r}"
            )


def declared(transform: Any, name: str) -> Moment:
    """The `Moment` called `name` that `transform` declares."""
    for moment in transform.moments:
        if moment.name == name:
            return moment
    raise TypeError(
        f"{type(transform).__name__} makes a moment {name!r} that its `moments` "
        f"do not declare (it declares {[m.name for m in transform.moments]})"
    )


def moment_like(
    transform: Any, params: PyTree, moment: Moment | str, fill: Any = None
) -> PyTree:
    """The moment of `transform`'s state at `init`: its declared `fill` (or `fill`,
    where given) shaped like `params`, stored as the declared dtype option says
    (each parameter's dtype where there is none), in a quantized storage's
    unsigned map where it is declared `nonnegative`.

    Every moment with a storage option is made here, by the per-leaf engine's
    `init` and by the transforms that write their own."""
    if isinstance(moment, str):
        moment = declared(transform, moment)
    dtype = None if moment.dtype is None else getattr(transform, moment.dtype)
    if fill is None:
        fill = moment.fill
        if isinstance(fill, str):
            fill = getattr(transform, fill)
    return float_leaves_like(params, dtype, fill, nonnegative=moment.nonnegative)


def _fields_of(cls: type) -> dict[str, dataclasses.Field]:
    """The dataclass fields `cls` will have, while it is being created (its own are
    not processed yet): those of its bases, then those its body declares."""
    fields: dict[str, dataclasses.Field] = {}
    for base in reversed(cls.__mro__[1:]):
        fields.update(getattr(base, "__dataclass_fields__", {}))
    for name in getattr(cls, "__annotations__", {}):
        value = cls.__dict__.get(name, dataclasses.MISSING)
        if isinstance(value, dataclasses.Field):
            fields[name] = value
        elif name not in fields:
            fields[name] = dataclasses.field(default=value)
    return fields


def _converter(field: dataclasses.Field | None) -> Any:
    return None if field is None else field.metadata.get("converter")


def check_declarations(cls: type) -> None:
    """Raises `TypeError` at class creation where `cls`'s declarations name a field
    it does not have, or one of the wrong kind: a `Moment`'s `dtype` must be a
    `dtype_field`, its `fill` (by name) a field, `decay_mask` a `mask_field`; a
    per-leaf optimizer's moments must be fields of its `state_type`."""
    own = cls.__dict__
    if "moments" not in own and "decay_mask" not in own:
        return
    fields = _fields_of(cls)
    owner = cls.__name__
    moments = own.get("moments", ())
    if isinstance(moments, tuple):
        for moment in moments:
            if not isinstance(moment, Moment):
                raise TypeError(
                    f"{owner}.moments must hold eqxopt.extend.Moment declarations, "
                    f"got {moment!r} (write Moment({moment!r}) for a moment in each "
                    "parameter's dtype)"
                )
            if moment.dtype is not None and not isinstance(
                _converter(fields.get(moment.dtype)), _DType
            ):
                raise TypeError(
                    f"{owner}: Moment({moment.name!r}, dtype={moment.dtype!r}) names "
                    f"no dtype option: declare `{moment.dtype}: DTypeLike = "
                    "dtype_field(storage=True)`"
                )
            if isinstance(moment.fill, str) and moment.fill not in fields:
                raise TypeError(
                    f"{owner}: Moment({moment.name!r}, fill={moment.fill!r}) names no "
                    "field"
                )
        state_type = own.get("state_type", getattr(cls, "state_type", None))
        state_fields = getattr(state_type, "__dataclass_fields__", None)
        if state_fields is not None:
            missing = [m.name for m in moments if m.name not in state_fields]
            if missing:
                raise TypeError(
                    f"{owner}: its state {state_type.__name__} has no field for the "
                    f"moments {missing}"
                )
    mask = own.get("decay_mask")
    if mask is not None and not isinstance(_converter(fields.get(mask)), _Mask):
        raise TypeError(
            f"{owner}: decay_mask={mask!r} names no mask option: declare "
            f"`{mask}: MaskLike = mask_field()`"
        )
