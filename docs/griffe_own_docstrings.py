"""A griffe extension for the API reference: an entry shows only text written for it.

The reference is built by inspecting the imported package (`force_inspection`, since
some docstrings are assembled at import time). Inspection reads `__doc__` off every
runtime value, so a class attribute such as `elementwise = True` or `eps = 1e-8`
would show the docstring of `bool` or `float`, a class attribute holding a class
(`state_type = AdamState`) would list that class again under the optimizer, and a
generated `__init__` carrying `object.__init__`'s text would add "Initialize self.
See help(type(self))..." to its class (`merge_init_into_class`). None of that
describes eqxopt. So:

- an inspected attribute has no docstring (Python attributes have none of their
  own), and so, undocumented, is not listed;
- a class member that is a class defined elsewhere (a reference, not a nested
  class) is dropped;
- a function keeps its docstring only if it is Python code documented for itself,
  not a builtin's text or the text of `object`'s method of the same name;
- a default that is `dataclasses.MISSING` (the field helpers of `eqxopt.extend`)
  shows as that name, not as the object's `repr` with its memory address, so the
  signature is Python that can be laid out on several lines.
"""

import inspect
from typing import Any

import griffe


def _is_python_code(obj: Any) -> bool:
    if isinstance(obj, property):
        obj = obj.fget
    if callable(obj):
        obj = inspect.unwrap(obj)
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return True
    # a callable object (a wrapper) documented for itself, not by its class
    return obj.__doc__ is not None and obj.__doc__ is not type(obj).__doc__


def _borrowed_text(name: str, docstring: str) -> bool:
    inherited = getattr(object, name, None)
    return inherited is not None and inspect.cleandoc(inherited.__doc__ or "") == (
        docstring
    )


class OwnDocstringsOnly(griffe.Extension):
    def on_attribute_instance(
        self, *, node: Any, attr: griffe.Attribute, **kwargs: Any
    ) -> None:
        if isinstance(node, griffe.ObjectNode):
            attr.docstring = None

    def on_function_instance(
        self, *, node: Any, func: griffe.Function, **kwargs: Any
    ) -> None:
        for parameter in func.parameters:
            if "dataclasses._MISSING_TYPE object" in str(parameter.default):
                parameter.default = "dataclasses.MISSING"
        if not isinstance(node, griffe.ObjectNode) or func.docstring is None:
            return
        if not _is_python_code(node.obj) or _borrowed_text(
            func.name, func.docstring.value
        ):
            func.docstring = None

    def on_class_members(self, *, node: Any, cls: griffe.Class, **kwargs: Any) -> None:
        if not isinstance(node, griffe.ObjectNode):
            return
        for name in list(cls.members):
            value = getattr(node.obj, name, None)
            nested = f"{node.obj.__qualname__}.{name}"
            if inspect.isclass(value) and value.__qualname__ != nested:
                cls.del_member(name)
