"""The trust ratio of a layer, and the base of the optimizers that scale each leaf's
step by it: LAMB, LARS and Fromage."""

from typing import Any, TypeVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._shards import AxisName, leaf_norm


def trust_ratio(
    update: Array,
    param: Array,
    *,
    min_norm: Any = 0.0,
    trust_coefficient: Any = 1.0,
    eps: Any = 0.0,
    axis_name: AxisName = None,
    owner: str = "trust_ratio",
) -> Array:
    """`trust_coefficient * max(|p|, min_norm) / (max(|u|, min_norm) + eps)` for one
    leaf (Frobenius norms of the whole leaf: with `axis_name`, over every device's
    block), and `1` where either clipped norm is zero, so that a zero parameter or
    a zero update is not frozen forever (as `optax.scale_by_trust_ratio`).
    """
    param_norm = jnp.maximum(leaf_norm(param, axis_name, owner), min_norm)
    update_norm = jnp.maximum(leaf_norm(update, axis_name, owner), min_norm)
    zero = (param_norm == 0.0) | (update_norm == 0.0)
    safe_denominator = jnp.where(zero, 1.0, update_norm + eps)
    return jnp.where(zero, 1.0, trust_coefficient * param_norm / safe_denominator)


_T = TypeVar("_T", bound="AbstractTrustRatioOptimizer")


class AbstractTrustRatioOptimizer(AbstractLeafwiseOptimizer):
    """An optimizer whose step on each leaf is a direction `r` scaled by the leaf's
    trust ratio `trust_coefficient * |p| / (|r| + eps)` (`trust_ratio`; norms of
    the whole leaf, so the rule is not element-wise).

    A subclass writes its `leaf` rule with `self.scaled(h, r, p)` for the scaled
    direction, and says which of its hyperparameters shape the ratio by overriding
    `ratio_options` (by default none: `min_norm=0`, `trust_coefficient=1`, `eps=0`).
    Each declares `axis_name = axis_name_field()`: the norms of whole leaves inside
    `jax.shard_map` (`_core._shards`).
    """

    reads_params = "trust ratio (the norm of each parameter)"

    elementwise = False
    axis_name: eqx.AbstractVar[AxisName]

    def ratio_options(self: _T, h: _T) -> dict[str, Any]:
        """Keyword arguments of `trust_ratio` from `h`, this optimizer at the step."""
        del h
        return {}

    def scaled(self: _T, h: _T, r: Array, p: Array) -> Array:
        """`r` times the trust ratio of the leaf `p`."""
        ratio = trust_ratio(
            r,
            p,
            **self.ratio_options(h),
            axis_name=self.axis_name,
            owner=type(self).__name__,
        )
        return ratio * r
