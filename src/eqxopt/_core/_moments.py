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
import inspect
import typing
from typing import Any, TypeAlias, TypeVar, cast

import equinox as eqx
from jaxtyping import PyTree

from ._fields import _DType, _Hyper, _Mask
from ._tree import float_leaves_like

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class FieldRef:
    """A declaration's reference to a field of the class: `ref(mask)` in the class
    body that declares `mask`, or `fields_of(Base).mask` for a field a base
    class declares. Checked when the class is made (`check_declarations`).

    **Arguments:**

    - `field`: the field (a `dataclasses.Field`).
    """

    field: dataclasses.Field

    @property
    def name(self) -> str:
        """The field's name (once its class is made)."""
        return self.field.name


def ref(field: Any) -> FieldRef:
    """A reference to `field` for a declaration (`decay_mask = ref(mask)`): in a
    class body, a field's name is the field itself, which `ref` wraps so that
    the class does not take the declaration for a second field.

    **Arguments:**

    - `field`: a field declared in the same class body (its name there).
    """
    if not isinstance(field, dataclasses.Field):
        raise TypeError(
            "ref takes a field declared in the class body (ref(mask) after "
            f"`mask: MaskLike = mask_field()`), got {field!r}; for a field of a "
            "base class write fields_of(Base).mask"
        )
    return FieldRef(field)


# What a declaration may refer to a field with: a `FieldRef`, or inside a
# `Moment` the field itself.
Declared: TypeAlias = FieldRef | dataclasses.Field


@dataclasses.dataclass(frozen=True)
class Moment:
    """One params-shaped piece of an optimizer's state, as it declares it in its
    class attribute `moments` (a tuple of these).

    ```python
    from eqxopt import extend


    class LaProp(extend.AbstractLeafwiseOptimizer):
        ...
        mu_dtype: extend.StorageLike = extend.dtype_field(storage=True)
        nu_dtype: extend.StorageLike = extend.dtype_field(storage=True)
        moments = (
            extend.Moment("mu", dtype=mu_dtype),
            extend.Moment("nu", dtype=nu_dtype, nonnegative=True),
        )
    ```

    **Arguments:**

    - `name`: the field of the state that holds it. For an
      `AbstractLeafwiseOptimizer`, the order of `moments` is the order its `leaf`
      rule takes them in.
    - `dtype`: the optimizer's field that says how the moment is stored (one
      declared with `dtype_field(storage=True)`: a float dtype, or a block-wise
      storage such as `Blockwise8bit()`), or `None`: in each parameter's dtype.
      Refer to the field itself: by its name in the class body that declares it,
      or as `extend.fields_of(Base).mu_dtype` for a field of a base class.
    - `nonnegative`: the moment is never negative (an average of squares, a
      running maximum of `|g|`): a quantized storage then keeps it in its unsigned
      map, with twice the resolution.
    - `fill`: what it starts at: a number, or the hyperparameter field that holds
      it (such as Adagrad's `initial_accumulator_value`), referred to as `dtype`
      is.

    The fields a declaration refers to are checked when the class is made: one
    that is not a field of the class, or of the wrong kind, is a `TypeError`
    there.
    """

    # (`object` for a type checker, which reads a field's name in its class body
    # as the field's value type.)
    name: str
    dtype: Declared | object | None = None
    nonnegative: bool = False
    fill: float | Declared | object = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TypeError(f"Moment: name must be a field name, got {self.name!r}")
        if self.dtype is not None and not isinstance(
            self.dtype,
            (FieldRef, dataclasses.Field, str),  # (a str: refused later)
        ):
            raise TypeError(
                f"Moment({self.name!r}): dtype is the optimizer's field of the "
                f"moment's storage option (dtype=mu_dtype) or None, got "
                f"{self.dtype!r}"
            )
        if type(self.nonnegative) is not bool:
            raise TypeError(
                f"Moment({self.name!r}): nonnegative must be a bool, got "
                f"{self.nonnegative!r}"
            )


def field_name(ref: Declared) -> str:
    """The name of the field a declaration refers to (after its class is made)."""
    return ref.name


class _FieldsOf:
    def __init__(self, cls: type):
        self._cls = cls

    def __getattr__(self, name: str) -> FieldRef:
        fields = getattr(self._cls, "__dataclass_fields__", {})
        if name not in fields:
            raise AttributeError(
                f"{self._cls.__name__} has no field {name!r}; its fields are "
                f"{', '.join(fields)}"
            )
        return FieldRef(fields[name])


def fields_of(cls: type[_T]) -> _T:
    """The fields of `cls`, for declarations in a subclass's body that refer to a
    field a base class declares: `fields_of(AbstractAdamOptions).mu_dtype`
    refers to the field `mu_dtype` (a `FieldRef`). Typed as an instance of `cls`,
    so that an editor and pyright follow `.mu_dtype` to its declaration (and flag
    a misspelled one).

    **Arguments:**

    - `cls`: an Equinox module class (already made).
    """
    return cast(_T, _FieldsOf(cls))


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
    dtype = None
    if moment.dtype is not None:
        dtype = getattr(transform, field_name(moment.dtype))  # pyright: ignore
    if fill is None:
        fill = moment.fill
        if isinstance(fill, (FieldRef, dataclasses.Field)):
            fill = getattr(transform, field_name(fill))  # pyright: ignore
    return float_leaves_like(params, dtype, fill, nonnegative=moment.nonnegative)


def _fields_of(cls: type) -> dict[str, dataclasses.Field]:
    """The dataclass fields `cls` will have, while it is being created (its own are
    not processed yet): those of its bases, then those its body declares (class
    variables and `eqx.AbstractVar`s are not fields)."""
    fields: dict[str, dataclasses.Field] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            fields.update({f.name: f for f in dataclasses.fields(base)})
    for name, hint in inspect.get_annotations(cls).items():
        if _not_a_field(hint):
            continue
        value = cls.__dict__.get(name, dataclasses.MISSING)
        if isinstance(value, dataclasses.Field):
            fields[name] = value
        elif name not in fields:
            fields[name] = dataclasses.field(default=value)
    return fields


def _not_a_field(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is typing.ClassVar or origin is typing.ClassVar:
        return True
    if origin in (eqx.AbstractVar, eqx.AbstractClassVar):
        return True
    return isinstance(hint, str) and hint.startswith(("ClassVar", "typing.ClassVar"))


def _converter(field: dataclasses.Field | None) -> Any:
    return None if field is None else field.metadata.get("converter")


def resolved(cls: type, ref: Any, declaration: str) -> str | None:
    """The name of the field of `cls` (a class being made) that `ref` refers to,
    `None` for `None`; a `TypeError` naming the declaration where it is not one
    of `cls`'s fields (a string naming one included: the fix is said)."""
    if ref is None:
        return None
    fields = _fields_of(cls)
    if isinstance(ref, str):
        raise TypeError(
            f"{cls.__name__}: {declaration} names a field by the string {ref!r}; "
            f"refer to the field itself: {ref} in the class body that declares it "
            f"(extend.ref({ref}) where it stands alone), or "
            f"extend.fields_of(Base).{ref} for a field of a base class"
        )
    if isinstance(ref, (FieldRef, dataclasses.Field)):
        field = ref.field if isinstance(ref, FieldRef) else ref
        name = next((n for n, f in fields.items() if f is field), None)
        if name is None and field.name in fields:  # redeclared by a subclass
            name = field.name
    else:
        raise TypeError(
            f"{cls.__name__}: {declaration} must be one of its fields (the field "
            f"itself, as its class body names it), got {ref!r}"
        )
    if name is None or name not in fields:
        raise TypeError(
            f"{cls.__name__}: {declaration} refers to a field that {cls.__name__} "
            f"does not have (its fields are {', '.join(fields) or 'none'})"
        )
    return name


def check_declarations(cls: type) -> None:
    """Raises `TypeError` at class creation where `cls`'s declarations refer to a
    field it does not have, or to one of the wrong kind: a `Moment`'s `dtype`
    must be a `dtype_field`, its `fill` a number or a field, `decay_mask`
    a `mask_field`, `decoupled_decay` a hyperparameter; a per-leaf optimizer's
    moments must be fields of its `state_type`."""
    own = cls.__dict__
    if not {"moments", "decay_mask", "decoupled_decay"} & own.keys():
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
            what = f"Moment({moment.name!r}, dtype=...)"
            dtype = resolved(cls, moment.dtype, what)
            if dtype is not None and not isinstance(
                _converter(fields.get(dtype)), _DType
            ):
                raise TypeError(
                    f"{owner}: {what} refers to {dtype}, which is no dtype option: "
                    f"declare `{dtype}: StorageLike = dtype_field(storage=True)`"
                )
            if isinstance(moment.fill, (str, FieldRef, dataclasses.Field)):
                resolved(cls, moment.fill, f"Moment({moment.name!r}, fill=...)")
        state_type = own.get("state_type", getattr(cls, "state_type", None))
        state_fields = getattr(state_type, "__dataclass_fields__", None)
        if state_fields is not None:
            missing = [m.name for m in moments if m.name not in state_fields]
            if missing:
                raise TypeError(
                    f"{owner}: its state {state_type.__name__} has no field for the "
                    f"moments {missing}"
                )
    mask = resolved(cls, own.get("decay_mask"), "decay_mask")
    if mask is not None and not isinstance(_converter(fields.get(mask)), _Mask):
        raise TypeError(
            f"{owner}: decay_mask refers to {mask}, which is no mask option: "
            f"declare `{mask}: MaskLike = mask_field()`"
        )
    rate = resolved(cls, own.get("decoupled_decay"), "decoupled_decay")
    if rate is not None and not isinstance(_converter(fields.get(rate)), _Hyper):
        raise TypeError(
            f"{owner}: decoupled_decay refers to {rate}, which is no "
            "hyperparameter: declare `weight_decay: ScalarOrSchedule = "
            "weight_decay_field()`"
        )
