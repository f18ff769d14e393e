"""`RealOnly`: a transform's declaration that it takes real float leaves only."""

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

from ._checks import reject_complex


@dataclasses.dataclass(frozen=True)
class RealOnly:
    """Declares, as the class attribute `real_only = RealOnly(why)`, that a transform
    takes real float leaves only: its rule has no complex meaning (`why` says which
    part of it, for the error).

    The declaration is checked where the transform takes leaves: its `init` (the
    parameters) and each update (its `transform` and `transform_step`, or, for an
    engine transform, the `run` that serves both), before anything changes. A
    complex leaf of the trees named in `trees` (`"params"`, `"grads"`) is a
    `TypeError` naming the leaf and the transform (`_checks.reject_complex`). With
    `when`, the name of a bool field, only instances where it is true are real-only.
    """

    why: str
    trees: tuple[str, ...] = dataclasses.field(default=("params",), kw_only=True)
    when: str | None = dataclasses.field(default=None, kw_only=True)

    def __set_name__(self, owner: type, name: str) -> None:
        # Runs as the class is made (before `AbstractTransform.__init_subclass__`
        # wraps its `init` to place the state), so the check comes first.
        methods = ["run"] if hasattr(owner, "run") else ["transform", "transform_step"]
        for method in ["init", *methods]:
            setattr(
                owner, method, self._checking(inspect.getattr_static(owner, method))
            )

    def check(self, opt: Any, trees: dict[str, Any]) -> None:
        """Raises if `opt` is real-only and a tree in `trees` has a complex leaf."""
        if self.when is not None and not getattr(opt, self.when):
            return
        owner = type(opt).__name__
        if self.when is not None:
            owner += f"({self.when}=True)"
        for tree_name in self.trees:
            if tree_name in trees:
                reject_complex(trees[tree_name], tree_name, owner, self.why)

    def _checking(self, method: Any) -> Callable:
        function = getattr(method, "method", method)  # Equinox's method wrapper
        signature = inspect.signature(function)

        @functools.wraps(function)
        def checked(opt: Any, *args: Any, **kwargs: Any) -> Any:
            self.check(opt, signature.bind(opt, *args, **kwargs).arguments)
            return method.__get__(opt, type(opt))(*args, **kwargs)

        return checked
