"""The package's shape: every public module class is abstract or final, the top-level
`__init__.py` only re-exports (and loads the optional native backend), no import
cycles between eqxopt's modules or between its subpackages (lazy imports inside
functions included), nothing but the package's `__init__.py` imports the native
backend, and JAX's internals are reached from the native backend only. Everything
here reads the source with `ast` or inspects the public classes."""

import ast
import importlib
import inspect
import pathlib
import pkgutil
import sys

import equinox as eqx
import pytest

import eqxopt

SRC = pathlib.Path(eqxopt.__file__).resolve().parent
# The one place allowed to use JAX's internal APIs (`jax._src`, `jax.core`,
# `jax.extend`): the native backend and its compatibility module.
NATIVE = SRC / "_native"
JAX_INTERNALS = ("jax._src", "jax.core", "jax.extend")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> dict[str, pathlib.Path]:
    """Every module of the package, by dotted name."""
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


MODULES = source_files()


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def resolve(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module an `ImportFrom` reads from."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(name: str) -> set[str]:
    """The eqxopt modules `name` imports anywhere in its body (top level, functions,
    `TYPE_CHECKING` blocks alike): `from X import y` counts as importing `X.y` when
    that is a module, else `X`."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            origin = resolve(name, node)
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                found.add(sub if sub in MODULES else origin)
    return {m for m in found if m in MODULES and m != name}


def test_every_public_module_class_is_abstract_or_final():
    for sub in pkgutil.walk_packages([str(SRC)], prefix="eqxopt."):
        importlib.import_module(sub.name)
    ours = {
        cls
        for mod in list(sys.modules.values())
        if getattr(mod, "__name__", "").startswith("eqxopt")
        for cls in vars(mod).values()
        if inspect.isclass(cls) and cls.__module__.startswith("eqxopt")
    }
    problems = []
    for name in eqxopt.__all__:
        cls = getattr(eqxopt, name)
        if not (inspect.isclass(cls) and issubclass(cls, eqx.Module)):
            continue
        abstract = (
            name.startswith("Abstract")
            or inspect.isabstract(cls)
            or bool(getattr(cls, "__abstractvars__", ()))
            or bool(getattr(cls, "__abstractclassvars__", ()))
        )
        if abstract:
            continue
        children = sorted(
            f"{c.__module__}.{c.__qualname__}"
            for c in ours
            if c is not cls and issubclass(c, cls)
        )
        if children:
            problems.append(f"{name} is concrete but subclassed by {children}")
    assert not problems, "\n".join(problems)


def test_init_only_reexports():
    path = SRC / "__init__.py"
    tree = ast.parse(path.read_text())
    reexported = set()
    problems = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Try) and ast.unparse(node.body[0]) == (
            "from ._native import NativeBackend as _NativeBackend"
        ):
            continue  # the optional native backend, which registers itself
        if ast.unparse(node) == "from . import extend as extend":
            continue  # the one public submodule: the authoring API
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if not (node.module or "").startswith("_"):
                problems.append(f"line {node.lineno}: import from a public module")
            for alias in node.names:
                if alias.asname != alias.name:
                    problems.append(
                        f"line {node.lineno}: {alias.name} is not re-exported as "
                        f"itself (`{alias.name} as {alias.name}`)"
                    )
                reexported.add(alias.asname or alias.name)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom) and all(
            (getattr(node, "module", None) or alias.name).startswith("importlib")
            for alias in node.names
        ):
            continue  # `__version__` from the package metadata
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if names <= {"__all__", "__version__"}:
                continue
        problems.append(f"line {node.lineno}: {ast.unparse(node)[:60]!r}")
    assert not problems, "\n".join(problems)
    public = {n for n in reexported if not n.startswith("_")}
    assert set(eqxopt.__all__) == public, (
        sorted(set(eqxopt.__all__) - public),
        sorted(public - set(eqxopt.__all__)),
    )
    for name in eqxopt.__all__:
        obj = getattr(eqxopt, name)
        origin = getattr(obj, "__module__", "") or ""
        assert origin.startswith("eqxopt._"), (name, origin)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_find_cycles_sees_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = {name: imported_modules(name) for name in MODULES}
    cycles = find_cycles(graph)
    described = [
        " <-> ".join(c)
        + "\n    "
        + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
        for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def subpackage(module: str) -> str:
    """The subpackage a module belongs to (`eqxopt._core._base` -> `eqxopt._core`);
    a module directly under `eqxopt` is its own."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycles_between_subpackages():
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        if name == "eqxopt":
            continue  # the package's __init__ re-exports everything
        here = subpackage(name)
        graph.setdefault(here, set())
        graph[here] |= {
            subpackage(m) for m in imported_modules(name) if m != "eqxopt"
        } - {here}
    cycles = find_cycles(graph)
    assert not cycles, f"subpackages that import each other: {cycles}"


def test_nothing_but_the_package_imports_the_native_backend():
    """The core, the optimizers, transforms and wrappers work on public JAX alone;
    the native CPU kernels plug in through `_core/_backend.py` when the package's
    `__init__.py` imports them."""
    importers = sorted(
        name
        for name in MODULES
        if name != "eqxopt"
        and subpackage(name) != "eqxopt._native"
        and any(subpackage(m) == "eqxopt._native" for m in imported_modules(name))
    )
    assert importers == []


def test_the_subpackage_check_sees_a_cycle():
    assert subpackage("eqxopt._core._base") == "eqxopt._core"
    assert subpackage("eqxopt._train_step") == "eqxopt._train_step"
    graph = {"eqxopt._core": {"eqxopt._native"}, "eqxopt._native": {"eqxopt._core"}}
    assert find_cycles(graph) == [["eqxopt._core", "eqxopt._native"]]


def jax_internals_used(path: pathlib.Path) -> list[str]:
    """`line: what` for each import or attribute path into JAX's internals."""
    tree = ast.parse(path.read_text(), filename=str(path))
    hits = []

    def internal(dotted: str) -> bool:
        return any(dotted == p or dotted.startswith(p + ".") for p in JAX_INTERNALS)

    inner = {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)
    }
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if not internal(node.module):
                names += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            parts = []
            value: ast.expr = node
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id == "jax":
                names = [".".join(["jax", *reversed(parts)])]
        hits += [f"{node.lineno}: {n}" for n in names if internal(n)]
    return sorted(set(hits))


def test_jax_internals_only_in_the_native_backend():
    used = {
        str(path.relative_to(SRC.parent)): found
        for path in sorted(SRC.rglob("*.py"))
        if NATIVE not in path.parents
        if (found := jax_internals_used(path))
    }
    assert not used, used


# Reading an error's wording (`"..." in str(error)`, `str(error).startswith(...)`,
# `re.search(..., str(error))`) ties the code to a library's messages, which change
# without notice: outside the native backend's compatibility module, errors are
# recognised by their types and the inputs are read instead.
_TEXT_METHODS = {"find", "index", "count", "startswith", "endswith", "rfind"}


def error_text_matched(path: pathlib.Path) -> list[str]:
    """`line: what` where an exception's text is compared or searched, or a string
    names a module of JAX's internals (`logging.getLogger("jax._src....")`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {
        h.name for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.name
    }
    parents = {
        id(child): node
        for node in ast.walk(tree)
        for child in ast.iter_child_nodes(node)
    }

    def text_of_error(node: ast.AST) -> bool:
        # `str(error)`, `repr(error)` or `error.args[...]` for a caught `error`.
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
            "str",
            "repr",
        ):
            return any(isinstance(a, ast.Name) and a.id in names for a in node.args)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            value = node.value
            return value.attr == "args" and getattr(value.value, "id", "") in names
        return False

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(p in node.value for p in ("jax._src", "jaxlib._jax")):
                hits.append(f"{node.lineno}: a string naming JAX's internals")
            continue
        if not text_of_error(node):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Compare) and any(
            isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)) for op in parent.ops
        ):
            hits.append(f"{node.lineno}: an error's text compared")
        elif isinstance(parent, ast.Attribute) and parent.attr in _TEXT_METHODS:
            hits.append(f"{node.lineno}: an error's text searched")
        elif isinstance(parent, ast.Call) and getattr(parent.func, "attr", "") in (
            "search",
            "match",
            "fullmatch",
            "findall",
        ):
            hits.append(f"{node.lineno}: an error's text matched")
    return sorted(set(hits))


def test_errors_are_recognised_by_type_not_by_their_text():
    used = {
        str(path.relative_to(SRC.parent)): found
        for path in sorted(SRC.rglob("*.py"))
        if path != NATIVE / "_compat.py"
        if (found := error_text_matched(path))
    }
    assert not used, used


@pytest.mark.parametrize(
    "source",
    [
        "try:\n    f()\nexcept ValueError as e:\n    if 'x' in str(e): pass",
        "try:\n    f()\nexcept ValueError as e:\n    str(e).find('x')",
        "try:\n    f()\nexcept ValueError as e:\n    re.search('x', str(e))",
        "try:\n    f()\nexcept ValueError as e:\n    ok = e.args[0] == 'x'",
        "import logging\nlogging.getLogger('jax._src.callback')",
    ],
)
def test_the_error_text_check_sees_each_form(tmp_path, source):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert error_text_matched(path)


def test_the_error_text_check_passes_messages_that_quote_an_error(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "try:\n    f()\nexcept ValueError as e:\n"
        "    raise TypeError(f'{e} (while stepping)') from e"
    )
    assert not error_text_matched(path)


@pytest.mark.parametrize(
    "source",
    [
        "import jax._src.core",
        "from jax.extend import core",
        "from jax import core",
        "import jax\nx = jax.core.Primitive",
        "import jax\nx = jax.extend.core.Primitive('p')",
    ],
)
def test_the_internals_check_sees_each_form(tmp_path, source):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert jax_internals_used(path)


def test_the_internals_check_passes_public_jax(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import jax\nimport jax.numpy as jnp\nx = jax.tree.map")
    assert not jax_internals_used(path)


# Reductions over leaves in a fixed float32, whatever the leaves' precision: a
# float64 model (under jax_enable_x64) then gets float32 norms and sums, 1e-8 off
# optax's float64 run at every step. Sums over leaves go through `_core/_norms.py`
# (`sum_of_squares`, `reduction_dtype`), which follows the leaves.
REDUCTIONS = frozenset(
    {
        "sum", "mean", "prod", "cumsum", "var", "std", "vdot", "dot", "inner",
        "tensordot", "einsum", "matmul", "norm", "sum_of_squares", "shard_total",
        "psum",
    }
)  # fmt: skip


def _is_float32(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "float32") or (
        isinstance(node, ast.Constant) and node.value == "float32"
    )


def _called(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def fixed_precision_reductions(path: pathlib.Path) -> list[str]:
    """`line: what` for each reduction given float32 as its dtype, and each
    reduction's result cast to float32."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = _called(node.func)
        arguments = [*node.args, *(k.value for k in node.keywords)]
        if name in REDUCTIONS and any(_is_float32(a) for a in arguments):
            hits.append(f"{node.lineno}: {name}(..., float32)")
        receiver = getattr(node.func, "value", None)
        if (
            name == "astype"
            and node.args
            and _is_float32(node.args[0])
            and isinstance(receiver, ast.Call)
            and _called(receiver.func) in REDUCTIONS
        ):
            hits.append(f"{node.lineno}: {_called(receiver.func)}(...).astype(float32)")
    return hits


def test_reductions_follow_the_leaves_precision():
    # Issue 39, item 10: SAM's gradient norm and PolyakSGD's were float32 sums.
    found = {
        str(path.relative_to(SRC.parent)): hits
        for path in sorted(SRC.rglob("*.py"))
        if (hits := fixed_precision_reductions(path))
    }
    assert not found, found


@pytest.mark.parametrize(
    "source",
    [
        "import jax.numpy as jnp\nx = jnp.sum(jnp.abs(g)).astype(jnp.float32)",
        "x = shard_total(squares, axis_name, 'SAM', jnp.float32)",
        "x = sum_of_squares(floats, None, 'PolyakSGD', jnp.float32)",
        "import numpy as np\nx = np.sum(g, dtype=np.float32)",
        "x = jnp.vdot(a, b).astype('float32')",
    ],
)
def test_the_precision_check_sees_each_form(tmp_path, source):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert fixed_precision_reductions(path)


def test_the_precision_check_passes_reductions_in_the_leaves_dtype(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "x = jnp.sum(g.astype(compute_dtype(g.dtype)))\n"
        "n = jnp.sum(mask, dtype=jnp.int32)\n"
        "y = sum_of_squares(leaves, None, 'Monitor')\n"
        "z = step.astype(jnp.float32)\n"
    )
    assert not fixed_precision_reductions(path)
