"""Writing optimizers and transforms of your own.

Everything here is public and stable: the bases eqxopt's own optimizers are built
on, the field helpers that validate their options, the declarations the engine
reads and the helpers for state. An optimizer written with them gets what the
built-in ones get: `update` and `step` compiled once per structure, schedules and
traced hyperparameters, `None` gradients, low-precision parameters, 8-bit and 4-bit
moments, placement on a mesh, `to_optax`, and (for an element-wise rule) the native
CPU kernels.

- `AbstractLeafwiseOptimizer`: one rule per parameter leaf over a few
  params-shaped moments; the common case (SGD, Adam, Lion, ...).
- `AbstractTrustRatioOptimizer`: the same, with each leaf's step scaled by its
  trust ratio (LAMB, LARS).
- `AbstractEngineTransform`: a transform that runs its per-leaf work through
  `map_leaves` itself, for state that is not one moment per leaf.
- `AbstractTransform`: the base of every transform (`init` and `transform`).

See the documentation's "Writing an optimizer" page for worked examples.
"""

from ._core._base import (
    AbstractTransform as AbstractTransform,
    Supplied as Supplied,
    supplies as supplies,
)
from ._core._explain import explain_kernels as explain_kernels
from ._core._fields import (
    DTypeLike as DTypeLike,
    MaskLike as MaskLike,
    ScalarOrSchedule as ScalarOrSchedule,
    StepValue as StepValue,
    StorageLike as StorageLike,
    axis_name_field as axis_name_field,
    checked_field as checked_field,
    choice_field as choice_field,
    count_field as count_field,
    dtype_field as dtype_field,
    flag_field as flag_field,
    hyper as hyper,
    hyperparameter_fields as hyperparameter_fields,
    learning_rate_field as learning_rate_field,
    mask_field as mask_field,
    replace as replace,
    step_value as step_value,
    values_at as values_at,
    weight_decay_field as weight_decay_field,
)
from ._core._leafwise import (
    AbstractEngineTransform as AbstractEngineTransform,
    AbstractLeafwiseOptimizer as AbstractLeafwiseOptimizer,
    map_leaves as map_leaves,
    split_decoupled_decay as split_decoupled_decay,
)
from ._core._moments import (
    FieldRef as FieldRef,
    Moment as Moment,
    fields_of as fields_of,
    moment_like as moment_like,
    ref as ref,
)
from ._core._schedule import AbstractSchedule as AbstractSchedule
from ._core._shards import AxisName as AxisName
from ._core._tree import increment as increment, zero_step as zero_step
from ._core._types import (
    Grads as Grads,
    OtherLeaf as OtherLeaf,
    Params as Params,
    PerExampleGrads as PerExampleGrads,
    State as State,
    Updates as Updates,
)
from ._optimizers._layerwise._trust import (
    AbstractTrustRatioOptimizer as AbstractTrustRatioOptimizer,
    trust_ratio as trust_ratio,
)

__all__ = [
    "AbstractEngineTransform",
    "AbstractLeafwiseOptimizer",
    "AbstractSchedule",
    "AbstractTransform",
    "AbstractTrustRatioOptimizer",
    "AxisName",
    "DTypeLike",
    "FieldRef",
    "Grads",
    "MaskLike",
    "Moment",
    "OtherLeaf",
    "Params",
    "PerExampleGrads",
    "ScalarOrSchedule",
    "State",
    "StepValue",
    "StorageLike",
    "Supplied",
    "Updates",
    "axis_name_field",
    "checked_field",
    "choice_field",
    "count_field",
    "dtype_field",
    "explain_kernels",
    "fields_of",
    "flag_field",
    "hyper",
    "hyperparameter_fields",
    "increment",
    "learning_rate_field",
    "map_leaves",
    "mask_field",
    "moment_like",
    "ref",
    "replace",
    "split_decoupled_decay",
    "step_value",
    "supplies",
    "trust_ratio",
    "values_at",
    "weight_decay_field",
    "zero_step",
]
