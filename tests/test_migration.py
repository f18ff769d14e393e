"""The migration guides, row by row (their tables are data: docs/make_migration.py).

- The pages are what `docs/make_migration.py` writes.
- Every eqxopt name a row uses resolves; every optax and torch name a row lists
  exists; a "missing" row fails once eqxopt has the name.
- Every name of `optax.__all__`, `optax.contrib`, `torch.optim.__all__` and
  `torch.optim.lr_scheduler.__all__` has a row.
- Each optimizer, transform and schedule row gives its counterpart's numbers with
  the row's arguments (3 steps; schedules at every step shown), or differs where
  the row says so; a port by position gives optax's numbers or raises TypeError.
"""

import contextlib
import dataclasses
import inspect
import re
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import eqxopt
from helpers import load_script

MIGRATION = load_script("docs/make_migration.py")
Port, Call, Row, Missing, Inner = (
    MIGRATION.Port,
    MIGRATION.Call,
    MIGRATION.Row,
    MIGRATION.Missing,
    MIGRATION.Inner,
)

STEPS = 3
PARAMS = {
    "w": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3),
    "b": jnp.asarray([0.5, -0.3, 0.2], jnp.float32),
}
TARGET = {"w": jnp.full((4, 3), 0.3, jnp.float32), "b": jnp.zeros(3, jnp.float32)}


def loss(params):
    return sum(
        jnp.sum((p - t) ** 2) + 0.1 * jnp.sum((p - t) ** 4)
        for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(TARGET))
    )


STANDARD = jax.numpy_dtype_promotion("standard")  # optax and torch promote


def all_rows(side):
    tables = MIGRATION.OPTAX_TABLES if side == "optax" else MIGRATION.TORCH_TABLES
    return [row for rows in tables.values() for row in rows]


def rows_of(kind, side="optax"):
    return [row for row in all_rows(side) if isinstance(row, kind)]


def row_id(row):
    if isinstance(row, Port):
        return row.optax
    if isinstance(row, Call):
        return re.sub(r"\W+", "-", row.theirs)[:50]
    return "-".join(row.names)[:50]


def test_pages_are_current():
    for side, page in MIGRATION.PAGES.items():
        assert page.read_text() == MIGRATION.render(side), (
            f"{page.name} is out of date: run `python docs/make_migration.py`"
        )


# ------------------------------------------------------------------------ names


def resolve_eqxopt(name):
    """`X`, `X.method` or `State.field` of eqxopt."""
    head, *rest = name.split(".")
    assert head in eqxopt.__all__, f"eqxopt.{head} does not exist"
    obj = getattr(eqxopt, head)
    for part in rest:
        if dataclasses.is_dataclass(obj) and part in {
            f.name for f in dataclasses.fields(obj)
        }:
            return
        assert hasattr(obj, part), f"eqxopt.{name} does not exist"
        obj = getattr(obj, part)


def eqxopt_names(row):
    if isinstance(row, Port):
        inner = [a.eqxopt for a in row.args if isinstance(a, Inner)]
        return (row.eqxopt, *inner)
    if isinstance(row, Call):
        return row.names
    if isinstance(row, Row):
        return row.resolves
    return ()


@pytest.mark.parametrize("side", ["optax", "torch"])
def test_every_eqxopt_name_of_a_row_resolves(side):
    for row in all_rows(side):
        for name in eqxopt_names(row):
            resolve_eqxopt(name)


@contextlib.contextmanager
def optax_notices():
    """optax's notices about its own deprecated spellings (`optimistic_adam`, a
    missing `key=`) are not the port's concern."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


def optax_object(name):
    obj = optax
    with warnings.catch_warnings():  # names optax keeps for old code (`dpsgd`)
        warnings.simplefilter("ignore", DeprecationWarning)
        for part in name.split("."):
            assert hasattr(obj, part), f"optax.{name} does not exist"
            obj = getattr(obj, part)
    return obj


def optax_public_names():
    contrib = {
        f"contrib.{name}"
        for name, value in vars(optax.contrib).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    return set(optax.__all__) | contrib


def test_every_optax_name_has_a_row_and_every_row_names_optax():
    listed = [name for row in all_rows("optax") for name in MIGRATION.optax_names(row)]
    assert sorted(optax_public_names() - set(listed)) == []
    for name in listed:
        optax_object(name)
    assert len(listed) == len(set(listed)), "a name has two rows"


def torch_public_names():
    torch = pytest.importorskip("torch")
    return set(torch.optim.__all__) | set(torch.optim.lr_scheduler.__all__)


def torch_listed():
    listed = []
    for row in all_rows("torch")[len(MIGRATION.TORCH_CALLS) :]:
        if isinstance(row, Call):
            listed.append(re.match(r"\w+", row.theirs).group(0))
        else:
            listed.extend(row.names)
    return sorted(set(listed))


def test_every_torch_name_has_a_row():
    torch = pytest.importorskip("torch")
    listed = torch_listed()
    assert sorted(torch_public_names() - set(listed)) == []
    for name in listed:
        assert hasattr(torch.optim, name) or hasattr(torch.optim.lr_scheduler, name)


def _spelling(name):
    return name.split(".")[-1].replace("_", "").lower()


@pytest.mark.parametrize("side", ["optax", "torch"])
def test_missing_rows_are_missing_from_eqxopt(side):
    ours = {_spelling(name): name for name in eqxopt.__all__}
    for row in rows_of(Missing, side):
        for name in row.names:
            assert _spelling(name) not in ours, (
                f"the {side} guide calls {name} missing, but eqxopt has "
                f"{ours[_spelling(name)]}: give it a row"
            )


def test_the_guide_lists_every_renamed_argument():
    """The rename table is the classes' own (`renamed_arguments`), and each
    optax spelling is refused naming eqxopt's."""
    renamed = MIGRATION.renamed_arguments()
    assert len(renamed) >= 20
    page = MIGRATION.PAGES["optax"].read_text()
    for cls_name, key, _ in renamed:
        assert f"| `{cls_name}` | `{key}=`" in page


# ------------------------------------------------------------------------ numbers


PER_EXAMPLE = jnp.array([1.0, -0.5, 3.0, 0.25])


def run(init, update, apply, extra=None):
    """Parameters after each of `STEPS` steps on `loss` (gradients at the current
    parameters), with the keyword arguments `extra` names."""
    params, state, history = PARAMS, init(PARAMS), []
    for _ in range(STEPS):
        value, grads = jax.value_and_grad(loss)(params)
        kwargs = {}
        if extra == "value":
            kwargs = dict(value=value)
        elif extra == "lbfgs":
            kwargs = dict(value=value, value_fn=loss)
        elif extra == "obj_fn":
            kwargs = dict(obj_fn=loss)
        elif extra == "per_example":  # a batch of 4 examples' gradients
            grads = jax.tree.map(
                lambda g: g * PER_EXAMPLE.reshape((4,) + (1,) * g.ndim), grads
            )
        updates, state = update(grads, state, params, **kwargs)
        params = apply(params, updates)
        history.append(params)
    return history


def run_optax(tx, extra=None):
    def update(grads, state, params, **kwargs):
        if extra == "lbfgs":
            kwargs["grad"] = grads
        return tx.update(grads, state, params, **kwargs)

    with STANDARD:
        return run(tx.init, update, optax.apply_updates, extra)


def run_eqxopt(opt, extra=None):
    return run(opt.init, opt.update, eqxopt.apply_updates, extra)


def close(ours, theirs, rtol, atol, what):
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_allclose(
                np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                err_msg=f"{what}, step {step}",
            )  # fmt: skip


def moved(history, rtol, atol):
    """Some element moved by more than 10 tolerances (else any rule would pass)."""
    for start, end in zip(jax.tree.leaves(PARAMS), jax.tree.leaves(history[-1])):
        end = np.asarray(end, np.float64)
        if np.any(np.abs(end - np.asarray(start)) > 10 * (atol + rtol * np.abs(end))):
            return True
    return False


def schedule_values(schedule, steps):
    return np.asarray([float(schedule(jnp.asarray(k))) for k in range(steps)])


def _side_args(row, side, k=None):
    """The row's arguments for `side`: optax's defaults for `DEFAULT`, each
    library's own inner optimizer for an `Inner`."""
    signature = inspect.signature(optax_object(row.optax))
    names = list(signature.parameters)
    out = []
    for i, value in enumerate(row.args[:k]):
        if value is MIGRATION.DEFAULT:
            value = signature.parameters[names[i]].default
        elif isinstance(value, Inner):
            if side == "optax":
                value = optax_object(value.optax)(*value.args)
            else:
                value = getattr(eqxopt, value.eqxopt)(*value.args)
        out.append(value)
    return out


def keyword_port(row, k=None):
    """eqxopt's keyword arguments for the row's first `k` arguments: by optax's
    names, in eqxopt's spelling where the class's `renamed_arguments` has one;
    optax's defaults (`DEFAULT`) left to eqxopt's; an argument eqxopt has not
    must be at optax's default."""
    signature = inspect.signature(optax_object(row.optax))
    cls = getattr(eqxopt, row.eqxopt)
    ours = set(inspect.signature(cls).parameters)
    table = cls.renamed_arguments
    kwargs = {}
    given = list(zip(signature.parameters, row.args[:k], _side_args(row, "eqxopt", k)))
    if k is None:
        given += [(name, value, value) for name, value in row.kwargs.items()]
    for name, raw, value in given:
        spelling = table.get(name)
        split = isinstance(spelling, tuple) and (len(spelling) > 1 or name not in ours)
        if raw is MIGRATION.DEFAULT:
            continue
        if split and (name not in ours or isinstance(value, tuple)):
            parts = value if len(spelling) > 1 else (value,)
            kwargs.update(zip(spelling, parts))
        elif name in ours:
            kwargs[name] = value
        else:
            default = signature.parameters[name].default
            assert value is default or value == default, (
                f"the row passes {name}={value!r}, which eqxopt's {cls.__name__} "
                "has no argument for"
            )
    return kwargs


def numbers(obj, row, side):
    if isinstance(obj, eqxopt.AbstractSchedule) or (
        side == "optax" and row.eqxopt in SCHEDULES
    ):
        with STANDARD:
            return [schedule_values(obj, 20)]
    if side == "optax":
        return run_optax(obj, row.extra)
    return run_eqxopt(obj, row.extra)


SCHEDULES = {
    name
    for name in eqxopt.__all__
    if isinstance(getattr(eqxopt, name), type)
    and issubclass(getattr(eqxopt, name), eqxopt.AbstractSchedule)
}
PORTS = rows_of(Port)


@pytest.mark.parametrize("row", PORTS, ids=row_id)
def test_port_gives_optax_numbers(row):
    with optax_notices():
        tx = optax_object(row.optax)(*_side_args(row, "optax"), **row.kwargs)
    theirs = numbers(tx, row, "optax")
    opt = getattr(eqxopt, row.eqxopt)(**keyword_port(row))
    ours = numbers(opt, row, "eqxopt")
    if row.differs:
        with pytest.raises(AssertionError):
            close(ours, theirs, row.rtol, row.atol, row.optax)
        return
    close(ours, theirs, row.rtol, row.atol, row.optax)
    assert row.eqxopt in SCHEDULES or moved(theirs, row.rtol, row.atol), (
        f"optax.{row.optax} barely moves with the row's arguments"
    )


@pytest.mark.parametrize("row", PORTS, ids=row_id)
def test_positional_port_gives_optax_numbers_or_a_type_error(row):
    """`eqxopt.X(*args[:k])` for every `k` optax takes: optax's numbers (where the
    row says they differ, the keyword port's) or a `TypeError`; never other
    numbers, never another error."""
    cls = getattr(eqxopt, row.eqxopt)
    fn = optax_object(row.optax)
    for k in range(1, len(row.args) + 1):
        try:
            with optax_notices():
                theirs = fn(*_side_args(row, "optax", k))
        except TypeError:
            continue  # not a call optax takes (a required argument left out)
        try:
            ours = cls(*_side_args(row, "eqxopt", k))
        except TypeError:
            continue  # too many arguments by position, or one left out: loud
        expected = numbers(theirs, row, "optax")
        if row.differs:
            expected = numbers(cls(**keyword_port(row, k)), row, "eqxopt")
        close(numbers(ours, row, "eqxopt"), expected, row.rtol, row.atol, f"k={k}")
    # What eqxopt takes by position is a leading part of what optax takes so, by
    # the same names (or eqxopt's spelling of them).
    theirs_names = [
        cls.renamed_arguments.get(name, (name,))
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    ours_names = [
        name
        for name, p in inspect.signature(cls).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    assert len(ours_names) <= len(theirs_names), MIGRATION.positional(cls)
    for ours_name, spelling in zip(ours_names, theirs_names):
        assert ours_name in spelling, MIGRATION.positional(cls)


def _evaluate(text, namespace):
    with optax_notices():
        return eval(text.split(" = ", 1)[-1], namespace)  # a row's own call


def optax_calls():
    return [row for row in rows_of(Call) if row.values is not None]


@pytest.mark.parametrize("row", optax_calls(), ids=row_id)
def test_call_row_gives_optax_numbers(row):
    theirs = _evaluate(row.theirs, {"optax": optax, **row.values})
    ours = _evaluate(row.ours, {"eqxopt": eqxopt, **row.values})
    if isinstance(ours, eqxopt.AbstractSchedule):
        with STANDARD:
            expected = schedule_values(theirs, row.steps)
        np.testing.assert_allclose(
            schedule_values(ours, row.steps), expected, rtol=1e-6, atol=1e-7
        )
        return
    close(run_eqxopt(ours), run_optax(theirs), 2e-5, 2e-6, row.theirs)


# ------------------------------------------------------------------------ torch


def torch_calls(kind):
    tables = MIGRATION.TORCH_TABLES
    return [
        row for row in tables[kind] if isinstance(row, Call) and row.values is not None
    ]


def run_torch(make):
    torch = pytest.importorskip("torch")
    leaves, treedef = jax.tree.flatten(PARAMS)
    tensors = [torch.nn.Parameter(torch.tensor(np.asarray(x))) for x in leaves]
    opt = make(tensors)
    history = []
    for _ in range(STEPS):
        params = treedef.unflatten(
            [jnp.asarray(t.detach().numpy().copy()) for t in tensors]
        )
        grads = jax.grad(loss)(params)
        for t, g in zip(tensors, jax.tree.leaves(grads)):
            t.grad = torch.tensor(np.asarray(g))
        opt.step()
        history.append(
            treedef.unflatten([jnp.asarray(t.detach().numpy().copy()) for t in tensors])
        )
    return history


def eqxopt_namespace(values):
    return {**{n: getattr(eqxopt, n) for n in eqxopt.__all__}, **values}


@pytest.mark.parametrize("row", torch_calls("optimizers"), ids=row_id)
def test_torch_row_gives_torch_numbers(row):
    torch = pytest.importorskip("torch")
    namespace = {**vars(torch.optim), **row.values}
    theirs = run_torch(lambda params: eval(row.theirs, {**namespace, "params": params}))
    ours = run_eqxopt(eval(row.ours, eqxopt_namespace(row.values)))
    if row.differs:
        with pytest.raises(AssertionError):
            close(ours, theirs, 2e-5, 2e-6, row.theirs)
        return
    close(ours, theirs, 2e-5, 2e-6, row.theirs)
    assert moved(theirs, 2e-5, 2e-6)


@pytest.mark.parametrize("row", torch_calls("schedulers"), ids=row_id)
def test_torch_scheduler_row_gives_torch_learning_rates(row):
    torch = pytest.importorskip("torch")
    values = row.values
    base = values.get("lr", values.get("base_lr", values.get("max_lr")))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base, momentum=0.5)
    swa = {"swa_utils": torch.optim.swa_utils}  # SWALR is there
    namespace = {**vars(torch.optim.lr_scheduler), **swa, **values, "opt": opt}
    scheduler = eval(row.theirs, namespace)
    theirs = []
    for _ in range(row.steps):
        theirs.append(opt.param_groups[0][row.reads])  # "lr" or "momentum"
        opt.step()
        scheduler.step()
    ours = schedule_values(eval(row.ours, eqxopt_namespace(values)), row.steps)
    if row.differs:
        assert not np.allclose(ours, theirs, rtol=1e-5, atol=1e-7)
        return
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------- one-line swaps


@pytest.mark.parametrize(
    ("cls_name", "key", "advice"),
    MIGRATION.renamed_arguments(),
    ids=[f"{c}-{k}" for c, k, _ in MIGRATION.renamed_arguments()],
)
def test_optax_spelling_is_refused_naming_eqxopts(cls_name, key, advice):
    cls = getattr(eqxopt, cls_name)
    spelling = cls.renamed_arguments[key]
    # optax's form: a pair where eqxopt splits it (betas, DoG's init_step)
    value = (0.9, 0.99) if isinstance(spelling, tuple) and len(spelling) > 1 else 1
    with pytest.raises(TypeError, match=rf"^{cls_name} got {re.escape(key)}=") as error:
        cls(**{key: value})  # refused before anything else is checked
    assert str(error.value).endswith(f": {advice}"), str(error.value)


def test_every_refused_keyword_is_named_in_one_error():
    """optax's spellings and names a class does not take, all in one error, each
    with eqxopt's name: a ported call is fixed in one try."""
    with pytest.raises(TypeError) as error:
        eqxopt.WarmupCosine(
            peak_value=1.0, end_value=0.1, warmup_step=10, decay_steps=100
        )
    assert str(error.value) == (
        "WarmupCosine got 4 keyword arguments it does not take:\n"
        "  peak_value=: use peak_lr=\n"
        "  end_value=: use min_lr=\n"
        "  warmup_step=: use warmup_steps=\n"
        "  decay_steps=: use total_steps="
    )
    with pytest.raises(TypeError) as error:
        eqxopt.AdamW(lr=1e-3, betas=(0.9, 0.99), epsilon=1e-8, weight_decay=0.1)
    assert str(error.value) == (
        "AdamW got 3 keyword arguments it does not take:\n"
        "  lr=: use learning_rate=\n"
        "  betas=: use b1= and b2=\n"
        "  epsilon=: use eps="
    )
    # One, alone: the same form as one of optax's spellings.
    with pytest.raises(TypeError, match=r"^Chain got nmes=: use names=$"):
        eqxopt.Chain(eqxopt.SGD(0.1), nmes=["sgd"])
    with pytest.raises(
        TypeError,
        match=r"^Constant got colour=: not an argument; the arguments are value=$",
    ):
        eqxopt.Constant(1.0, colour="red")


def test_update_without_params_as_equinox_examples_write_it():
    """optax's `update(grads, state)`, as Equinox's own examples call it, on a
    whole model: the same updates as with the model, for optax's transforms
    AdamW's weight decay needs the parameters, and so does an optax transformation
    through `from_optax` (nothing says whether it reads them: given zeros for them
    it could silently decay nothing)."""
    import equinox as eqx

    model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3)) ** 2))(model)
    for opt in (
        eqxopt.SGD(0.1, momentum=0.9),
        eqxopt.Adam(1e-2),
        eqxopt.AdaBelief(1e-2),
        eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.Adam(1e-2)),
    ):
        state = opt.init(model)
        with_params = opt.update(grads, state, model)
        without = opt.update(grads, state)
        for a, b in zip(jax.tree.leaves(with_params), jax.tree.leaves(without)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    opt = eqxopt.AdamW(1e-2)
    with pytest.raises(
        TypeError,
        match=r"^AdamW\.update\(grads, state\) was called without params, which are "
        r"read by AdamW's weight_decay: call update\(grads, state, params\)$",
    ):
        opt.update(grads, opt.init(model))
    assert eqxopt.AdamW(1e-2, weight_decay=0.0).params_needed() is None
    chain = eqxopt.Chain(eqxopt.Adam(1e-2), eqxopt.AddDecayedWeights(0.1))
    assert chain.params_needed() == "AddDecayedWeights's weight_decay"
    for tx in (optax.adam(1e-2), optax.adamw(1e-2)):
        wrapped = eqxopt.Chain(eqxopt.from_optax(tx), eqxopt.Identity())
        with (
            STANDARD,
            pytest.raises(
                TypeError,
                match=r"called without params, which are read by FromOptax's optax "
                r"transformation, which may read them",
            ),
        ):
            wrapped.update(grads, wrapped.init(model))


# ---------------------------------------------------------- code that reads the state


def _state_row(theirs):
    (row,) = [row for row in MIGRATION.OPTAX_STATE if row.theirs == theirs]
    return row


def test_the_step_count_is_read_as_the_guide_says():
    """optax's `tree.get(state, "count")` finds nothing in an eqxopt state (it
    returns `None`, as the row says); the guide's `tree_get(state, "step")` reads
    what optax's reads on optax's state."""
    row = _state_row('optax.tree.get(state, "count")')
    tx, opt = optax.adam(1e-2), eqxopt.Adam(1e-2)
    tx_state, state = tx.init(PARAMS), opt.init(PARAMS)
    grads = jax.grad(loss)(PARAMS)
    for _ in range(STEPS):
        with STANDARD:
            _, tx_state = tx.update(grads, tx_state, PARAMS)
        _, state = opt.update(grads, state, PARAMS)
    theirs = _evaluate(row.theirs, {"optax": optax, "state": tx_state})
    assert int(theirs) == STEPS
    assert int(_evaluate(row.ours, {"eqxopt": eqxopt, "state": state})) == STEPS
    assert _evaluate(row.theirs, {"optax": optax, "state": state}) is None
    with pytest.raises(KeyError, match=r"eqxopt's states count updates in 'step'"):
        eqxopt.tree_get(state, "count")


def rosenbrock(params):
    v = params["x"]
    return jnp.sum(100.0 * (v[1:] - v[:-1] ** 2) ** 2 + (1.0 - v[:-1]) ** 2)


def test_lbfgs_value_and_grad_from_state_as_the_guide_says():
    """optax's L-BFGS loop with `value_and_grad_from_state`, and the same loop
    with the guide's `opt.value_and_grad`: the same values and gradients, each
    reusing the linesearch's (optax's finds nothing in eqxopt's state)."""
    row = _state_row("optax.value_and_grad_from_state(f)(params, state=state)")
    start = {"x": jnp.array([-1.2, 1.0, 0.5])}
    tx, opt = optax.lbfgs(), eqxopt.LBFGS()
    tx_params, tx_state = start, tx.init(start)
    params, state = start, opt.init(start)
    calls = []

    def counted(params):
        calls.append(None)  # one per trace or evaluation outside the linesearch
        return rosenbrock(params)

    for _ in range(5):
        theirs = _evaluate(
            row.theirs,
            {"optax": optax, "f": rosenbrock, "params": tx_params, "state": tx_state},
        )
        ours = _evaluate(
            row.ours, {"opt": opt, "f": counted, "params": params, "state": state}
        )
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5)
        np.testing.assert_allclose(ours[1]["x"], theirs[1]["x"], rtol=1e-4, atol=1e-5)
        with STANDARD:
            updates, tx_state = tx.update(
                theirs[1], tx_state, tx_params,
                value=theirs[0], grad=theirs[1], value_fn=rosenbrock,
            )  # fmt: skip
        tx_params = optax.apply_updates(tx_params, updates)
        params, state = opt.step(
            ours[1], state, params, value=ours[0], value_fn=rosenbrock
        )
        np.testing.assert_allclose(params["x"], tx_params["x"], rtol=1e-4, atol=1e-5)
    # After the first update the value and gradient come from the state.
    assert float(state.value) == pytest.approx(float(rosenbrock(params)), rel=1e-6)
    with pytest.raises(ValueError, match="Value or gradient not found in the state"):
        optax.value_and_grad_from_state(rosenbrock)(params, state=state)


def test_hyperparameters_are_read_and_set_as_the_guide_says():
    """`state.hyperparams` of `optax.inject_hyperparams`, read and set, against
    the guide's `hyperparameters(opt, state)` and `dataclasses.replace`."""
    read = _state_row('state.hyperparams["learning_rate"]')
    write = _state_row('state.hyperparams["learning_rate"] = lr')

    def replaced(opt, lr):
        namespace = {"dataclasses": dataclasses, "opt": opt, "lr": lr}
        return eval(write.ours.split(" = ", 1)[1], namespace)

    # Set: a new learning rate after the second step, on both sides.
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2)
    opt = eqxopt.AdamW(1e-2)
    tx_params, tx_state, params, state = PARAMS, tx.init(PARAMS), PARAMS, None
    state = opt.init(PARAMS)
    for step in range(STEPS):
        with STANDARD:
            updates, tx_state = tx.update(
                jax.grad(loss)(tx_params), tx_state, tx_params
            )
        tx_params = optax.apply_updates(tx_params, updates)
        params, state = opt.step(jax.grad(loss)(params), state, params)
        if step == 1:
            tx_state.hyperparams["learning_rate"] = jnp.asarray(5e-3)
            opt = replaced(opt, 5e-3)
    close([params], [tx_params], 2e-5, 2e-6, "after a new learning rate")
    with pytest.raises(ValueError, match="learning_rate"):
        replaced(opt, -1.0)
    # Read: optax's holds the value the last update used, eqxopt's the next one's.
    schedule = optax.linear_schedule(1e-2, 1e-3, 10)
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=schedule)
    opt = eqxopt.AdamW(eqxopt.Linear(1e-2, 1e-3, 10))
    tx_state, state = tx.init(PARAMS), opt.init(PARAMS)
    grads = jax.grad(loss)(PARAMS)
    for _ in range(STEPS):
        with STANDARD:
            _, tx_state = tx.update(grads, tx_state, PARAMS)
        _, state = opt.update(grads, state, PARAMS)
    theirs = eval(read.theirs, {"state": tx_state})
    ours = eval(read.ours, {"eqxopt": eqxopt, "opt": opt, "state": state})
    np.testing.assert_allclose(theirs, schedule(STEPS - 1), rtol=1e-6)
    np.testing.assert_allclose(ours, schedule(STEPS), rtol=1e-6)


def test_frozen_updates_are_applied_as_the_guide_says():
    """optax's freeze gives zeros that `optax.apply_updates` adds; eqxopt's
    `Freeze` gives `None`, which optax's call refuses and the guide's
    `eqxopt.apply_updates` applies, to the same parameters."""
    row = _state_row("optax.apply_updates(params, updates)")
    labels = {"w": "frozen", "b": "train"}
    tx = optax.multi_transform(
        {"frozen": optax.set_to_zero(), "train": optax.sgd(0.1)}, labels
    )
    opt = eqxopt.Freeze(eqxopt.SGD(0.1), frozen={"w": True, "b": False})
    grads = jax.grad(loss)(PARAMS)
    with STANDARD:
        tx_updates, _ = tx.update(grads, tx.init(PARAMS), PARAMS)
    updates, _ = opt.update(grads, opt.init(PARAMS), PARAMS)
    assert updates["w"] is None
    theirs = _evaluate(
        row.theirs, {"optax": optax, "params": PARAMS, "updates": tx_updates}
    )
    ours = _evaluate(row.ours, {"eqxopt": eqxopt, "params": PARAMS, "updates": updates})
    close([ours], [theirs], 0, 0, "frozen and trained leaves")
    assert ours["w"] is PARAMS["w"]  # left as it is, not added to
    with pytest.raises(TypeError, match="NoneType"):
        _evaluate(row.theirs, {"optax": optax, "params": PARAMS, "updates": updates})
