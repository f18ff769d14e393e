"""Validation with messages in words: hyperparameters at construction, and the
grads/state/params agreement at trace time (naming the leaf path)."""

import dataclasses
import inspect
import math
import types
from collections.abc import Hashable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Float32, Int, PyTree

from . import _jax_api
from ._compile import static_key
from ._jax_api import is_tracer
from ._keywords import unknown_keywords
from ._structure import describe as _describe, is_none, structure_mismatch
from ._tree import (
    INT32_MAX,
    align_grads,
    default_float,
    is_float_leaf,
    join_dtypes,
    leaf_paths,
)


def is_concrete(x: Any) -> bool:
    """True for values whose number can be read now (not tracers)."""
    return not is_tracer(x)


def hyperparameter(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
) -> Float[Array, ""]:
    """Converts a float hyperparameter to a scalar JAX array field.

    Concrete values are checked against `[low, high]` (each end open if asked), and
    must be finite in the stored dtype (float32 unless 64-bit mode is on: `1e40`
    would be `inf` there) unless `allow_inf` (for an `inf` that means something);
    a `ValueError` names the argument. Traced values are taken as they come, since
    their number is not known until run time.
    """
    if isinstance(value, bool) or not (
        isinstance(value, (int, float, np.number, np.ndarray, jax.Array))
    ):
        raise TypeError(
            f"{name} must be a float or a scalar array, got {type(value).__name__}"
        )
    if jnp.ndim(value) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(value)}")
    if not jnp.issubdtype(jnp.result_type(value), jnp.number):
        raise TypeError(f"{name} must be a number, got dtype {jnp.result_type(value)}")
    if is_concrete(value):
        number = float(np.asarray(value))
        too_low = number <= low if low_open else number < low
        too_high = number >= high if high_open else number > high
        if math.isnan(number) or too_low or too_high:
            left = "(" if low_open else "["
            right = ")" if high_open else "]"
            raise ValueError(
                f"{name} must be in {left}{_fmt(low)}, {_fmt(high)}{right}, "
                f"got {number!r}"
            )
        if not (allow_inf and math.isinf(number)):
            dtype = default_float()
            with np.errstate(over="ignore"):
                stored = np.asarray(number).astype(dtype)
            if not np.isfinite(stored):
                raise ValueError(
                    f"{name} must be finite in {dtype.name} (the dtype it is stored "
                    f"in), got {number!r}"
                )
        # Concrete even inside a trace (an optimizer built inside `jit`): what
        # depends on whether the value is zero (`params_needed`) reads it. (From
        # NumPy in its dtype: a transfer, where a conversion would compile.)
        if not isinstance(value, jax.Array):
            with jax.ensure_compile_time_eval():
                return jnp.asarray(np.asarray(value, dtype=default_float()))
    return jnp.asarray(value, dtype=default_float())


def _fmt(x: float) -> str:
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def check_grads(
    grads: PyTree, params: PyTree, per_example: str | None = None
) -> list[Any]:
    """Checks `grads` against `params` and returns the gradient of each params leaf
    (`None` where absent). Raises naming the leaf path on any mismatch. With
    `per_example` (the name of the transform that takes them), each gradient has
    a leading batch axis, of one size for every leaf, before its parameter's
    shape."""
    aligned = align_grads(grads, params)
    batch: tuple[str, int] | None = None
    for path, g, p in zip(leaf_paths(params), aligned, jax.tree.leaves(params)):
        if g is None:
            continue
        if not is_float_leaf(p):
            raise ValueError(
                f"grads{path} is an array but params{path} is not a float array "
                f"({_describe(p)}); only float parameters have gradients"
            )
        if not isinstance(g, (jax.Array, np.ndarray)):
            raise TypeError(
                f"grads{path} must be an array or None, got {type(g).__name__}"
            )
        if per_example is not None:
            if g.ndim != p.ndim + 1 or g.shape[1:] != p.shape:
                raise ValueError(
                    f"grads{path} has shape {g.shape} but {per_example} takes "
                    f"per-example gradients: a leading batch axis before "
                    f"params{path}'s shape {p.shape} (as jax.vmap(jax.grad(loss)) "
                    "gives)"
                )
            if batch is None:
                batch = (path, g.shape[0])
            elif g.shape[0] != batch[1]:
                raise ValueError(
                    f"grads{path} has a batch of {g.shape[0]} examples but "
                    f"grads{batch[0]} has {batch[1]}; {per_example} takes one "
                    "batch of per-example gradients"
                )
        elif g.shape != p.shape:
            raise ValueError(
                f"grads{path} has shape {g.shape} but params{path} has shape {p.shape}"
            )
        if g.dtype != p.dtype:
            raise TypeError(
                f"grads{path} has dtype {g.dtype} but params{path} has dtype "
                f"{p.dtype}; cast the gradient to the parameter's dtype"
            )
    return aligned


def check_outputs(opt: Any, step: bool, out: PyTree, params: PyTree) -> PyTree:
    """What `opt`'s `transform` returned as updates (`step=False`) or its
    `transform_step` as new parameters, checked against the parameters and
    returned with the parameters' structure (`None` at each leaf without an
    update): the structure, each leaf's shape, and its dtype (a new parameter in
    its parameter's dtype; an update in a float dtype that holds the parameter's,
    such as float32 for a bfloat16 parameter). Raises naming the transform and
    the leaf."""
    owner = type(opt).__name__
    method = "transform_step" if step else "transform"
    what = "new parameters" if step else "updates"
    try:
        aligned = align_grads(out, params) if not step else None
    except ValueError:
        aligned = None
    if step:
        if jax.tree.structure(out, is_leaf=is_none) != jax.tree.structure(
            params, is_leaf=is_none
        ):
            error = structure_mismatch(out, what, params, "params")
            raise TypeError(f"{owner}.{method} returned {error}")
        leaves = jax.tree.leaves(out, is_leaf=is_none)
        expected = jax.tree.leaves(params, is_leaf=is_none)
    else:
        if aligned is None:
            error = structure_mismatch(out, what, params, "params")
            raise TypeError(f"{owner}.{method} returned {error}")
        leaves = aligned
        expected = jax.tree.leaves(params)
    paths = None
    for i, (x, p) in enumerate(zip(leaves, expected)):
        if x is None or not is_float_leaf(p):
            if step and x is not p and (x is None) != (p is None):
                raise TypeError(
                    f"{owner}.{method} returned no new parameter where params has one"
                )
            if not step and x is not None:
                paths = paths or leaf_paths(params)
                raise TypeError(
                    f"{owner}.{method} returned an update for params{paths[i]}, "
                    f"which is not a float parameter ({_describe(p)})"
                )
            continue
        why = leaf_mismatch(x, p, step)
        if why is not None:
            paths = paths or leaf_paths(params)
            raise TypeError(
                f"{owner}.{method} returned {what}{paths[i]} {why}, for "
                f"params{paths[i]} ({_describe(p)})"
            )
    if step:
        return out
    return jax.tree.structure(params).unflatten(leaves)


def leaf_mismatch(x: Any, p: Any, exact: bool) -> str | None:
    """Why `x` (an update, or with `exact` a new parameter) cannot stand for the
    parameter `p`, in words, or `None`."""
    if not isinstance(x, (jax.Array, np.ndarray)):
        return f"as {type(x).__name__}, not an array"
    if x.shape != p.shape:
        return f"of shape {x.shape} (its parameter's shape is {p.shape})"
    if exact:
        if x.dtype != p.dtype:
            return f"in {x.dtype} (its parameter's dtype is {p.dtype})"
        return None
    if not jnp.issubdtype(x.dtype, jnp.inexact) or join_dtypes(
        x.dtype, p.dtype
    ) != jnp.dtype(x.dtype):
        return (
            f"in {x.dtype}, which does not hold its parameter's dtype {p.dtype} "
            "(an update is in that dtype or a wider float one)"
        )
    return None


_NOUNS = {"params": "parameters", "grads": "gradients"}


def reject_complex(tree: PyTree, tree_name: str, owner: str, why: str) -> None:
    """Raises `TypeError` naming the first complex float leaf of `tree` (as
    `tree_name[path]`) and `owner`, the optimizer or transform that cannot take it;
    `why` says what in its rule has no complex meaning. Called at `init` and at trace
    time, so nothing has changed when it raises."""
    for path, x in zip(leaf_paths(tree), jax.tree.leaves(tree)):
        if is_float_leaf(x) and jnp.iscomplexobj(x):
            raise TypeError(
                f"{owner} supports real {_NOUNS.get(tree_name, 'arrays')} only; "
                f"{tree_name}{path} is "
                f"{x.dtype} ({why})"
            )


# What `opt.init(params)` makes (shapes and dtypes), by what that depends on
# (`_abstract_key`). Tracing `init` is a good part of a step's trace on a tree of
# many leaves, and a step is traced again for each way it is called (donated or
# not, inside a `jit` or not) with the same optimizer and parameters.
_expected_states: dict[Hashable, Any] = {}
_EXPECTED_STATES_KEPT = 64
_UNKNOWN = object()


def _abstract_key(tree: PyTree) -> Hashable | None:
    """`tree` as `jax.eval_shape` sees it: its structure, each array leaf's type and
    every other leaf by value (`_compile.static_key`), and the 64-bit switch; `None`
    where some part is unhashable."""
    leaves, treedef = jax.tree.flatten(tree)
    kinds = tuple(
        _jax_api.abstract_type(x)
        if isinstance(x, (jax.Array, np.ndarray, np.generic))
        else static_key(x)
        for x in leaves
    )
    x64 = jax.dtypes.canonicalize_dtype(jnp.float64) == jnp.float64
    key = (treedef, bool(x64), kinds)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _expected_state(opt: Any, params: PyTree) -> PyTree:
    key = _abstract_key((opt, params))
    expected = _expected_states.get(key, _UNKNOWN) if key is not None else _UNKNOWN
    if expected is _UNKNOWN:
        expected = eqx.filter_eval_shape(opt.init, params)
        if key is not None:
            if len(_expected_states) >= _EXPECTED_STATES_KEPT:
                del _expected_states[next(iter(_expected_states))]
            _expected_states[key] = expected
    return expected


def check_state(
    opt: Any, state: PyTree, params: PyTree, returned_by: str | None = None
) -> None:
    """Checks `state` against what `opt.init(params)` makes: the same type, tree
    structure, shapes and dtypes, naming the first leaf that differs. With
    `returned_by` (`"transform"`, ...), `state` is the new state that method
    returned, and the error says so."""
    expected = _expected_state(opt, params)
    owner = type(opt).__name__
    name = "state" if returned_by is None else "new state"
    lead = f"{owner}.{returned_by} returned a "
    if type(state) is not type(expected):
        if returned_by is not None:
            raise TypeError(
                f"{lead}new state of type {type(state).__name__}; "
                f"{owner}.init(params) makes a {type(expected).__name__}"
            )
        raise TypeError(
            f"state must be the {type(expected).__name__} that {owner}.init(params) "
            f"returns, got {type(state).__name__}"
        )
    expected_leaves, expected_def = jax.tree.flatten(expected)
    actual_leaves, actual_def = jax.tree.flatten(state)
    if expected_def != actual_def:
        error = structure_mismatch(state, name, expected, f"{owner}.init(params)")
        if returned_by is not None:
            raise TypeError(
                f"{owner}.{returned_by} returned a new state unlike "
                f"{owner}.init(params)'s: {error.args[0]}"
            ) from None
        raise error from None
    paths = leaf_paths(state)
    for path, want, got in zip(paths, expected_leaves, actual_leaves):
        if not hasattr(want, "shape"):
            # A leaf that is no array (a string, a function: static, a part of the
            # compiled step's key) is checked for its kind only.
            if type(got) is not type(want):
                raise TypeError(
                    f"state{path} is a {type(got).__name__} but {owner}.init(params) "
                    f"makes a {type(want).__name__} there"
                )
            continue
        got_shape, got_dtype = jnp.shape(got), jnp.result_type(got)
        if got_shape != want.shape:
            if returned_by is not None:
                raise TypeError(
                    f"{lead}new state with state{path} of shape {got_shape}; "
                    f"{owner}.init(params) makes shape {want.shape} there"
                )
            raise ValueError(
                f"state{path} has shape {got_shape} but {owner}.init(params) makes "
                f"shape {want.shape} there"
            )
        if got_dtype != want.dtype:
            if returned_by is not None:
                raise TypeError(
                    f"{lead}new state with state{path} in {got_dtype}; "
                    f"{owner}.init(params) makes {want.dtype} there"
                )
            raise TypeError(
                f"state{path} has dtype {got_dtype} but {owner}.init(params) makes "
                f"dtype {want.dtype} there"
            )


def float_dtype_or_none(name: str, dtype: jax.typing.DTypeLike | None) -> Any:
    """`None`, or `dtype` checked to be a float dtype (`TypeError` naming `name`);
    for options such as `mu_dtype` that choose how state is stored."""
    if dtype is None:
        return None
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"{name} must be a float dtype or None, got {dtype!r}"
        ) from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a float dtype or None, got {dtype}")
    if jnp.finfo(dtype).bits < 16:
        # A plain cast to 8 or 4 bits has no scale: a second moment of 1e-6 (the
        # square of a gradient of 1e-3) rounds to 0 in float8_e4m3fn.
        raise ValueError(
            f"{name}={dtype} cannot hold optimizer state: a float of under 16 bits "
            "without a scale rounds small moments to 0; use eqxopt.Blockwise8bit(), "
            "eqxopt.Blockwise4bit() or eqxopt.BlockwiseFp8() (scaled per block), or "
            "a float dtype of 16 bits or more"
        )
    return dtype


def check_bool(name: str, value: Any) -> bool:
    """`value` if it is a Python bool, else a `TypeError` naming `name` (a truthy
    string or number would silently pick one behaviour)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """`value` if it is one of `choices`, else a `ValueError` naming `name`."""
    if value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


# Above every int32 step, in float32: the count a step count beyond int32 is
# stored as at least, so that `step < count` holds for every int32 step.
_PAST_INT32 = float(np.nextafter(np.float32(2**31), np.float32(np.inf)))
# Counts beyond this are stored as this (float32 holds it; no int32 step and no
# float32 ratio `step / count` can tell them apart).
_COUNT_CAP = 2.0**100


def step_count(name: str, value: Any) -> Int[Array, ""]:
    """A step count as a scalar array field: int32 when it fits (exact); beyond
    int32 (optax takes any Python int) float32, as optax computes with it, but
    never rounded down to an int32 step, so comparisons with int32 steps stay
    exact."""
    if not isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
        raise TypeError(
            f"{name} must be an integer (a Python int or an integer array), got "
            f"{type(value).__name__}"
        )
    if isinstance(value, bool) or jnp.ndim(value) != 0:
        raise ValueError(f"{name} must be an integer scalar, got {value!r}")
    if isinstance(value, int):
        number: int | None = value  # a Python int of any size
    else:
        if not jnp.issubdtype(jnp.result_type(value), jnp.integer):
            raise TypeError(
                f"{name} must be an integer, got dtype {jnp.result_type(value)}"
            )
        number = int(np.asarray(value)) if is_concrete(value) else None
    if number is not None and number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}")
    if number is not None and number > INT32_MAX:
        return _beyond_int32(number)
    return jnp.asarray(value, dtype=jnp.int32)


def _beyond_int32(number: int) -> Float32[Array, ""]:
    return jnp.asarray(max(float(min(number, _COUNT_CAP)), _PAST_INT32), jnp.float32)


def positive_count(name: str, value: Any) -> Int[Array, ""]:
    count = step_count(name, value)
    if is_concrete(count) and int(count) < 1:
        raise ValueError(f"{name} must be >= 1, got {int(count)}")
    return count


class NamedConverter:
    """A field converter that names its field in error messages: the class that
    declares the field gives it its name (`name_converters`). `accepts` is the
    type of what the constructor takes for the field: Equinox shows it in the
    class's `__init__` signature (it reads the converter's signature)."""

    name: str = "value"

    def __call__(self, value: Any) -> Any:
        raise NotImplementedError

    def accepting(self, accepts: Any) -> "NamedConverter":
        """Sets what the constructor takes for the field (see the class); returns
        the converter."""
        value = inspect.Parameter(
            "value", inspect.Parameter.POSITIONAL_ONLY, annotation=accepts
        )
        self.__signature__ = inspect.Signature([value])
        return self


def name_converters(cls: type) -> None:
    """Tells each `NamedConverter` of `cls`'s own fields the field's name; called
    from `__init_subclass__` of the bases that declare fields this way."""
    for attribute, value in vars(cls).items():
        if isinstance(value, dataclasses.Field):
            converter = value.metadata.get("converter")
            if isinstance(converter, NamedConverter):
                converter.name = attribute


def static_count(name: str, value: int) -> int:
    """A Python int `>= 1` that fixes shapes or unrolled loops (a static field)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def optional_static_count(name: str, value: int | None) -> int | None:
    """`None`, or a `static_count`."""
    return None if value is None else static_count(name, value)


def array_count(name: str, value: int | Int[ArrayLike, ""]) -> Int[Array, ""]:
    """An integer `>= 1` held as an int32 scalar array, so that a new value reuses
    the compiled step (a traced value is taken as it comes)."""
    if not isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
        raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__}")
    if (
        jnp.ndim(value) != 0
        or not jnp.issubdtype(jnp.result_type(value), jnp.integer)
        or (is_concrete(value) and int(np.asarray(value)) < 1)
    ):
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return jnp.asarray(value, dtype=jnp.int32)


# A class's `renamed_arguments` maps an argument of its optax counterpart that eqxopt
# spells differently to eqxopt's spelling: a tuple of eqxopt's argument names (one
# value, or optax's tuple split into these in order, such as `betas` into `b1` and
# `b2`), or a sentence for what is not a plain rename. Read when the class is built
# (`refuse_renamed`) and by the migration guide, which lists every such rename.
Renamed = tuple[str, ...] | str


def renames(**spellings: Renamed) -> Mapping[str, Renamed]:
    """A class's `renamed_arguments` (read-only): optax's name -> eqxopt's."""
    return types.MappingProxyType(spellings)


def renamed_advice(spelling: Renamed) -> str:
    """What to write instead, in words: `use b1= and b2=`."""
    if isinstance(spelling, str):
        return spelling
    return "use " + " and ".join(f"{name}=" for name in spelling)


def refuse_renamed(cls: type, kwargs: dict[str, Any]) -> None:
    """Raises one `TypeError` naming every keyword argument that `cls` refuses, each
    with what to write instead, before anything is built: optax's spellings in
    `cls.renamed_arguments` (`Prodigy got betas=: use b1= and b2=`) and names it
    does not take (`AdamW got lr=: use learning_rate=`). A name that is also one
    of eqxopt's own arguments (`DoG`'s `init_step`) is refused only in optax's
    form, a tuple of as many values as eqxopt's names."""
    if not kwargs:
        return
    table = getattr(cls, "renamed_arguments", None) or {}
    own = getattr(cls, "__dataclass_fields__", {})
    unknown = dict(unknown_keywords(cls, kwargs, known=frozenset(table)))
    refused = []  # (what came, what to write instead), in the order given
    for key, value in kwargs.items():
        if key in unknown:
            refused.append((f"{key}=", unknown[key]))
        elif key in table:
            spelling = table[key]
            if key not in own:
                refused.append((f"{key}=", renamed_advice(spelling)))
            elif (
                isinstance(value, tuple)
                and not isinstance(spelling, str)
                and len(value) == len(spelling)
            ):
                got = f"{key}={value!r} (optax's form)"
                refused.append((got, renamed_advice(spelling)))
    if len(refused) == 1:
        ((got, advice),) = refused
        raise TypeError(f"{cls.__name__} got {got}: {advice}")
    if refused:
        lines = "".join(f"\n  {got}: {advice}" for got, advice in refused)
        raise TypeError(
            f"{cls.__name__} got {len(refused)} keyword arguments it does not take:"
            + lines
        )
