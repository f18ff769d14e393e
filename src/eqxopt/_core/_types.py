"""The types of what eqxopt's public methods take and return: jaxtyping
annotations that relate the arguments, checked by beartype each time a method is
traced (`_base.checked_rule`).

The parameters, gradients and updates of one call are trees of one structure,
`"P"`, whose leaves are bound leaf by leaf: a gradient or an update has its
parameter's shape (`"?*shape"`: the shape may differ from leaf to leaf, not
between the trees at one leaf). `None` is a leaf of these trees (a parameter with
no gradient, a leaf with no update), so that a model's non-array leaves (its
activation functions) line up with the `None`s that `eqx.filter_grad` gives for
them. What the annotations cannot say is checked by hand, where the check says why.
"""

from typing import Any, TypeAlias

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, PyTree, Shaped


class _OtherLeafType(type):
    def __instancecheck__(cls, x: object) -> bool:
        # Anything JAX flattens to itself: a function, a number, a string, a NumPy
        # array. A container (dict, list, Equinox module) is not, so a tree is
        # walked down to its leaves.
        # JAX arrays are not among them: a JAX array leaf is checked for its shape.
        if x is None or isinstance(x, (jax.Array, dict, list, tuple, eqx.Module)):
            return False
        return jax.tree_util.treedef_is_leaf(jax.tree.structure(x))


class OtherLeaf(metaclass=_OtherLeafType):
    """Any leaf of a pytree that JAX does not look into (a function, a number, a
    string, a NumPy array): what a parameter tree holds besides JAX arrays."""


# The parameters: any pytree; its float array leaves are optimised, every other
# leaf (integer arrays, functions, `None` where a model was filtered) is passed
# through.
Params: TypeAlias = PyTree[Shaped[Array, "?*shape"] | OtherLeaf | None, "P"]  # pyright: ignore

# Gradients: the parameters' structure, each leaf an array of its parameter's
# shape, or `None` (no gradient: a non-float parameter, a frozen one).
_GradLeaf = Inexact[Array, "?*shape"] | Inexact[np.ndarray, "?*shape"] | None
Grads: TypeAlias = PyTree[_GradLeaf, "P"]  # pyright: ignore

# Per-example gradients: as `Grads`, each with a leading batch axis.
_ExampleLeaf = (
    Inexact[Array, "batch ?*shape"] | Inexact[np.ndarray, "batch ?*shape"] | None
)
PerExampleGrads: TypeAlias = PyTree[_ExampleLeaf, "P"]  # pyright: ignore

# Updates: the parameters' structure, each leaf an array of its parameter's shape,
# or `None` where a parameter gets no update.
Updates: TypeAlias = PyTree[Inexact[Array, "?*shape"] | None, "P"]  # pyright: ignore

# An optimizer's state: an Equinox module of the class its `init` returns (each
# optimizer's methods are checked against its own state class).
State: TypeAlias = eqx.Module

# The state a transform's own rule takes (`transform`, `transform_step`, `run`):
# each rule annotates its own state class, which the public methods check it
# against (`_base.state_class`), so the base leaves it open.
RuleState: TypeAlias = Any

# A float hyperparameter as a constructor takes it: a number, a scalar array, or a
# schedule module (see `ScalarOrSchedule` in `_fields`, which adds the schedule).
Scalar: TypeAlias = float | ArrayLike

# A keyword argument a rule takes besides the gradients (`value=` the loss, a
# function of the parameters for a linesearch, ...).
Extra: TypeAlias = Any
