"""Tree helpers shared by every optimizer: which leaves are optimised, zeros for
state, dtype rules, the step counter and the dtype-preserving apply."""

import contextlib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PyTree

from ._param_sharding import reduced_like
from ._storage import AbstractStateStorage
from ._structure import is_none as is_none, structure_mismatch

# The largest step count: the counter saturates there (`increment`).
INT32_MAX = int(np.iinfo(np.int32).max)


def is_float_leaf(x: Any) -> bool:
    """The leaves an optimizer works on: inexact (floating or complex) arrays.

    Everything else in a parameter tree (integer arrays, functions, Python scalars,
    strings) is passed through untouched and gets `None` in the state.
    """
    return eqx.is_inexact_array(x)


def default_float() -> Any:
    """JAX's default float dtype: float32, or float64 under `jax_enable_x64`.

    The one dtype of hyperparameters: every float hyperparameter is stored in
    it, and every schedule computes and returns in it, so that a float64
    computation gets a float64 learning rate (and float32 under x64 off)."""
    return jnp.dtype(jnp.result_type(float))


def compute_dtype(dtype: Any) -> Any:
    """The dtype the per-leaf maths runs in: at least float32, so bf16/f16 moments and
    hyperparameters such as b2 = 0.999 are never rounded mid-computation."""
    return join_dtypes(dtype, jnp.float32)


def real_compute_dtype(dtype: Any) -> Any:
    """The real dtype of `compute_dtype(dtype)`'s precision (float32 for complex64):
    what statistics of magnitudes (second moments, norms, distances) are kept in."""
    return jnp.finfo(compute_dtype(dtype)).dtype


def join_dtypes(a: Any, b: Any) -> Any:
    """`jnp.promote_types` under JAX's standard lattice: a rule between dtypes, which
    JAX's strict promotion mode would otherwise refuse (bf16 with float32)."""
    with jax.numpy_dtype_promotion("standard"):
        return jnp.promote_types(a, b)


def promotion_for(*trees: PyTree) -> contextlib.AbstractContextManager:
    """JAX's standard dtype promotion, for a step whose maths relies on it by
    design (else the caller's setting stands, such as JAX's strict mode):

    - complex leaves: one rule serves real and complex leaves, and mixes real
      hyperparameters and real statistics (`abs_sq`, norms) with complex moments;
      the promotion real -> complex is exact;
    - 64-bit mode: hyperparameters and schedules are float64 there (the default
      float dtype), and meet float32 leaves and float32 state scalars.
    """
    complex_leaf = any(
        is_float_leaf(x) and jnp.iscomplexobj(x) for x in jax.tree.leaves(trees)
    )
    x64 = jax.dtypes.canonicalize_dtype(jnp.float64) == jnp.float64
    if complex_leaf or x64:
        return jax.numpy_dtype_promotion("standard")
    return contextlib.nullcontext()


def abs_sq(x: Array) -> Array:
    """`|x|**2`, element-wise: real for complex `x` (`x * x` would be complex).

    Every squared magnitude in the library (second moments, norms, RMS) goes
    through here, so complex parameters get the update optax gives them."""
    return jnp.real(x * jnp.conj(x)) if jnp.iscomplexobj(x) else x * x


def cautious_mask(u: Array, a: Array, b: Array) -> Array:
    """The cautious masking of Liang et al. (2024) on one leaf: `u` where `a` and
    `b` agree in sign (`real(a * conj(b)) > 0`), zero elsewhere, scaled by
    `u.size / (count + 1)` for `count` the agreeing elements, so the step keeps
    its size (the `+ 1` keeps it finite where none agree). `CAdamW` and the
    `Cautious` wrapper both mask with it."""
    agree = (jnp.real(a * jnp.conj(b)) > 0).astype(jnp.real(u).dtype)
    scale = agree.size / (jnp.sum(agree) + 1)
    return u * agree * scale


def float_leaves_like(
    params: PyTree,
    dtype: Any = None,
    fill: float | Array = 0.0,
    *,
    nonnegative: bool = False,
) -> PyTree:
    """A tree shaped like `params`: `fill` for every float leaf (in `dtype`, or the
    leaf's own dtype; see `stored_dtype` for complex leaves), `None` for every other
    leaf. Each new leaf is placed like its parameter (`full_like_leaf`), so sharded
    parameters get sharded state from the start.

    `dtype` may be a quantized storage (`Blockwise8bit()`, ...): then large real
    leaves are `QuantizedArray`s (which `map_leaves` loads and stores), in the
    unsigned map if `nonnegative` (the moment is never negative), and the others
    float32."""

    def make(p):
        if not is_float_leaf(p):
            return None
        if isinstance(dtype, AbstractStateStorage):
            if dtype.quantizes(p):
                return dtype.init_leaf(p, fill, nonnegative)
            return full_like_leaf(p, fill, jnp.float32)
        return full_like_leaf(p, fill, dtype)

    return jax.tree.map(make, params)


def start_value(fill: Any, dtype: Any) -> Any:
    """`fill` as a state kept in `dtype` starts at: rounded to the nearest value
    of `dtype`, except that a non-zero fill never starts at 0 and a finite one
    never at infinity. Its magnitude is first clamped to between the smallest
    value `dtype` holds that stays non-zero in the compute dtype (float16's
    smallest subnormal, 6e-8; float32's smallest normal for bfloat16 and float32,
    whose subnormals the CPU flushes to 0) and `dtype`'s largest finite value.

    The one rule for every state that starts at a small constant (COCOB's `eps`,
    Yogi's initial accumulator, a user's `initial_scale`): in float16, `1e-8`
    would round to 0 and a division by the state would give NaN on the first
    step. Non-float dtypes (flags, counts) and fills of 0, infinity or NaN are
    taken as they are."""
    if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
        return fill
    x = jnp.asarray(fill)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return fill
    low = max(
        float(jnp.finfo(dtype).smallest_subnormal),
        float(jnp.finfo(compute_dtype(dtype)).smallest_normal),
    )
    high = float(jnp.finfo(dtype).max)
    keep = (x == 0) | ~jnp.isfinite(x)
    clamped = jnp.sign(x) * jnp.clip(jnp.abs(x), low, high)
    return jnp.where(keep, x, clamped).astype(dtype)


def full_like_leaf(
    p: Array, fill: float | Array = 0.0, dtype: Any = None, stack: tuple[int, ...] = ()
) -> Array:
    """`fill` shaped like the parameter `p` (behind `stack` leading dimensions, if
    given), in `dtype` (or `p`'s own; see `stored_dtype`), as a buffer of its own.
    A non-zero `fill` never rounds to 0 there (`start_value`).

    The one way to make parameter-sized state: it is placed like `p`, so a sharded
    parameter gets its state sharded the same way at `init` (`jnp.zeros(p.shape)`
    would put the whole leaf on one device, an out-of-memory for a model that only
    fits sharded). The `stack` dimensions are replicated."""
    stored = stored_dtype(dtype, p.dtype)
    x = jnp.full_like(p, start_value(fill, stored), dtype=stored)
    if stack:
        x = jnp.broadcast_to(x, (*stack, *p.shape))  # keeps p's placement behind
    return own_buffer(x)


def reduced_like_leaf(
    p: Array, axis: int, fill: float = 0.0, dtype: Any = None
) -> Array:
    """`fill` shaped like the parameter `p` without its dimension `axis` (a
    statistic over that dimension, such as Adafactor's factored second moments),
    in `dtype` (or `p`'s own; see `stored_dtype`), placed like `p` along the
    dimensions it keeps: a parameter split along one of them (FSDP) gets its
    statistic split the same way at `init`, where each step writes it."""
    shape = p.shape[:axis] + p.shape[axis + 1 :]
    return reduced_like(jnp.full(shape, fill, stored_dtype(dtype, p.dtype)), p, axis)


def scalar_for_leaf(p: Array, fill: Any = 0.0, dtype: Any = None) -> Array:
    """A 0-d statistic of the parameter `p` (`fill`, in `dtype` or `p`'s own; never
    rounded to 0, `start_value`): for a 0-d `p` it is shaped like `p`, so it is
    placed like it (`full_like_leaf`)."""
    if jnp.ndim(p) == 0:
        return full_like_leaf(p, fill, dtype)
    dtype = p.dtype if dtype is None else dtype
    return jnp.full((), start_value(fill, dtype), dtype)


def stored_dtype(dtype: Any, param_dtype: Any) -> Any:
    """The dtype of a state buffer for a parameter of `param_dtype` asked to be kept
    in `dtype` (such as `mu_dtype=jnp.bfloat16`; `None`: the parameter's own).

    For a complex parameter a real `dtype` means its complex counterpart of that
    precision: a moment of complex gradients stored real would drop their
    imaginary parts. A bool or integer `dtype` (a flag per leaf) stays as it is."""
    if dtype is None:
        return jnp.dtype(param_dtype)
    if isinstance(dtype, AbstractStateStorage):
        # Options that take a storage say so (`dtype_field(storage=True)`), and
        # store it with `float_leaves_like`; every other option refuses it.
        raise TypeError(
            f"{type(dtype).__name__}() is a block-wise storage for an optimizer's "
            "element-wise moments, not a dtype for this state"
        )
    if jnp.issubdtype(param_dtype, jnp.complexfloating) and jnp.issubdtype(
        dtype, jnp.floating
    ):
        return join_dtypes(dtype, jnp.complex64)
    return jnp.dtype(dtype)


def own_buffer(x: Array) -> Array:
    """`x`, as a buffer of its own if it is 0-d.

    Filling a 0-d leaf with a 0-d array fill (a hyperparameter field) returns that
    very array, so two state leaves, or a state leaf and the optimizer, would share
    one buffer, and a donated step (`donate=True`) would fail or delete the
    optimizer's field."""
    return jnp.array(x, copy=True) if jnp.ndim(x) == 0 else x


def zero_step() -> Int[Array, ""]:
    """The step count of a new state: an int32 scalar 0."""
    return jnp.zeros((), jnp.int32)


def increment(step: Int[Array, ""]) -> Int[Array, ""]:
    """`step + 1`, saturating at the int32 maximum instead of wrapping negative."""
    return jnp.where(step < INT32_MAX, step + 1, step).astype(jnp.int32)


def step_power(b: Array, t: Int[Array, ""]) -> Array:
    """`b**t` for a float `b` and the integer step `t`, with `t` cast to `b`'s dtype
    first (JAX's strict promotion refuses float ** int; XLA converts an integer
    exponent to the base's dtype anyway, so the numbers are the same)."""
    return b ** jnp.asarray(t).astype(jnp.result_type(b))


def apply_updates(params: PyTree, updates: PyTree) -> PyTree:
    """`params + updates`, leaf by leaf, keeping each parameter's dtype.

    `None` updates (and non-float leaves) leave the parameter as it is. The sum is
    formed in at least float32, so a bf16 parameter receives the full-precision
    update before its single rounding (`eqx.apply_updates` would promote the bf16
    parameter to float32 instead).

    An update whose shape is not its parameter's is refused, naming the leaf,
    rather than broadcast.

    **Arguments:**

    - `params`: any pytree.
    - `updates`: a tree with the structure of `params`, `None` where there is no
      update.
    """

    def add(path: Any, u: Any, p: Any) -> Any:
        if u is not None and is_float_leaf(p) and jnp.shape(u) != p.shape:
            where = jax.tree_util.keystr(path)
            raise ValueError(
                f"updates{where} has shape {jnp.shape(u)} but params{where} has "
                f"shape {p.shape}; an update has its parameter's shape"
            )
        return apply_update(u, p)

    return jax.tree_util.tree_map_with_path(add, updates, params, is_leaf=is_none)


def apply_update(u: Any, p: Any) -> Any:
    """One leaf of `apply_updates`: `p + u` in `p`'s dtype (`p` where `u` is `None`
    or `p` is not a float leaf)."""
    if u is None or not is_float_leaf(p):
        return p
    dtype = compute_dtype(p.dtype)
    return (p.astype(dtype) + u.astype(dtype)).astype(p.dtype)


def cast_like(updates: PyTree, params: PyTree) -> PyTree:
    """Casts each update leaf to the dtype of its parameter."""

    def cast(u, p):
        return None if u is None else u.astype(p.dtype)

    return jax.tree.map(cast, updates, params, is_leaf=is_none)


def align_grads(grads: PyTree, params: PyTree) -> list[Any]:
    """The gradient for each leaf of `params` (in `jax.tree.leaves` order), `None`
    where `grads` has `None` at that leaf or at any subtree above it.

    Raises `ValueError` naming the path where the two structures part."""
    grad_leaves, grad_def = jax.tree.flatten(grads, is_leaf=is_none)
    try:
        param_subtrees = grad_def.flatten_up_to(params)
    except (ValueError, TypeError):
        raise _grads_mismatch(grads, grad_leaves, params) from None
    aligned: list[Any] = []
    for g, p_sub in zip(grad_leaves, param_subtrees):
        p_leaves = jax.tree.leaves(p_sub)
        if g is None:
            aligned.extend([None] * len(p_leaves))
        elif len(p_leaves) == 1 and p_leaves[0] is p_sub:
            aligned.append(g)
        else:
            raise _grads_mismatch(grads, grad_leaves, params)
    return aligned


def _grads_mismatch(grads: PyTree, grad_leaves: list[Any], params: PyTree) -> Any:
    error = structure_mismatch(grads, "grads", params, "params")
    if any(g is not None and not eqx.is_array(g) for g in grad_leaves):
        # Gradients hold arrays and None only: params were likely passed as grads.
        error.args = (
            f"{error.args[0]} (update and step take grads, state, params in that "
            "order)",
        )
    return error


def leaf_paths(tree: PyTree) -> list[str]:
    """`jax.tree_util.keystr` of every leaf's path, in `jax.tree.leaves` order."""
    return [jax.tree_util.keystr(path) for path, _ in jax.tree.leaves_with_path(tree)]
