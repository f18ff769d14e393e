"""Every JAX internal eqxopt relies on, in one place (listed in README.md here):
only the native backend uses them; the core is public JAX alone.

JAX's public API has no way to define a primitive with a lowering of its own or to
read a jaxpr's equations back, and the native backend needs both. All of them go
through this module, and nothing else in eqxopt imports `jax.extend`,
`jax.interpreters` or `jax._src` (the core's `_jax_api` reads `jax.core.Tracer`,
which is public).

`backend_supported()` says whether this JAX is one the backend was tested with
(`TESTED`); outside that range the native backend turns itself off, with one
warning, and every step runs XLA's own code (the same numbers).
"""

import functools
import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.extend.core
from jax.interpreters import ad, batching, mlir

try:  # the lowering contexts of one device / partitioned / manual programs
    from jax._src.sharding_impls import (  # pyright: ignore
        ShardingContext as _ShardingContext,
        SPMDAxisContext as _SPMDAxisContext,
    )
except ImportError:  # another JAX: no context is taken for one device's
    _ShardingContext = _SPMDAxisContext = ()  # pyright: ignore

# The JAX releases the native backend is switched on for: from the first to the
# last (a minor series: every patch release of it). Tested: 0.10.2 (README.md).
TESTED = ((0, 10, 0), (0, 10))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def version_tested(version: str = jax.__version__) -> bool:
    """Whether `version` (of JAX) is in the range the native backend was tested on."""
    v = _version(version)
    first, last = TESTED
    return first <= v and v[: len(last)] <= last


@functools.cache
def backend_supported() -> bool:
    """`version_tested()` for the running JAX; warns once when it is not."""
    if version_tested():
        return True
    first, last = (".".join(map(str, v)) for v in TESTED)
    warnings.warn(
        f"eqxopt's native CPU kernels are tested with JAX {first} to {last}.x and "
        f"this is JAX {jax.__version__}, so they are off: optimizer steps run XLA's "
        "per-leaf code instead (same results, slower)",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


# --------------------------------------------------------------------------------------
# Reading jaxprs (the translation of rules to C).
# --------------------------------------------------------------------------------------


def _primitive(name: str) -> Any:
    """The primitive object `name` (as `jax.lax` or `jax.extend` spell it), or
    `None` where this JAX has none by that name."""
    for home in (jax.lax, jax.extend.core.primitives):
        if (found := getattr(home, name, None)) is not None:
            return found
    return None


def primitives(*names: str) -> dict[Any, str]:
    """`{primitive object: name}` for those of `names` this JAX has."""
    found = {_primitive(name): name for name in names}
    found.pop(None, None)
    return found


# Call-like primitives whose body is a sub-jaxpr: `closed_call`, `call`,
# `custom_jvp_call`, and what `jax.jit` and `jax.checkpoint` bind (`jit`, `pjit` in
# older JAX; `checkpoint`, `remat2`), found by tracing them.
_CALL_NAMES = ("jit_p", "pjit_p", "closed_call_p", "call_p", "custom_jvp_call_p")


@functools.cache
def call_primitives() -> frozenset:
    found = set(primitives(*_CALL_NAMES))
    for wrap in (jax.jit, jax.checkpoint):
        (eqn,) = jax.make_jaxpr(wrap(lambda x: x * 2))(1.0).eqns
        found.add(eqn.primitive)
    return frozenset(found)


def call_body(eqn: Any) -> tuple[Any, tuple] | None:
    """`(jaxpr, consts)` of a call-like equation's body, `None` for other ones."""
    if eqn.primitive not in call_primitives():
        return None
    sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if sub is None:
        return None
    return getattr(sub, "jaxpr", sub), tuple(getattr(sub, "consts", ()))


def is_literal(atom: Any) -> bool:
    """Whether a jaxpr operand is a literal (a constant in the equation)."""
    return isinstance(atom, jax.extend.core.Literal)


def bind(primitive: Any, params: dict[str, Any], *args: Any) -> list[Any]:
    """`primitive` applied to `args` with an equation's `params`; a list of outputs."""
    outs = primitive.bind(*args, **primitive.get_bind_params(params))
    return list(outs) if primitive.multiple_results else [outs]


# --------------------------------------------------------------------------------------
# Defining primitives (the custom calls).
# --------------------------------------------------------------------------------------


def new_primitive(name: str) -> Any:
    """A new primitive with several results."""
    prim = jax.extend.core.Primitive(name)
    prim.multiple_results = True
    return prim


def shaped_array(shape: tuple[int, ...], dtype: Any) -> Any:
    return jax.core.ShapedArray(shape, dtype)


def lower_fun(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A lowering rule that lowers `fn` (several results) as JAX would."""
    return mlir.lower_fun(fn, multiple_results=True)


def register_lowering(prim: Any, rule: Callable, platform: str | None = None) -> None:
    if platform is None:
        mlir.register_lowering(prim, rule)
    else:
        mlir.register_lowering(prim, rule, platform=platform)


def lowering_per_device(ctx: Any) -> bool:
    """Whether the program the lowering context `ctx` belongs to runs as it is on
    each device: a program of one device, or the body of a `shard_map` that is
    manual over every axis of its mesh. A custom call there sees whole local
    buffers; anywhere else XLA's partitioner would place it, and, knowing nothing
    of it, gather its operands."""
    context = ctx.module_context.axis_context
    if isinstance(context, _ShardingContext):
        return context.num_devices == 1
    if isinstance(context, _SPMDAxisContext):
        return set(context.mesh.axis_names) <= set(context.manual_axes)
    return False


def lowering_for_export(ctx: Any) -> bool:
    """Whether the lowering context `ctx` belongs to a `jax.export`."""
    return bool(getattr(ctx.module_context.lowering_parameters, "for_export", False))


def register_batching(prim: Any, rule: Callable) -> None:
    batching.primitive_batchers[prim] = rule


def register_linear(prim: Any, jvp: Callable, transpose: Callable) -> None:
    """The derivative rules of a linear primitive."""
    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose


def is_zero(tangent: Any) -> bool:
    """Whether an AD rule's tangent or cotangent is a symbolic zero."""
    return type(tangent) is ad.Zero


def zero_like(x: Any) -> Any:
    """The symbolic zero tangent of `x`."""
    return ad.Zero(jax.typeof(x).to_tangent_aval())


def instantiate(tangent: Any) -> Any:
    """A tangent as an array (symbolic zeros made real)."""
    return ad.instantiate_zeros(tangent)


def is_undefined_primal(x: Any) -> bool:
    """Whether a transpose rule's operand is the linear input."""
    return ad.is_undefined_primal(x)
