"""The documentation site stays true: every ```python block of docs/*.md runs (the
blocks of a page in order, in one namespace), the API reference has an entry for every
public name, and every public name documents its arguments."""

import ast
import contextlib
import inspect
import pathlib
import re

import jax
import pytest

import eqxopt
from helpers import load_script

ROOT = pathlib.Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
# A block that cannot run says so on its first line, visibly, with the reason.
NOT_RUN = "# not run:"


def python_blocks(page: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


def test_docs_have_python_blocks():
    pages = [page.name for page in PAGES if python_blocks(page)]
    assert {"getting-started.md", "concepts.md", "cookbook.md"} <= set(pages)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.stem)
def test_docs_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write files (plots, checkpoints)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for index, block in enumerate(python_blocks(page)):
        if block.startswith(NOT_RUN):
            continue
        # optax promotes dtypes implicitly: a block that runs it runs under
        # standard promotion (the tests' strict promotion is eqxopt's promise).
        promotion = (
            jax.numpy_dtype_promotion("standard")
            if "optax." in block
            else contextlib.nullcontext()
        )
        try:
            with promotion:
                exec(compile(block, f"{page.name} block {index}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(
                f"{page.name} block {index} failed:\n{block}"
            ) from error


# The FAQ shows the mistake on purpose, in a function whose `def` line says so.
SHOWS_THE_MISTAKE = "# the trap"


def _optimizers_closed_over(block: str) -> list[str]:
    """Jitted functions of a block that call `.init`/`.update`/`.step` on a name they
    neither take as an argument nor assign: an optimizer closed over."""
    found = []
    lines = block.splitlines()
    for node in ast.walk(ast.parse(block)):
        if not isinstance(node, ast.FunctionDef) or not any(
            "jit" in ast.unparse(decorator) for decorator in node.decorator_list
        ):
            continue
        if SHOWS_THE_MISTAKE in lines[node.lineno - 1]:
            continue
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        local = {argument.arg for argument in arguments} | {
            name.id
            for name in ast.walk(node)
            if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store)
        }
        for call in ast.walk(node):
            if (
                isinstance(call, ast.Attribute)
                and call.attr in ("init", "update", "step")
                and isinstance(call.value, ast.Name)
                and call.value.id not in local
            ):
                found.append(f"{node.name} uses a global {call.value.id}.{call.attr}")
    return found


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *PAGES], ids=lambda page: page.stem
)
def test_jitted_steps_take_the_optimizer_as_an_argument(page):
    """A jitted step that closes over a global optimizer bakes its hyperparameters in
    at the first trace: rebinding the global afterwards silently changes nothing. The
    examples a reader copies pass the optimizer in."""
    found = [
        f"{page.name} block {index}: {finding}"
        for index, block in enumerate(python_blocks(page))
        for finding in _optimizers_closed_over(block)
    ]
    assert found == []


def test_all_lists_every_public_name():
    public = {
        name
        for name, value in vars(eqxopt).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert sorted(eqxopt.__all__) == eqxopt.__all__
    assert set(eqxopt.__all__) == public


def test_api_reference_covers_every_public_name():
    entries = []
    for page in sorted((DOCS / "api").glob("*.md")):
        entries += re.findall(r"^::: eqxopt\.(\w+)$", page.read_text(), re.M)
    assert sorted(entries) == sorted(set(entries)), "a name has two API entries"
    assert set(entries) == set(eqxopt.__all__)


@pytest.mark.parametrize("name", eqxopt.__all__)
def test_public_name_documents_its_arguments(name):
    obj = getattr(eqxopt, name)
    doc = inspect.getdoc(obj)
    assert doc, f"eqxopt.{name} has no docstring"
    parameters = [p for p in inspect.signature(obj).parameters if p != "self"]
    if parameters:
        assert "**Arguments:**" in doc or "**Fields:**" in doc, (
            f"eqxopt.{name} takes {parameters} but its docstring has no "
            "**Arguments:** (or, for a state, **Fields:**) list"
        )


def _public_functions(module) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and name[0].islower() and callable(value)
    }


def test_optax_migration_names_every_optax_function():
    """Every function of optax (optimizers, schedules, transforms, contrib) is on
    the page, mapped or marked missing (optax's own names, from the installed one)."""
    optax = pytest.importorskip("optax")
    contrib = pytest.importorskip("optax.contrib")

    page = (DOCS / "migrating-optax.md").read_text()
    names = set()
    for module in (optax, contrib, optax.schedules, optax.transforms):
        names |= _public_functions(module)
    # as code: `optax.name`, `optax.name(...)`, or `name` in a list of names
    missing = [name for name in names if not re.search(rf"[.`\s]{name}[`(]", page)]
    assert sorted(missing) == []


def test_torch_migration_names_every_torch_optimizer_and_scheduler():
    torch = pytest.importorskip("torch")
    page = (DOCS / "migrating-torch.md").read_text()
    names = set(torch.optim.__all__) | set(torch.optim.lr_scheduler.__all__)
    assert sorted(name for name in names if name not in page) == []


def test_catalog_page_is_current():
    """docs/catalog.md is what docs/make_catalog.py writes from today's docstrings."""
    make_catalog = load_script("docs/make_catalog.py")
    assert (DOCS / "catalog.md").read_text() == make_catalog.render(), (
        "docs/catalog.md is out of date: run `python docs/make_catalog.py`"
    )
    names = [entry[0] for entry in make_catalog.CATALOG]
    optimizers = [
        name
        for name in eqxopt.__all__
        if isinstance(getattr(eqxopt, name), type)
        and issubclass(getattr(eqxopt, name), eqxopt.AbstractTransform)
    ]
    # every optimizer has an entry; the rest of the transforms are wrappers and links
    wrappers = {
        "AbstractTransform", "AddDecayedWeights", "AddNoise", "AdaptiveGradClip",
        "Centralize", "Chain",
        "ClipByBlockRMS", "ClipByGlobalNorm", "ClipByValue", "DecoupledWeightDecay",
        "DifferentiallyPrivateAggregate",
        "Freeze", "FromOptax", "KahanSummation", "Lookahead", "Masked", "MultiSteps",
        "ErrorCorrection",
        "DiLoCo",
        "ParamEMA", "Partition", "ReduceOnPlateau", "SkipNonFinite",
        "StochasticRounding", "ZeroNans",
        # the building blocks (_transforms/_blocks.py)
        "AbstractBlock", "Identity", "ScaleByAdam", "ScaleByLearningRate",
        "ScaleByRms", "ScaleBySign", "ScaleByTrustRatio", "Stateless", "Trace",
        "LearningRateMultipliers", "Maximize", "SkipLargeUpdates", "Monitor",
        # optax's other transforms (issue 28)
        "EMA", "KeepParamsNonnegative", "Snapshot", "MeasureWithEMA",
        "ConditionallyTransform", "ConditionallyMask", "NormalizeByUpdateNorm",
        "SplitRealAndImaginary", "ScaleByBacktrackingLinesearch",
        # QK-clip around any optimizer (MuonClip is its catalog entry)
        "QKClip",
        # the state in host memory around any optimizer
        "OffloadState",
    }  # fmt: skip
    assert sorted(set(optimizers) - wrappers) == sorted(names)


def test_catalog_opens_with_a_table_of_families_linking_every_entry():
    """Above the entries, a table a reader scans on a screen or two: one row per
    family, each linking its optimizers' entries."""
    make_catalog = load_script("docs/make_catalog.py")
    page = (DOCS / "catalog.md").read_text()
    overview = page.split("\n## ", 1)[0]
    rows = re.findall(r"^\| \[([^\]]+)\]\(#[\w-]+\) \| (.*) \|$", overview, re.M)
    families = {entry[1] for entry in make_catalog.CATALOG}
    assert len(rows) == len(families) <= 12
    linked = re.findall(r"\[`(\w+)`\]\(#(\w+)\)", overview)
    assert sorted(name for name, _ in linked) == sorted(
        entry[0] for entry in make_catalog.CATALOG
    )
    assert all(f"\n### {name}\n" in page for name, _ in linked)


def test_schedules_page_has_every_schedule_and_plot():
    page = (DOCS / "schedules.md").read_text()
    schedules = [
        name
        for name in eqxopt.__all__
        if isinstance(getattr(eqxopt, name), type)
        and issubclass(getattr(eqxopt, name), eqxopt.AbstractSchedule)
        and name != "AbstractSchedule"
    ]
    assert [name for name in schedules if f"\n## {name}\n" not in page] == []
    plots = {path.name for path in (DOCS / "schedules").glob("*.png")}
    shown = set(re.findall(r"\(schedules/([\w-]+\.png)\)", page))
    assert plots == shown
