"""Sharpness-Aware Minimization (Foret et al., 2021): the inner optimizer steps with
the gradient taken at an adversarially perturbed point (`optax.contrib.sam`)."""

from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from .._core._base import AbstractTransform, Grads, Params, Supplied, Updates, supplies
from .._core._fields import ScalarOrSchedule, axis_name_field, hyper, values_at
from .._core._norms import sum_of_squares
from .._core._shards import AxisName
from .._core._tree import (
    align_grads,
    compute_dtype,
    increment,
    is_float_leaf,
    real_compute_dtype,
    zero_step,
)
from ._wrapper import AbstractSingleWrapper, inner_field, keywords_for


class SAMState(eqx.Module):
    """State of `SAM`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (at which a scheduled `rho`
      is read).
    - `inner`: the inner optimizer's state.
    """

    step: Int[Array, ""]
    inner: Any


class SAM(AbstractSingleWrapper):
    r"""Sharpness-Aware Minimization (Foret et al., 2021, "Sharpness-Aware
    Minimization for Efficiently Improving Generalization"): `inner` steps with
    the gradient at the worst point of a ball of radius `rho` around the
    parameters (to first order), which steers training towards flat minima.

    Each update takes the gradient `g` at `p` (the `grads` passed in), makes the
    ascent step and a second gradient call, and hands that gradient to `inner`:

    $$
    \begin{aligned}
    e &= \rho\, g / \|g\| && \text{($\|g\|$: the norm over the whole tree)} \\
    g_2 &= \operatorname{grad\_fn}(p + e, \ldots) && \text{(with \texttt{*fn\_args})} \\
    p &\leftarrow p + \operatorname{inner}(g_2)
        && \text{(inner sees $g_2$, at the parameters $p$)}
    \end{aligned}
    $$

    A train step (the second gradient is computed inside the compiled step):

    ```python
    grad_fn = eqx.filter_grad(loss)          # loss(model, x, y) -> scalar
    opt = eqxopt.SAM(eqxopt.SGD(0.1), rho=0.05)
    state = opt.init(model)
    grads = grad_fn(model, x, y)
    model, state = opt.step(grads, state, model, grad_fn=grad_fn, fn_args=(x, y))
    ```

    `grad_fn` is part of the compiled step's cache key (by identity): make it once,
    outside the loop, and pass the batch through `fn_args` (a closure over the
    batch would be a new function, and a recompile, every step). Other keyword
    arguments go to `inner`.

    **Porting optax's SAM loop.** `optax.contrib.sam`'s default mode takes the
    adversarial gradient from the training loop: each training step is two calls
    of `update`, the first with the gradient at `p` (which moves to the perturbed
    point), the second with the gradient there. Here one call does both, so the
    loop calls `step` once per training step, with the gradient at `p` and the
    function that gives the second:

    ```python
    # optax: for each batch, twice
    #     grads = jax.grad(loss)(params, x, y)
    #     updates, state = opt.update(grads, state, params)
    #     params = optax.apply_updates(params, updates)
    grads = grad_fn(model, x, y)
    model, state = opt.step(grads, state, model, grad_fn=grad_fn, fn_args=(x, y))
    ```

    optax's `opaque_mode=True` passes `grad_fn(params, i)` (`i` the adversarial
    step): give it as `grad_fn=grad_fn, fn_args=(0,)`.

    The same as `optax.contrib.sam(inner, chain(normalize(), sgd(rho)),
    sync_period=2, opaque_mode=True)` (the paper's SAM: one normalised ascent
    step, the adversarial state reset each update), except that a zero gradient
    gives no perturbation instead of NaN. Leaves whose gradient is `None` are not
    perturbed, and `inner` gets no gradient for them. Complex leaves are perturbed
    along `g` with `|g|**2 = Re(conj(g) * g)`.

    **Arguments:**

    - `inner`: the optimizer that takes the step (the paper's base optimizer).
    - `rho`: the radius of the perturbation, `>= 0` (`0` is `inner` on
      `grad_fn(p)`).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      gradient norm of the whole model (each leaf summed over the named axes it is
      split over), as the unsharded run. `None` (default): this device's blocks.
    """

    reduces_over = "tree"

    reads_params = "ascent step (the perturbed parameters)"

    inner: AbstractTransform = inner_field()
    rho: ScalarOrSchedule = hyper(0.05, low=0.0)
    axis_name: AxisName = axis_name_field()

    keywords = supplies(grad_fn=Supplied.GRAD_FUNCTION, fn_args=Supplied.CALLER)

    def takes_keyword(self, key: str) -> bool:
        return key in self.keywords or self.inner.takes_keyword(key)

    def wanted_keywords(self) -> Mapping[str, Supplied]:
        return {**self.inner.wanted_keywords(), **self.keywords}

    def init(self, params: Params) -> SAMState:
        return SAMState(step=zero_step(), inner=self.inner.init(params))

    def transform(
        self,
        grads: Grads,
        state: SAMState,
        params: Params,
        *,
        grad_fn: Callable[..., Grads] | None = None,
        fn_args: tuple = (),
        **extra: Any,
    ) -> tuple[Updates, SAMState]:
        if grad_fn is None:
            raise TypeError(
                "SAM.update/step need grad_fn=, the gradient function "
                "grad_fn(params, *fn_args) -> grads, for the second gradient "
                "(at the perturbed parameters): call step(grads, state, params, "
                "grad_fn=eqx.filter_grad(loss), fn_args=(x, y)) once per training "
                "step, where optax's SAM loop calls update twice (the second time "
                "with the gradient at the perturbed point); optax's opaque-mode "
                "grad_fn(params, i) goes in as grad_fn=grad_fn, fn_args=(0,)"
            )
        if not callable(grad_fn):
            raise TypeError(
                f"SAM: grad_fn must be callable, got {type(grad_fn).__name__}"
            )
        if not isinstance(fn_args, tuple):
            raise TypeError(
                f"SAM: fn_args must be a tuple, got {type(fn_args).__name__}"
            )
        self.check_keywords(extra)
        rho = values_at(self, state.step).rho
        param_leaves, treedef = jax.tree.flatten(params)
        grad_leaves = align_grads(grads, params)
        # The norm in the precision of the leaves' maths (`_norms`): float64 for
        # float64 gradients under x64.
        total = sum_of_squares(
            [
                g
                for g, p in zip(grad_leaves, param_leaves)
                if g is not None and is_float_leaf(p)
            ],
            self.axis_name,
            "SAM",
        )
        norm = jnp.sqrt(total)
        # A zero gradient has no ascent direction: no perturbation (optax: NaN).
        positive = norm > 0
        rho = jnp.asarray(rho).astype(norm.dtype)
        scale = jnp.where(positive, rho / jnp.where(positive, norm, 1.0), 0.0)

        def perturb(g, p):
            if g is None or not is_float_leaf(p):
                return p
            dtype = compute_dtype(p.dtype)
            step = scale.astype(real_compute_dtype(p.dtype)) * g.astype(dtype)
            return (p.astype(dtype) + step).astype(p.dtype)

        perturbed = treedef.unflatten(
            [perturb(g, p) for g, p in zip(grad_leaves, param_leaves)]
        )
        second = align_grads(grad_fn(perturbed, *fn_args), params)
        inner_grads = treedef.unflatten(
            [g2 if g is not None else None for g, g2 in zip(grad_leaves, second)]
        )
        updates, inner_state = self.inner.transform(
            inner_grads, state.inner, params, **keywords_for(self.inner, extra)
        )
        return updates, SAMState(step=increment(state.step), inner=inner_state)
