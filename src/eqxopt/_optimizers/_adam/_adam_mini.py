"""Adam-mini: Adam with one second moment per block of parameters."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Params
from ..._core._fields import (
    DTypeLike,
    MaskLike,
    ScalarOrSchedule,
    choice_field,
    dtype_field,
    learning_rate_field,
    mask_field,
    weight_decay_field,
)
from ..._core._moments import Moment, moment_like, ref
from ..._core._tree import (
    abs_sq,
    is_float_leaf,
    real_compute_dtype,
    zero_step,
)
from ._adam_like import (
    AbstractBiasCorrected,
    b1_field,
    b2_field,
    bias_corrections,
    ema,
    eps_field,
)


class AdamMiniState(eqx.Module):
    """State of `AdamMini`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment (mean of gradients), shaped like params.
    - `nu`: one second moment per block: for each float leaf, an array with the
      leaf's number of dimensions and size 1 along each dimension a block spans
      (shape `()` for a 0-d leaf), in float32 (at least); `None` at non-float
      leaves.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


def _block_axes(partition: str, ndim: int) -> tuple[int, ...]:
    """The dimensions one block of a leaf with `ndim` dimensions spans."""
    if ndim < 2 or partition == "leaf":
        return tuple(range(ndim))
    if partition == "rows":
        return tuple(range(1, ndim))
    return tuple(range(ndim - 1))  # "columns"


class AdamMini(AbstractBiasCorrected):
    r"""Adam-mini (Zhang et al., 2024): Adam with one second moment per block of
    parameters instead of one per parameter, so the state is about one copy of the
    parameters (the first moment) instead of AdamW's two.

    For each leaf and each block $B$ of it (see `partition`), with `t = step + 1`,
    `lr` and `wd` the learning rate and weight decay at `step`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu_B &\leftarrow b_2 \nu_B + (1 - b_2) \operatorname{mean}_{i \in B} g_i^2 \\
    p_i &\leftarrow p_i - \mathrm{lr} \left(
        \frac{\mu_i / (1 - b_1^t)}{\sqrt{\nu_B / (1 - b_2^t)} + \epsilon}
        + \mathrm{wd} \cdot p_i \right)
        && (i \in B;\ \text{decay only where \texttt{mask}})
    \end{aligned}
    $$

    The update of the authors' `Adam_mini` (the decay multiplies the parameter by
    `1 - lr * wd` before the step, as AdamW). Partitions:

    - `"leaf"` (default): one block per leaf.
    - `"rows"`: for leaves with 2 or more dimensions, one block per index of the
      first dimension, the output neuron of a weight laid out `(out, in)` as in
      `equinox.nn.Linear` and torch, and the token of an embedding
      `(vocabulary, dim)`: the paper's partition of value, output and MLP
      matrices and of embeddings. Leaves with fewer dimensions: one block each.
    - `"columns"`: the same along the last dimension, for weights laid out
      `(in, out)` (Flax's `Dense` kernel).

    The paper's blocks of one attention head for query and key matrices are
    groups of rows; a finer partition into single rows, as `"rows"` makes, is
    used in its place. optax and torch.optim have no Adam-mini.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the block second moments, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `partition`: `"leaf"`, `"rows"` or `"columns"` (see above).
    - `mask`: which leaves decay: `None` (all), a tree of bools (or a prefix of
      params), or a function of params returning one.
    - `mu_dtype`: dtype to store the first moment in (`None`: the parameter's), or
      a block-wise storage such as `Blockwise8bit()`.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = b1_field()
    b2: ScalarOrSchedule = b2_field()
    eps: ScalarOrSchedule = eps_field()
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    partition: str = choice_field("leaf", ("leaf", "rows", "columns"))
    mask: MaskLike = mask_field()
    mu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = AdamMiniState
    moments = (Moment("mu", dtype=mu_dtype), Moment("nu", nonnegative=True))
    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = False

    def init(self, params: Params) -> AdamMiniState:
        self.leaf_flags(params)  # a bad mask fails here, not mid-training

        def blocks(p):
            # One statistic per block, kept along the dimensions it does not span
            # (so it broadcasts against the leaf); real even for a complex leaf.
            if not is_float_leaf(p):
                return None
            axes = _block_axes(self.partition, p.ndim)
            shape = tuple(1 if i in axes else n for i, n in enumerate(p.shape))
            real = real_compute_dtype(p.dtype)
            return jnp.zeros(shape, real)

        return AdamMiniState(
            step=zero_step(),
            mu=moment_like(self, params, "mu"),
            nu=jax.tree.map(blocks, params),
        )

    def step_values(self, step):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, decayed):
        del t  # the bias corrections are in `h`
        axes = _block_axes(self.partition, g.ndim)
        mu = ema(mu, g, h.b1)
        nu = ema(nu, jnp.mean(abs_sq(g), axis=axes, keepdims=True), h.b2)
        direction = (mu / h.bias1) / (jnp.sqrt(nu / h.bias2) + h.eps)
        if decayed:
            direction = direction + h.weight_decay * p
        return -h.learning_rate * direction, mu, nu
