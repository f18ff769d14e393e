"""Low-precision parameters without float32 master weights: the update of each
bf16/f16 parameter is applied with stochastic rounding (`StochasticRounding`), with
a Kahan compensation buffer (`KahanSummation`), or to the float32 master value that
an int8 residual restores (`ErrorCorrection`)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, PyTree, UInt32

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._keys import key_data
from .._core._storage import decode_residual, encode_residual
from .._core._tree import (
    apply_updates,
    full_like_leaf,
    increment,
    is_float_leaf,
    zero_step,
)
from ._wrapper import AbstractSingleWrapper, inner_field, leaves_of, with_own_state

_LOW = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _is_low(p: Any) -> bool:
    """The leaves these wrappers act on: bf16 and f16 arrays."""
    return is_float_leaf(p) and jnp.dtype(p.dtype) in _LOW


def round_stochastic_bf16(x: Array, bits: Array) -> Array:
    """float32 `x` to bf16, rounded up or down at random: 16 random bits per
    element are added to the low 16 bits of `x`'s bit pattern, which are then cut
    off, so `x` rounds away from zero with probability (those 16 bits) / 2**16 and
    `E[round(x)] = x`. This is torchao's `_fp32_to_bf16_sr` ("the alternative"
    form: its `rand < fraction` test is this sum's carry with bits `0xFFFF - rand`).
    NaN stays NaN; a value within the last bf16 step of the largest float rounds
    to infinity with its probability.

    **Arguments:**

    - `x`: a float32 array.
    - `bits`: random bits shaped like `x`: uint16 (`jax.random.bits(key, x.shape,
      jnp.uint16)`), used as they are, or uint32 (`jax.random.bits(key, x.shape)`,
      JAX's default), whose high 16 bits are used. Other dtypes (signed
      integers, floats) and shapes raise an error naming `bits`.

    **Returns:** a bf16 array shaped like `x`.
    """
    x_dtype = jnp.result_type(x)
    if x_dtype != jnp.float32:
        raise TypeError(f"round_stochastic_bf16: x must be float32, got {x_dtype}")
    bits_dtype = jnp.result_type(bits)
    if bits_dtype not in (jnp.uint16, jnp.uint32):
        raise TypeError(
            "round_stochastic_bf16: bits must be uint16 or uint32 random bits (such "
            f"as jax.random.bits(key, x.shape)), got {bits_dtype}"
        )
    if jnp.shape(bits) != jnp.shape(x):
        raise ValueError(
            "round_stochastic_bf16: bits must have x's shape, one per element: x "
            f"has shape {jnp.shape(x)}, bits {jnp.shape(bits)}"
        )
    if bits_dtype == jnp.uint32:
        bits = (bits >> 16).astype(jnp.uint16)
    return _round_stochastic_bf16(x, bits)


def _round_stochastic_bf16(x: Array, bits: Array) -> Array:
    """`round_stochastic_bf16` for float32 `x` and uint16 `bits` shaped like it."""
    pattern = jax.lax.bitcast_convert_type(x, jnp.uint32)
    summed = (pattern + bits.astype(jnp.uint32)) & jnp.uint32(0xFFFF0000)
    rounded = jax.lax.bitcast_convert_type(summed, jnp.float32).astype(jnp.bfloat16)
    return jnp.where(jnp.isnan(x), x.astype(jnp.bfloat16), rounded)


def _round_stochastic_f16(x: Array, bits: Array) -> Array:
    """float32 `x` to float16, to one of its two neighbours with probabilities
    making the mean `x` (up to the 2**-16 resolution of `bits`). A value past the
    largest float16 rounds to infinity, as round-to-nearest does."""
    nearest = x.astype(jnp.float16)
    near = nearest.astype(jnp.float32)
    towards = jnp.where(x > near, jnp.inf, -jnp.inf).astype(jnp.float16)
    other = jnp.nextafter(nearest, towards)
    # Exact: x lies between two neighbouring float16 values.
    frac = jnp.abs(x - near) / jnp.abs(other.astype(jnp.float32) - near)
    u = bits.astype(jnp.float32) * jnp.float32(2.0**-16)
    take = (x != near) & jnp.isfinite(near) & (u < frac)
    return jnp.where(take, other, nearest)


def _round_stochastic(x: Array, dtype: Any, bits: Array) -> Array:
    if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16):
        return _round_stochastic_bf16(x, bits)
    return _round_stochastic_f16(x, bits)


def _landing_delta(p: Array, target: Array) -> Array:
    """An update in `p`'s dtype that `eqxopt.apply_updates` (`p + u` in float32,
    rounded to `p`'s dtype) turns into `target`: `target - p` rounded to `p`'s
    dtype, or the neighbour above or below it where that one lands and it does
    not. Where none lands (a parameter crossing zero, or moving by more than its
    own size, to a value whose difference from `p` needs more bits than `p`'s
    dtype has), `target - p` rounded: the parameter then lands next to `target`."""
    dtype = p.dtype
    pf = p.astype(jnp.float32)

    def lands(d):
        return (pf + d.astype(jnp.float32)).astype(dtype) == target

    d = (target.astype(jnp.float32) - pf).astype(dtype)
    up = jnp.nextafter(d, jnp.full_like(d, jnp.inf))
    down = jnp.nextafter(d, jnp.full_like(d, -jnp.inf))
    d = jnp.where(
        lands(d), d, jnp.where(lands(up), up, jnp.where(lands(down), down, d))
    )
    # Same value (infinite parameters included, where `target - p` is NaN).
    return jnp.where(target == p, jnp.zeros_like(d), d)


def _added(p: Array, d: Array) -> Array:
    """`p + d` as `eqxopt.apply_updates` forms it (in float32, rounded once)."""
    return (p.astype(jnp.float32) + d.astype(jnp.float32)).astype(p.dtype)


def _has_low(params: Params) -> bool:
    return any(_is_low(p) for p in jax.tree.leaves(params))


class StochasticRoundingState(eqx.Module):
    """State of `StochasticRounding`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (folded into the key).
    - `key`: the wrapper's PRNG key as raw `uint32` key data (a copy, so a donated
      step never deletes the wrapper's own key). It does not change: each step's
      bits come from folding in `step`, then the leaf's index.
    - `inner`: the wrapped optimizer's state.
    """

    step: Int[Array, ""]
    key: UInt32[Array, "..."]
    inner: Any


class StochasticRounding(AbstractSingleWrapper):
    r"""Applies `inner`'s updates to bf16 and float16 parameters with stochastic
    rounding, so updates smaller than the parameter's resolution are not lost: with
    `u` the (float32) update,

    $$
    p \leftarrow \operatorname{round\_stochastic}(p + u),
    \qquad \mathbb{E}[\operatorname{round\_stochastic}(x)] = x
    $$

    For bf16 this is torchao's `bf16_stochastic_round`: 16 random bits are added to
    the low half of the float32 `p + u` and cut off (see
    `eqxopt.round_stochastic_bf16`); float16 rounds to either neighbour with the
    probabilities that make the mean exact. The bits come from `key`: each step
    folds the step count and then the leaf's index (in `jax.tree.leaves` order) into
    it, so a run is reproducible and a leaf's rounding does not depend on the
    others. Every other leaf (float32, complex, ...) is updated exactly as `inner`
    alone would. No float32 copy of the parameters is kept.

    The update applied is one in the parameter's dtype (`update` returns it, and
    `eqxopt.apply_updates` or `optax.apply_updates` gives exactly the parameters
    `step` gives): the one that lands on the rounded value. A parameter that
    crosses zero (or moves by more than its own size) to a value whose distance
    from it needs more bits than the dtype has cannot get there by such an
    update; it lands one step of the dtype (at the new value's size) next to it.
    That happens only to parameters smaller than their update (about 2% of the
    elements per step of a bf16 layer of N(0, 0.02) values under updates of
    1e-3, each off by under 1% of the update, with no measurable bias). Use it as
    the outermost transform: a transform after it would change updates it has
    already rounded.

    **Arguments:**

    - `inner`: the optimizer.
    - `key`: keyword-only, required: an integer seed, or a JAX PRNG key (typed or
      raw `uint32` data). An array field, so a new key does not recompile.
    """

    reads_params = "rounding of the new parameters"

    inner: AbstractTransform = inner_field()
    key: UInt32[Array, "..."] = eqx.field(kw_only=True)
    key_impl: str = eqx.field(static=True, init=False)

    def __post_init__(self):
        self.key, self.key_impl = key_data("key", self.key)

    def init(self, params: Params) -> StochasticRoundingState:
        return StochasticRoundingState(
            step=zero_step(),
            key=jnp.array(self.key, copy=True),
            inner=self.inner.init(params),
        )

    def _rounded(
        self, updates: Updates, state: StochasticRoundingState, params: Params
    ) -> list[Any]:
        """Per leaf of params: for bf16/f16 leaves with an update, the update in
        the parameter's dtype that lands on the stochastically rounded `p + u`;
        `None` elsewhere."""
        key = jax.random.wrap_key_data(state.key, impl=self.key_impl)
        key = jax.random.fold_in(key, state.step)
        out = []
        for i, (u, p) in enumerate(
            zip(leaves_of(updates, params), jax.tree.leaves(params))
        ):
            if u is None or not _is_low(p):
                out.append(None)
                continue
            bits = jax.random.bits(jax.random.fold_in(key, i), p.shape, jnp.uint16)
            x = p.astype(jnp.float32) + u.astype(jnp.float32)
            out.append(_landing_delta(p, _round_stochastic(x, p.dtype, bits)))
        return out

    def transform(
        self,
        grads: Grads,
        state: StochasticRoundingState,
        params: Params,
        **extra: Any,
    ) -> tuple[Updates, StochasticRoundingState]:
        updates, inner_state = self.run_inner(grads, state.inner, params, extra)
        rounded = self._rounded(updates, state, params)
        treedef = jax.tree.structure(params)
        new = [
            u if d is None else d.astype(jnp.float32)
            for u, d in zip(leaves_of(updates, params), rounded)
        ]
        return treedef.unflatten(new), self._next(state, inner_state)

    def transform_step(
        self,
        grads: Grads,
        state: StochasticRoundingState,
        params: Params,
        **extra: Any,
    ) -> tuple[Params, StochasticRoundingState]:
        self.check_keywords(extra)
        if not _has_low(params):
            # Nothing to round: `inner`'s own step (which may form the new
            # parameters in the pass that makes its updates).
            new_params, inner_state = self.inner.transform_step(
                grads, state.inner, params, **extra
            )
            return new_params, self._next(state, inner_state)
        updates, inner_state = self.inner.transform(grads, state.inner, params, **extra)
        rounded = self._rounded(updates, state, params)
        plain = jax.tree.leaves(apply_updates(params, updates))
        leaves = [
            q if d is None else _added(p, d)
            for q, p, d in zip(plain, jax.tree.leaves(params), rounded)
        ]
        return jax.tree.structure(params).unflatten(leaves), self._next(
            state, inner_state
        )

    def _next(self, state: StochasticRoundingState, inner_state: Any):
        return StochasticRoundingState(
            step=increment(state.step), key=state.key, inner=inner_state
        )


class KahanSummationState(eqx.Module):
    """State of `KahanSummation`.

    **Fields:**

    - `compensation`: per bf16/f16 parameter, the part of past updates that its
      rounding lost, in the parameter's dtype (`None` at every other leaf).
    - `inner`: the wrapped optimizer's state.
    """

    compensation: PyTree[Array | None]
    inner: Any


class KahanSummation(AbstractSingleWrapper):
    r"""Applies `inner`'s updates to bf16 and float16 parameters with Kahan
    (compensated) summation, as optimi's `kahan_sum=True`: a buffer `c` in the
    parameter's dtype keeps what each rounding lost and adds it back at the next
    step. With `u` the (float32) update,

    $$
    \begin{aligned}
    v &= u + c && \text{(float32)} \\
    p_\mathrm{new} &= p + \operatorname{round}(v)
        && \text{(both roundings to nearest, in $p$'s dtype)} \\
    c &\leftarrow \operatorname{round}\left(v - (p_\mathrm{new} - p)\right)
    \end{aligned}
    $$

    As in optimi, the compensated update is rounded to the parameter's dtype
    before it is added, so `update` returns it exactly: `eqxopt.apply_updates` (or
    `optax.apply_updates`) gives the parameters `step` gives. A bf16 model then
    needs 2 bytes per parameter for `c` instead of 4 for float32 master weights.
    Every other leaf (float32, complex, ...) gets no buffer and is updated exactly
    as `inner` alone would.

    Use it as the outermost transform: a transform after it would change the
    compensated updates.

    **Arguments:**

    - `inner`: the optimizer.
    """

    reduces_over = "nothing"

    reads_params = "compensated sum with the parameters"

    inner: AbstractTransform = inner_field()

    def init(self, params: Params) -> KahanSummationState:
        def zeros(p):
            # Placed like `p` (a sharded parameter gets a sharded buffer).
            return full_like_leaf(p) if _is_low(p) else None

        return KahanSummationState(
            compensation=jax.tree.map(zeros, params), inner=self.inner.init(params)
        )

    def _compensated(
        self, updates: Updates, state: KahanSummationState, params: Params
    ) -> tuple[list[Any], PyTree]:
        """Per leaf: the update in the parameter's dtype (`None` where `inner`'s
        stands), and the new compensation tree."""

        def rule(u: Any, p: Any, c: Any) -> tuple[Any, Any]:
            # As optimi: the compensated update is rounded to the parameter's
            # dtype (so `update` can return it exactly) and added to `p`; what the
            # two roundings lost is the new compensation.
            v = u.astype(jnp.float32) + c.astype(jnp.float32)
            d = v.astype(p.dtype)
            p_new = _added(p, d)
            moved = p_new.astype(jnp.float32) - p.astype(jnp.float32)
            # `p_new == p`: nothing moved (also for infinite `p`, where
            # `p_new - p` is NaN).
            new_c = jnp.where(p_new == p, v, v - moved)
            return d, new_c.astype(c.dtype)

        return with_own_state(rule, updates, params, state.compensation)

    def transform(
        self, grads: Grads, state: KahanSummationState, params: Params, **extra: Any
    ) -> tuple[Updates, KahanSummationState]:
        updates, inner_state = self.run_inner(grads, state.inner, params, extra)
        summed, comps = self._compensated(updates, state, params)
        treedef = jax.tree.structure(params)
        new = [
            u if d is None else d.astype(jnp.float32)
            for u, d in zip(leaves_of(updates, params), summed)
        ]
        return treedef.unflatten(new), KahanSummationState(comps, inner_state)

    def transform_step(
        self, grads: Grads, state: KahanSummationState, params: Params, **extra: Any
    ) -> tuple[Params, KahanSummationState]:
        self.check_keywords(extra)
        if not _has_low(params):
            new_params, inner_state = self.inner.transform_step(
                grads, state.inner, params, **extra
            )
            return new_params, KahanSummationState(state.compensation, inner_state)
        updates, inner_state = self.inner.transform(grads, state.inner, params, **extra)
        summed, comps = self._compensated(updates, state, params)
        plain = jax.tree.leaves(apply_updates(params, updates))
        leaves = [
            q if d is None else _added(p, d)
            for q, p, d in zip(plain, jax.tree.leaves(params), summed)
        ]
        return jax.tree.structure(params).unflatten(leaves), KahanSummationState(
            comps, inner_state
        )


class ErrorCorrectionState(eqx.Module):
    """State of `ErrorCorrection`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (folded into the key).
    - `key`: the wrapper's PRNG key as raw `uint32` key data (a copy, so a donated
      step never deletes the wrapper's own key). It does not change: each step's
      random numbers come from folding in `step`, then the leaf's index.
    - `residual`: per bf16/f16 parameter, an int8 array shaped like it: the
      float32 master value's distance from the parameter, in units of half the
      parameter's ULP over 127 (`None` at every other leaf).
    - `inner`: the wrapped optimizer's state.
    """

    step: Int[Array, ""]
    key: UInt32[Array, "..."]
    residual: PyTree[Array | None]
    inner: Any


class ErrorCorrection(AbstractSingleWrapper):
    r"""bf16 (or float16) parameters with an int8 error-correction residual that
    restores their float32 master value, as heavyball's `param_ecc="bf16+8"`
    (FlashOptim, arXiv 2602.23349): 3 bytes per parameter in place of bf16
    parameters plus a float32 master copy (6).

    With `p` a bf16 parameter, `r` its int8 residual, $\ell(p)$ half its ULP
    (the spacing of bf16 at `p`) and `u` `inner`'s float32 update of the master
    value $x$:

    $$
    \begin{aligned}
    x &= p + \frac{r}{127}\,\ell(p) && \text{(float32)} \\
    x' &= x + u \\
    p' &= \operatorname{round}(x') && \text{(to nearest, in $p$'s dtype)} \\
    r' &= \left\lfloor 127 \operatorname{clip}\!\left(
        \frac{x' - p'}{\ell(p')}, -1, 1\right) + \xi \right\rfloor
    \end{aligned}
    $$

    with $\xi$ uniform in $[0, 1)$: the residual is rounded stochastically, as
    heavyball's, so its rounding is unbiased and updates far below even its
    resolution ($\ell(p)/127$: the master value to about 15 of float32's 24
    bits) accumulate in the mean. (Rounded to nearest, a steady update of 3.3
    units would lose 0.3 of them every step.)
    `inner` sees the master values as its parameters (weight decay, and any
    rule that reads them, act on them) and the gradients in float32 (the bf16
    ones exactly, so that on the CPU its rule runs on the native kernels), and
    makes its state from the master values, so
    `AdamW`'s moments default to float32; `mu_dtype=`/`nu_dtype=` choose
    narrower ones. Every leaf that is not bf16/float16 (float32, complex, ...)
    gets no residual and is updated exactly as `inner` alone would. The
    residual starts at 0: parameters cast from float32 lose what the cast
    dropped.

    float16 parameters work the same way (heavyball's `"fp16+8"`).

    `update` returns, per bf16 parameter, the update in its dtype that lands on
    `p'` (as `StochasticRounding`), so `eqxopt.apply_updates` gives the
    parameters `step` gives. A parameter crossing zero whose `p'` no such
    update reaches lands one step of the dtype next to it (about 1% of the
    elements over 40 AdamW steps in the tests) and its residual keeps what of
    the difference fits in it. Use it as the outermost transform.

    **Arguments:**

    - `inner`: the optimizer.
    - `key`: keyword-only, required: an integer seed, or a JAX PRNG key (typed or
      raw `uint32` data), for the stochastic rounding of the residual. Each step
      folds the step count and then the leaf's index (in `jax.tree.leaves`
      order) into it. An array field, so a new key does not recompile.

    `init` raises a `ValueError` for parameters without a bf16/float16 leaf.

    **Reference:** heavyball 3.2.1, `ECCConfig` and `_ULPState`
    (`chainable.py`, `utils.py`); FlashOptim, arXiv 2602.23349.
    """

    reads_params = "master values (the parameters with their residuals)"

    inner: AbstractTransform = inner_field()
    key: UInt32[Array, "..."] = eqx.field(kw_only=True)
    key_impl: str = eqx.field(static=True, init=False)

    def __post_init__(self):
        self.key, self.key_impl = key_data("key", self.key)

    def init(self, params: Params) -> ErrorCorrectionState:
        if not _has_low(params):
            dtypes = sorted(
                {str(p.dtype) for p in jax.tree.leaves(params) if is_float_leaf(p)}
            )
            raise ValueError(
                "ErrorCorrection: params has no bf16 or float16 leaf to keep a "
                f"residual for (its float dtypes: {', '.join(dtypes) or 'none'}); "
                "cast the parameters to bf16 first, e.g. "
                "jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)"
            )

        def zeros(p):
            return full_like_leaf(p, dtype=jnp.int8) if _is_low(p) else None

        return ErrorCorrectionState(
            step=zero_step(),
            key=jnp.array(self.key, copy=True),
            residual=jax.tree.map(zeros, params),
            inner=self.inner.init(_masters(params, None)),
        )

    def _corrected(
        self,
        grads: Grads,
        state: ErrorCorrectionState,
        params: Params,
        extra: dict[str, Any],
    ) -> tuple[list[Any], list[Any], PyTree, Any]:
        """Per leaf of params: `inner`'s update, the update in the parameter's
        dtype for low-precision leaves with one (else `None`), the new residual
        tree, and `inner`'s new state."""
        masters = _masters(params, state.residual)
        # `inner` steps float32 masters, so it gets float32 gradients (exactly
        # the bf16 ones): a rule over float32 leaves only, which the native
        # kernels run.
        widened = [
            g if g is None or not _is_low(g) else g.astype(jnp.float32)
            for g in leaves_of(grads, params)
        ]
        updates, inner_state = self.inner.transform(
            jax.tree.structure(params).unflatten(widened),
            state.inner,
            masters,
            **extra,
        )
        key = jax.random.wrap_key_data(state.key, impl=self.key_impl)
        key = jax.random.fold_in(key, state.step)
        plain = leaves_of(updates, params)
        low, residuals = [], []
        for i, (u, p, x, r) in enumerate(
            zip(
                plain,
                jax.tree.leaves(params),
                jax.tree.leaves(masters),
                jax.tree.structure(params).flatten_up_to(state.residual),
            )
        ):
            if u is None or r is None:
                low.append(None)
                residuals.append(r)
                continue
            new = x + u.astype(jnp.float32)
            d = _landing_delta(p, new.astype(p.dtype))
            noise = jax.random.uniform(jax.random.fold_in(key, i), p.shape)
            low.append(d)
            residuals.append(encode_residual(new, _added(p, d), noise))
        residual = jax.tree.structure(params).unflatten(residuals)
        return plain, low, residual, inner_state

    def transform(
        self, grads: Grads, state: ErrorCorrectionState, params: Params, **extra: Any
    ) -> tuple[Updates, ErrorCorrectionState]:
        self.check_keywords(extra)
        plain, low, residual, inner_state = self._corrected(grads, state, params, extra)
        new = [u if d is None else d.astype(jnp.float32) for u, d in zip(plain, low)]
        return jax.tree.structure(params).unflatten(new), self._next(
            state, residual, inner_state
        )

    def transform_step(
        self, grads: Grads, state: ErrorCorrectionState, params: Params, **extra: Any
    ) -> tuple[Params, ErrorCorrectionState]:
        self.check_keywords(extra)
        plain, low, residual, inner_state = self._corrected(grads, state, params, extra)
        treedef = jax.tree.structure(params)
        applied = jax.tree.leaves(apply_updates(params, treedef.unflatten(plain)))
        leaves = [
            q if d is None else _added(p, d)
            for q, p, d in zip(applied, jax.tree.leaves(params), low)
        ]
        return treedef.unflatten(leaves), self._next(state, residual, inner_state)

    def _next(self, state: ErrorCorrectionState, residual: PyTree, inner_state: Any):
        return ErrorCorrectionState(
            step=increment(state.step),
            key=state.key,
            residual=residual,
            inner=inner_state,
        )


def _masters(params: Params, residual: PyTree | None) -> Params:
    """The float32 master values of the low-precision leaves (from their
    residuals, or the leaves themselves where `residual` is `None`); every other
    leaf as it is."""
    leaves = jax.tree.leaves(params)
    treedef = jax.tree.structure(params)
    rs = [None] * len(leaves) if residual is None else treedef.flatten_up_to(residual)
    out = []
    for p, r in zip(leaves, rs):
        if not _is_low(p):
            out.append(p)
        elif r is None:
            out.append(p.astype(jnp.float32))
        else:
            out.append(decode_residual(p, r))
    return treedef.unflatten(out)
