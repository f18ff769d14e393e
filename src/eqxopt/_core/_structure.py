"""Where two pytrees' structures part, in words (naming leaf paths): the one message
every structure check gives; and `FrozenTree`, a tree option held in a static
field. Depends on nothing else in eqxopt."""

from typing import Any

import jax
from jaxtyping import PyTree


def is_none(x: Any) -> bool:
    return x is None


def describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


def structure_mismatch(
    actual: PyTree, actual_name: str, expected: PyTree, expected_name: str
) -> ValueError:
    """A `ValueError` saying where two trees' structures part, by leaf path.

    `None` in `actual` stands for a whole absent subtree of `expected`."""
    actual_items = jax.tree.leaves_with_path(actual, is_leaf=is_none)
    expected_items = jax.tree.leaves_with_path(expected, is_leaf=is_none)
    actual_paths = [jax.tree_util.keystr(p) for p, _ in actual_items]
    expected_paths = [jax.tree_util.keystr(p) for p, _ in expected_items]
    covered = set(actual_paths)

    def is_covered(path: str) -> bool:
        return any(path == a or path.startswith(a) for a in covered)

    missing = [p for p in expected_paths if not is_covered(p)]
    extra = [p for p in actual_paths if p not in set(expected_paths)]
    parts = []
    if missing:
        parts.append(f"{expected_name} has {_few(missing)} that {actual_name} lacks")
    if extra:
        parts.append(f"{actual_name} has {_few(extra)} that {expected_name} lacks")
    if not parts and actual_paths == expected_paths:
        # The same paths: the trees part where one has None (no subtree) and the
        # other a leaf, which the printed tree structures do not show.
        for path, (_, a), (_, e) in zip(actual_paths, actual_items, expected_items):
            if (a is None) != (e is None):
                parts.append(
                    f"at {path or '<root>'} {actual_name} has {_what(a)} where "
                    f"{expected_name} has {_what(e)}"
                )
                break
    if not parts:
        parts.append(
            f"the containers differ: {actual_name} is "
            f"{_short(jax.tree.structure(actual, is_leaf=is_none))}, {expected_name} "
            f"is {_short(jax.tree.structure(expected, is_leaf=is_none))}"
        )
    return ValueError(
        f"{actual_name} does not have the tree structure of {expected_name}: "
        + "; ".join(parts)
    )


def _what(x: Any) -> str:
    if x is None:
        return "None"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array ({describe(x)})"
    if callable(x):
        return f"the function {getattr(x, '__name__', type(x).__name__)}"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 40 else text[:40] + '...'}"


def _few(paths: list[str]) -> str:
    shown = ", ".join(p or "<root>" for p in paths[:3])
    return shown + (f" (and {len(paths) - 3} more)" if len(paths) > 3 else "")


def _short(treedef: Any) -> str:
    text = str(treedef)
    return text if len(text) <= 200 else text[:200] + "..."


class FrozenTree:
    """A tree of hashable leaves (a mask of bools, a tree of `PartitionSpec`s),
    frozen so it can sit in a static field: equal (and hashing equal) to any
    `FrozenTree` of the same `kind` with the same structure and leaves, so building
    the optimizer again with a new copy of the tree reuses the compiled step."""

    __slots__ = ("kind", "leaves", "treedef")

    def __init__(self, kind: str, treedef: Any, leaves: tuple[Any, ...]):
        self.kind = kind
        self.treedef = treedef
        self.leaves = leaves

    def tree(self) -> PyTree:
        return jax.tree.unflatten(self.treedef, self.leaves)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FrozenTree)
            and self.kind == other.kind
            and self.treedef == other.treedef
            and self.leaves == other.leaves
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.treedef, self.leaves))

    def __repr__(self) -> str:
        return f"{self.kind}({self.tree()!r})"


def state_shaped_leaves(grads: PyTree, state: PyTree) -> list[Any]:
    """Per leaf of `grads` (in `jax.tree.leaves` order, `None` counted as a leaf),
    what a part of `state` shaped like `grads` (a moment) holds at that place: an
    array, or the subtree of arrays where a `None` gradient stands for a subtree;
    `None` where no such part holds arrays there. What `update` without params
    reads a parameter's shape and dtype from where its gradient is `None`. Among
    several moments, one in a dtype of the gradients is preferred (a moment kept
    in another dtype by an option, such as `mu_dtype`, comes last)."""
    grad_def = jax.tree.structure(grads, is_leaf=is_none)
    count = grad_def.num_leaves
    found: list[list[Any]] = [[] for _ in range(count)]
    if jax.tree_util.treedef_is_leaf(grad_def):
        return [None] * count  # a bare array: every array in the state "matches"

    def visit(node: Any) -> None:
        try:
            parts = grad_def.flatten_up_to(node)
        except (ValueError, TypeError):
            children, node_def = jax.tree.flatten(node, is_leaf=lambda x: x is not node)
            if not jax.tree_util.treedef_is_leaf(node_def):
                for child in children:
                    visit(child)
            return
        for i, part in enumerate(parts):
            arrays = jax.tree.leaves(part)
            if arrays and all(isinstance(x, jax.Array) for x in arrays):
                found[i].append(part)

    visit(state)
    dtypes = {g.dtype for g in jax.tree.leaves(grads) if hasattr(g, "dtype")}

    def preferred(parts: list[Any]) -> Any:
        for part in parts:
            if all(x.dtype in dtypes for x in jax.tree.leaves(part)):
                return part
        return parts[0] if parts else None

    return [preferred(parts) for parts in found]
