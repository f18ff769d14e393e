"""The states of transforms that keep nothing between steps but (for their
scheduled hyperparameters) the step count."""

import equinox as eqx
from jaxtyping import Array, Int


class EmptyState(eqx.Module):
    """State of a transform that keeps nothing between steps (`Centralize`, ...).
    It has no fields."""


class StepState(eqx.Module):
    """State of a transform that keeps only its step count (clipping, coupled
    weight decay), at which its hyperparameters are read: each may be a schedule.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    """

    step: Int[Array, ""]
