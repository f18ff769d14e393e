"""Labels from module types: `module_labels` (a label per float leaf of an
Equinox model, by the `equinox.nn` module that holds it, for `Partition`) and
`matrix_axes` (a `muon_mask` giving each `Linear` and `Conv` weight its matrix
axes)."""

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import equinox as eqx
import jax
from jaxtyping import PyTree

from ._core._tree import is_float_leaf
from ._optimizers._preconditioned._orthogonal import MatrixAxes

CATEGORIES = ("hidden", "conv", "embedding", "norm", "bias", "head", "other")

_CONV = (eqx.nn.Conv, eqx.nn.ConvTranspose)
_NORM = (eqx.nn.LayerNorm, eqx.nn.RMSNorm, eqx.nn.GroupNorm, eqx.nn.BatchNorm)
_BUILT_IN = (eqx.nn.Linear, eqx.nn.Embedding, *_CONV, *_NORM)

# An `equinox.nn.Linear` weight is `(out, in)`: its input axis is the last.
LINEAR_AXES = MatrixAxes(reduction=-1, output=-2)


def _built_in(module: Any, field: str) -> str | None:
    """The category of the leaves under `module.field` by the built-in rules,
    `None` where `module` is no built-in module type."""
    if not isinstance(module, _BUILT_IN):
        return None
    if isinstance(module, _NORM):
        return "norm" if field in ("weight", "bias") else "other"
    if field == "bias":
        return "bias"
    if field != "weight":
        return "other"
    if isinstance(module, eqx.nn.Linear):
        return "hidden"
    return "conv" if isinstance(module, _CONV) else "embedding"


def _step(node: Any, key: Any) -> tuple[bool, Any]:
    """`(found, child)`: the child of `node` that a key path entry names."""
    try:
        if isinstance(key, jax.tree_util.GetAttrKey):
            return True, getattr(node, key.name)
        if isinstance(key, jax.tree_util.DictKey):
            return True, node[key.key]
        if isinstance(key, jax.tree_util.SequenceKey):
            return True, node[key.idx]
    except (AttributeError, KeyError, IndexError, TypeError):
        pass
    return False, None  # a custom node's flattened index: not followed


def _holders(model: PyTree) -> tuple[list[Any], list[list[tuple[Any, str]]], Any]:
    """The leaves of `model`, and for each the `(module, field)` pairs of the
    Equinox modules on its path from the root (outermost first), and the treedef."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(model)
    leaves, chains = [], []
    for path, leaf in with_paths:
        node, chain = model, []
        for key in path:
            if isinstance(node, eqx.Module) and isinstance(
                key, jax.tree_util.GetAttrKey
            ):
                chain.append((node, key.name))
            found, node = _step(node, key)
            if not found:
                break
        leaves.append(leaf)
        chains.append(chain)
    return leaves, chains, treedef


def _category(chain: list[tuple[Any, str]], head: Any) -> str:
    category = None
    for module, field in reversed(chain):  # the innermost built-in module
        category = _built_in(module, field)
        if category is not None:
            break
    if category != "bias" and any(module is head for module, _ in chain):
        return "head"
    return "other" if category is None else category


def _hashable(name: str, value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"{name} must be a hashable label or None, got {value!r}"
        ) from None
    return value


def _check_labels(labels: Any) -> dict[str, Any]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(
            f"module_labels: labels must be None or a dict from category to label, "
            f"got {labels!r}"
        )
    for key, value in labels.items():
        if key not in CATEGORIES:
            raise ValueError(
                f"module_labels: labels has the key {key!r}, which is no category "
                f"(one of {', '.join(map(repr, CATEGORIES))})"
            )
        _hashable(f"module_labels: labels[{key!r}]", value)
    return dict(labels)


def _check_types(types: Any) -> list[tuple[type, Any]]:
    if types is None:
        return []
    if not isinstance(types, Mapping):
        raise TypeError(
            "module_labels: types must be None or a dict from module type to a "
            f"label or to a dict from field name to label, got {types!r}"
        )
    out = []
    for key, rule in types.items():
        if not isinstance(key, type):
            raise TypeError(
                f"module_labels: types has the key {key!r}, which is not a class"
            )
        where = f"module_labels: types[{key.__name__}]"
        if isinstance(rule, Mapping):
            for field, value in rule.items():
                if not isinstance(field, str):
                    raise TypeError(
                        f"{where} has the key {field!r}, which is not a field name"
                    )
                _hashable(f"{where}[{field!r}]", value)
        else:
            _hashable(where, rule)
        out.append((key, rule))
    return out


def _by_type(
    chain: list[tuple[Any, str]], types: list[tuple[type, Any]]
) -> tuple[bool, Any]:
    """`(found, label)`: the label that `types` gives, from the outermost module
    whose type it names."""
    for module, field in chain:
        for cls, rule in types:
            if not isinstance(module, cls):
                continue
            if not isinstance(rule, Mapping):
                return True, rule
            if field in rule:
                return True, rule[field]
    return False, None


def _find_head(model: PyTree, head: Any) -> Any:
    if head is None:
        return None
    if isinstance(head, str) and head == "last":
        linears = [
            x
            for x in jax.tree.leaves(
                model, is_leaf=lambda x: isinstance(x, eqx.nn.Linear)
            )
            if isinstance(x, eqx.nn.Linear)
        ]
        return linears[-1] if linears else None
    if not callable(head) or isinstance(head, eqx.Module):
        raise TypeError(
            "module_labels: head must be 'last', None or a function of the model "
            f"returning its head module (as eqx.tree_at's where), got {head!r}"
        )
    module = head(model)
    held = jax.tree.leaves(model, is_leaf=lambda x: x is module)
    if not isinstance(module, eqx.Module) or not any(x is module for x in held):
        raise ValueError(
            "module_labels: head(model) must return an Equinox module that model "
            f"holds, got {type(module).__name__} {module!r:.60}"
        )
    return module


def module_labels(
    model: PyTree,
    labels: Mapping[str, Hashable | None] | None = None,
    *,
    default: Hashable | None = None,
    head: str | Callable[[PyTree], eqx.Module] | None = "last",
    types: Mapping[type, Any] | None = None,
) -> PyTree[Hashable | None]:
    """A label for every float leaf of an Equinox model, by the `equinox.nn` module
    that holds it: a tree shaped like `model` to pass as `Partition`'s `labels`, so
    that a Muon/AdamW split is one line and no table of parameter names.

    The categories, from the innermost `equinox.nn` module on the leaf's path:

    - `"hidden"`: the weight of an `eqx.nn.Linear` (those of an
      `eqx.nn.MultiheadAttention` and an `eqx.nn.MLP` included), but the head's;
    - `"conv"`: the kernel of an `eqx.nn.Conv*` or `eqx.nn.ConvTranspose*`;
    - `"embedding"`: the weight of an `eqx.nn.Embedding`;
    - `"norm"`: the weight and bias of an `eqx.nn.LayerNorm`, `RMSNorm`,
      `GroupNorm` or `BatchNorm`;
    - `"bias"`: the bias of a `Linear` or a convolution (the head's too);
    - `"head"`: the output head's weight: the last `eqx.nn.Linear` in the model's
      leaf order (`jax.tree.leaves`, which follows the order the fields are
      declared in), or the module `head` names (every float leaf below it but its
      biases);
    - `"other"`: any other float leaf (an array a custom module holds itself, a
      `PReLU`'s slope).

    Leaves that are not float arrays get `None`, as `Partition` reads them.

    **Arguments:**

    - `model`: an Equinox model (any pytree).
    - `labels`: a dict from category to the label to give it (any hashable, or
      `None`: not optimised); `None` (default) labels each leaf with its
      category's name.
    - `default`: the label of the categories `labels` leaves out; `None`
      (default) keeps their category's name.
    - `head`: `"last"` (default: the last `Linear`), `None` (no head: the last
      `Linear` is `"hidden"`), or a function of the model returning the head
      module, as `eqx.tree_at`'s `where` (`lambda m: m.unembed`).
    - `types`: labels by module type, ahead of the categories: a dict from a
      module class to a label (every float leaf below such a module) or to a
      dict from field name to label (the leaves under those fields; the others
      keep their category). The outermost module on a leaf's path that `types`
      names decides; these labels are final (`labels` and `default` do not apply
      to them).

    `matrix_axes(model)` gives the `muon_mask` that makes Muon read each `Linear`
    weight as `(out, in)` and each convolution kernel as a matrix.

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import eqxopt

    keys = jax.random.split(jax.random.key(0), 3)
    model = [
        eqx.nn.Embedding(10, 8, key=keys[0]),
        eqx.nn.Linear(8, 8, key=keys[1]),
        eqx.nn.LayerNorm(8),
        eqx.nn.Linear(8, 10, key=keys[2]),
    ]
    labels = eqxopt.module_labels(model)
    assert labels[1].weight == "hidden" and labels[1].bias == "bias"
    assert labels[2].weight == "norm" and labels[3].weight == "head"
    # Muon for the hidden matrices, AdamW for the rest: one line
    opt = eqxopt.Partition(
        {"muon": eqxopt.Muon(0.02, muon_mask=eqxopt.matrix_axes(model)),
         "adamw": eqxopt.AdamW(1e-3)},
        eqxopt.module_labels(model, {"hidden": "muon"}, default="adamw"),
    )
    state = opt.init(model)
    ```
    """
    mapping = _check_labels(labels)
    _hashable("module_labels: default", default)
    rules = _check_types(types)
    head_module = _find_head(model, head)
    leaves, chains, treedef = _holders(model)
    out = []
    for leaf, chain in zip(leaves, chains):
        if not is_float_leaf(leaf):
            out.append(None)
            continue
        found, label = _by_type(chain, rules)
        if not found:
            category = _category(chain, head_module)
            if category in mapping:
                label = mapping[category]
            else:
                label = category if default is None else default
        out.append(label)
    return jax.tree.unflatten(treedef, out)


def _conv_axes(module: Any, ndim: int) -> MatrixAxes:
    # `(*batch, out, in, *spatial)`: the axes before `out` stack several kernels.
    out = ndim - 2 - module.num_spatial_dims
    return MatrixAxes(reduction=tuple(range(out + 1, ndim)), output=out)


def matrix_axes(model: PyTree) -> PyTree[MatrixAxes | bool | None]:
    """A `muon_mask` for `eqxopt.Muon` from an Equinox model's module types: the
    matrix axes of every `eqx.nn.Linear` weight (`(out, in)`:
    `MatrixAxes(reduction=-1, output=-2)`, torch's and Jordan's reading) and of
    every convolution kernel (`(out, in, *spatial)`: the input channels and the
    spatial axes flattened into the matrix's rows); `False` for biases and norm
    parameters; `True` (the last two axes, Muon's default) for every other float
    leaf with two dimensions, such as an `eqx.nn.Embedding`'s `(vocabulary,
    features)` weight; `False` for the other float leaves, and `None` for leaves
    that are not float arrays.

    Leading axes beyond a weight's own (layers stacked by `eqx.filter_vmap`, for a
    scanned transformer) are a stack of matrices, each orthogonalised on its own.

    **Arguments:**

    - `model`: an Equinox model (any pytree).

    With `Partition` and `module_labels`, the mask covers the whole model and
    Muon reads it where it has leaves.

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import eqxopt

    conv = eqx.nn.Conv2d(3, 8, 3, key=jax.random.key(0))
    axes = eqxopt.matrix_axes(conv)
    assert axes.weight == eqxopt.MatrixAxes(reduction=(1, 2, 3), output=0)
    assert axes.bias is False
    ```
    """
    leaves, chains, treedef = _holders(model)
    out = []
    for leaf, chain in zip(leaves, chains):
        if not is_float_leaf(leaf):
            out.append(None)
            continue
        module: Any = None
        field = ""
        if chain:  # the innermost module holding the leaf, and its field
            module, field = chain[-1]
        category = _built_in(module, field)
        value: Any = leaf.ndim == 2 and category not in ("bias", "norm")
        if category == "hidden" and leaf.ndim >= 2:
            value = LINEAR_AXES
        elif category == "conv" and leaf.ndim >= 2 + module.num_spatial_dims:
            value = _conv_axes(module, leaf.ndim)
        out.append(value)
    return jax.tree.unflatten(treedef, out)
