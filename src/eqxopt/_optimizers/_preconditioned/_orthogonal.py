"""What the Muon family shares: the Newton-Schulz orthogonalisation (the plain
quintic iteration and its Gram form, with the preconditionings applied before
it), the named coefficient presets, and which axes of a leaf form the matrix
(`MatrixAxes`)."""

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PyTree

from ..._core._checks import is_concrete
from ..._core._masks import checked_leaves, is_kept_function
from ..._core._structure import FrozenTree, is_none, structure_mismatch
from ..._core._tree import abs_sq, is_float_leaf

DEFAULT_NS_COEFFS = (3.4445, -4.7750, 2.0315)

# The Polar Express polynomials (Amsel et al., 2025) for five steps, as
# microsoft/dion's `polar_express.py` and modded-nanogpt use them; their input is
# divided by 1.02 times its Frobenius norm, which is the first row here (its
# coefficients divided by 1.02, 1.02**3 and 1.02**5), so the Frobenius
# normalisation of the other presets serves them too.
_POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)

NS_PRESETS: dict[str, Any] = {
    # Jordan's quintic, every step (optax's 'standard').
    "standard": DEFAULT_NS_COEFFS,
    # One row per step, as optax's 'dion' preset (from microsoft/dion).
    "dion": (
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ),
    "polar_express": (
        (
            _POLAR_EXPRESS[0][0] / 1.02,
            _POLAR_EXPRESS[0][1] / 1.02**3,
            _POLAR_EXPRESS[0][2] / 1.02**5,
        ),
        *_POLAR_EXPRESS[1:],
    ),
}

PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")

# After which steps the Gram iteration forms its Gram matrix anew from the
# iterate (as microsoft/dion runs Gram Newton-Schulz, resetting after step 2):
# the products of the Gram form gather rounding that a fresh Gram matrix clears.
GRAM_RESETS = (2,)


def ns_coeffs(
    name: str, value: str | ArrayLike | Sequence[Sequence[float]]
) -> Float[Array, "*k 3"]:
    """The converter of an `ns_coeffs` option: a preset's name, three numbers, or
    one row of three per step. (The rows are checked against `ns_steps` by
    `check_coeffs`.)"""
    if isinstance(value, str):
        if value not in NS_PRESETS:
            raise ValueError(
                f"{name} must be one of {sorted(NS_PRESETS)}, 3 numbers or an "
                f"(ns_steps, 3) array, got {value!r}"
            )
        value = NS_PRESETS[value]
    try:
        coeffs = jnp.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a preset name, 3 numbers or an (ns_steps, 3) array, "
            f"got {value!r}"
        ) from None
    if is_concrete(coeffs) and not bool(jnp.all(jnp.isfinite(coeffs))):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return coeffs


def check_coeffs(coeffs: Array, ns_steps: int, name: str = "ns_coeffs") -> None:
    """A `ValueError` unless `coeffs` is one row of three (every step) or has a row
    for each of the `ns_steps` steps (its first `ns_steps` rows are used)."""
    shape = coeffs.shape
    if not (shape == (3,) or (len(shape) == 2 and shape[1] == 3)):
        raise ValueError(
            f"{name} must have shape (3,) or (k, 3) with k >= ns_steps = "
            f"{ns_steps}, got shape {shape}"
        )
    if len(shape) == 2 and shape[0] < ns_steps:
        raise ValueError(
            f"{name} has {shape[0]} rows, fewer than ns_steps = {ns_steps}: give "
            "a row per step, or fewer steps"
        )


def coefficient_rows(coeffs: Array, ns_steps: int) -> Array:
    """The `(ns_steps, 3)` coefficients of each step."""
    if coeffs.ndim == 1:
        return jnp.broadcast_to(coeffs, (ns_steps, 3))
    return coeffs[:ns_steps]


@dataclasses.dataclass(frozen=True)
class MatrixAxes:
    """Which axes of a parameter form the matrix that Muon orthogonalises, as
    `optax.contrib.MuonDimensionNumbers` says it: the input (`reduction`) axes,
    flattened into the matrix's rows, and the output axes, flattened into its
    columns; every other axis is a batch axis (a stack of matrices, each
    orthogonalised on its own). `fan_in` and `fan_out`, the matrix's numbers of
    rows and columns, set Muon's scaling.

    **Arguments:**

    - `reduction`: an axis or a tuple of axes (negative counts from the end);
      default `-2`.
    - `output`: likewise; default `-1`. Disjoint from `reduction`.

    An `equinox.nn.Linear` weight, `(out, in)`, is `MatrixAxes(reduction=-1,
    output=-2)`; a convolution kernel `(out, in, *spatial)` is
    `MatrixAxes(reduction=(1, 2, ...), output=0)`. `eqxopt.matrix_axes(model)`
    gives these from an Equinox model's module types.
    """

    reduction: int | tuple[int, ...] = -2
    output: int | tuple[int, ...] = -1

    def __post_init__(self):
        for name in ("reduction", "output"):
            value = getattr(self, name)
            axes = (value,) if isinstance(value, int) else value
            if (
                not isinstance(axes, tuple)
                or not axes
                or not all(isinstance(a, int) and not isinstance(a, bool) for a in axes)
            ):
                raise TypeError(
                    f"MatrixAxes: {name} must be an int or a non-empty tuple of "
                    f"ints, got {value!r}"
                )
            object.__setattr__(self, name, axes)

    def resolve(
        self, shape: tuple[int, ...], where: str = "MatrixAxes"
    ) -> tuple[tuple[int, ...], ...]:
        """`(batch, reduction, output)` axes of a leaf of `shape`, non-negative; a
        `ValueError` starting with `where` if they do not fit it."""
        ndim = len(shape)
        if ndim < 2:
            raise ValueError(
                f"{where}, which has shape {shape}; a selected leaf needs at "
                "least 2 dimensions (the last two form the matrix)"
            )
        reduction: Any = self.reduction
        output: Any = self.output
        for axis in (*reduction, *output):
            if not -ndim <= axis < ndim:
                raise ValueError(
                    f"{where}, which has shape {shape}; {self} names axis {axis}"
                )
        red = tuple(a % ndim for a in reduction)
        out = tuple(a % ndim for a in output)
        if set(red) & set(out) or len(set(red)) < len(red) or len(set(out)) < len(out):
            raise ValueError(
                f"{where}: {self} must name each axis once, in reduction or in output"
            )
        batch = tuple(a for a in range(ndim) if a not in red + out)
        return batch, red, out

    def is_last_two(self, ndim: int) -> bool:
        """Whether the matrices are the last two axes, rows then columns (no
        transpose or reshape needed)."""
        red: Any = self.reduction
        out: Any = self.output
        return {a % ndim for a in red} == {ndim - 2} and {a % ndim for a in out} == {
            ndim - 1
        }


LAST_TWO = MatrixAxes()


def _axes_leaf(name: str, path: str, value: Any) -> Any:
    if isinstance(value, MatrixAxes):
        return value
    if isinstance(value, bool) or (
        hasattr(value, "dtype") and getattr(value, "shape", None) == ()
    ):
        return bool(value)
    raise TypeError(
        f"{name}{path} must be a bool or an eqxopt.MatrixAxes, got {value!r}"
    )


def _is_axes_leaf(v: Any) -> bool:
    return is_none(v) or isinstance(v, MatrixAxes)


# What `muon_mask` takes: per leaf whether it is a matrix for Muon (`True`: its
# last two axes) or its `MatrixAxes`, as a tree or a function of the parameters.
MatrixMask: TypeAlias = (
    PyTree[bool | MatrixAxes | None]
    | Callable[[PyTree], PyTree[bool | MatrixAxes | None]]
    | None
)


def matrix_mask(name: str, value: MatrixMask) -> Any:
    """The converter of a Muon `muon_mask`: `None`, a function of params (kept),
    or a tree of bools and `MatrixAxes` (frozen for a static field)."""
    if value is None:
        return None
    if is_kept_function(name, value):
        return value
    treedef, leaves = checked_leaves(name, value, _axes_leaf)
    return FrozenTree(name, treedef, tuple(leaves))


def leaf_axes(mask: Any, params: PyTree, name: str = "muon_mask") -> list[Any]:
    """Per leaf of `params` (in `jax.tree.leaves` order), the `MatrixAxes` of the
    leaves Muon orthogonalises and `None` for the others (AdamW's): with no mask,
    every float leaf with `ndim == 2`; `True` is `MatrixAxes()` (the last two
    axes, a stack of matrices for more). Checked against each leaf's shape."""
    with_paths = jax.tree.leaves_with_path(params)
    if mask is None:
        return [
            LAST_TWO if is_float_leaf(p) and p.ndim == 2 else None
            for _, p in with_paths
        ]
    tree = mask.tree() if isinstance(mask, FrozenTree) else mask
    if callable(tree) and not isinstance(tree, eqx.Module):
        _, leaves = checked_leaves(name, tree(params), _axes_leaf)
        tree = jax.tree.unflatten(
            jax.tree.structure(tree(params), is_leaf=_is_axes_leaf), leaves
        )
    mask_leaves, mask_def = jax.tree.flatten(tree, is_leaf=_is_axes_leaf)
    try:
        subtrees = mask_def.flatten_up_to(params)
    except (ValueError, TypeError):
        raise structure_mismatch(tree, name, params, "params") from None
    values: list[Any] = []
    for value, sub in zip(mask_leaves, subtrees):
        value = None if value is False else value
        values.extend([value] * len(jax.tree.leaves(sub)))
    out = []
    for (path, p), value in zip(with_paths, values):
        if value is None or value is False or not is_float_leaf(p):
            out.append(None)
            continue
        axes = LAST_TWO if value is True else value
        axes.resolve(p.shape, f"{name} selects params{jax.tree_util.keystr(path)}")
        out.append(axes)
    return out


def to_matrices(x: Array, axes: MatrixAxes) -> tuple[Array, Callable[[Array], Array]]:
    """`x` as a stack of matrices `(*batch, fan_in, fan_out)`, and the function
    that puts such a stack back in `x`'s layout."""
    if axes.is_last_two(x.ndim):
        return x, lambda y: y
    batch, red, out = axes.resolve(x.shape)
    order = batch + red + out
    shape = x.shape
    batch_shape = tuple(shape[a] for a in batch)
    moved = tuple(shape[a] for a in order)
    fan_in = math.prod(shape[a] for a in red)
    fan_out = math.prod(shape[a] for a in out)
    inverse = tuple(sorted(range(x.ndim), key=lambda i: order[i]))

    def back(y: Array) -> Array:
        return jnp.transpose(jnp.reshape(y, moved), inverse)

    return jnp.reshape(jnp.transpose(x, order), (*batch_shape, fan_in, fan_out)), back


def fans(shape: tuple[int, ...], axes: MatrixAxes) -> tuple[int, int]:
    """`(fan_in, fan_out)`: the rows and columns of a leaf's matrices."""
    _, red, out = axes.resolve(shape)
    return math.prod(shape[a] for a in red), math.prod(shape[a] for a in out)


def _swap(x: Array) -> Array:
    return jnp.swapaxes(x, -1, -2)


def newton_schulz_matrices(
    x: Array,
    coeffs: Array,
    eps: Array | float,
    *,
    preconditioning: str = "frobenius",
    gram: bool = False,
    floor: bool = False,
    pinned: tuple[Any, Any] | None = None,
    axis_name: Any = None,
    transposed: bool | None = None,
) -> Array:
    """Newton-Schulz on a stack of matrices in the last two axes of `x`, one step
    per row `(a, b, c)` of `coeffs`: `x <- a x + (b A + c A A) x`, `A = x x^H`,
    with `x` first transposed where it has more rows than columns.

    Before the first step, `preconditioning` scales `x`: `"frobenius"` divides it
    by its Frobenius norm plus `eps`; `"spectral"` by its largest singular value
    plus `eps`; `"aol"` scales row `i` by `(sum_j |A_ij|)^(-1/2)` (Turbo-Muon's
    almost-orthogonal layer scaling); `"schatten"` divides it by `||A||_F^(1/2)`,
    its Schatten-4 norm (the last two floored at `eps`). The first step reuses
    the Gram matrix these read, rescaled. `floor=True` divides by the Frobenius
    norm floored at `eps` instead (pytorch-optimizer's `clamp_min`, and
    heavyball's `zeropower_via_newtonschulz5`, which Scion follows).

    `gram=True` runs the same polynomial on the Gram matrix alone (Gram
    Newton-Schulz: `A <- h(A) A h(A)`, `Q <- h(A) Q` with `h(A) = a + b A + c A
    A`, and `x <- Q x` at the end and at each reset, `GRAM_RESETS`), which equals
    the plain iteration in exact arithmetic.

    `pinned`, `axis_name` and `transposed` are for matrices split over a mesh
    (`orthogonalise`, `orthogonalise_rows`)."""

    def pin(v, which):
        if pinned is None:
            return v
        return jax.lax.with_sharding_constraint(v, pinned[which])

    def gram_of(v):
        a = v @ _swap(v).conj()
        if axis_name is not None:
            a = jax.lax.psum(a, axis_name)
        return pin(a, 1)

    if transposed is None:
        transposed = x.shape[-2] > x.shape[-1]
    if transposed:
        x = _swap(x)
    a = None
    if preconditioning == "frobenius":
        sq = jnp.sum(abs_sq(x), axis=(-2, -1), keepdims=True)
        if axis_name is not None:
            sq = jax.lax.psum(sq, axis_name)
        norm = jnp.sqrt(sq)
        x = pin(x / (jnp.maximum(norm, eps) if floor else norm + eps), 0)
    else:
        a = gram_of(x)
        if preconditioning == "spectral":
            # The largest singular value of x: the root of A's largest eigenvalue.
            top = jnp.linalg.eigvalsh(a)[..., -1:]
            s = 1 / (jnp.sqrt(jnp.maximum(top, 0))[..., None] + eps)
            scale_rows = scale_cols = s
        elif preconditioning == "aol":
            rows = jnp.maximum(jnp.sum(jnp.abs(a), axis=-1, keepdims=True), eps)
            scale_rows = jax.lax.rsqrt(rows)
            scale_cols = _swap(scale_rows)
        else:  # schatten
            sq = jnp.sum(abs_sq(a), axis=(-2, -1), keepdims=True)
            scale_rows = scale_cols = jax.lax.rsqrt(jnp.maximum(jnp.sqrt(sq), eps))
        x = pin(x * scale_rows, 0)
        a = pin(a * scale_rows * scale_cols, 1)
    steps = coeffs.shape[0]
    if gram:
        x = _gram_iterations(x, a, coeffs, gram_of, pin)
    else:
        for i in range(steps):
            if a is None:
                a = gram_of(x)
            b = coeffs[i, 1] * a + coeffs[i, 2] * a @ a
            x = pin(coeffs[i, 0] * x + b @ x, 0)
            a = None
    return _swap(x) if transposed else x


def _gram_iterations(
    x: Array, a: Array | None, coeffs: Array, gram_of: Callable, pin: Callable
) -> Array:
    steps = coeffs.shape[0]
    g: Array = gram_of(x) if a is None else a
    eye = jnp.eye(g.shape[-1], dtype=g.dtype)
    q = None  # the product of the steps' polynomials since the last reset
    for i in range(steps):
        if i in GRAM_RESETS and q is not None:
            x = pin(q @ x, 0)
            g, q = gram_of(x), None
        h = coeffs[i, 0] * eye + coeffs[i, 1] * g + coeffs[i, 2] * g @ g
        q = h if q is None else h @ q
        if i + 1 < steps and i + 1 not in GRAM_RESETS:
            g = pin(h @ g @ h, 1)
    return x if q is None else pin(q @ x, 0)


def keeps_split(m: int, n: int, ns_steps: int) -> bool:
    """Whether a matrix split along its long dimension (the one `x x^T` sums over)
    is orthogonalised in place, all-reducing each step's Gram matrix, rather than
    gathered once: per device, ring all-reduces of the `(short, short)` Gram matrix
    move `2 (k-1)/k short**2` elements each, the gather `(k-1)/k short long`."""
    short, long = min(m, n), max(m, n)
    return long > 2 * ns_steps * short


def axis_size(axis_name: tuple[str, ...]) -> int:
    """The number of shards over `axis_name` inside `shard_map` (a Python int)."""
    return int(jax.lax.psum(1, axis_name))
