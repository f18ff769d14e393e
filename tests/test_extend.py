"""The authoring API, `eqxopt.extend`, as users write with it: the optimizers of the
"Writing an optimizer" page (docs/writing-optimizers.md) against plain NumPy over many
steps, with everything the engine promises them (None gradients, low-precision
parameters, 8-bit moments, schedules and traced hyperparameters without recompiling,
`to_optax`, the native kernels), and the errors a wrong declaration gets."""

import ast
import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxtyping import Array, Int, PyTree

import eqxopt
from eqxopt import extend
from helpers import compiles, grad_stream, nested_tree

PAGE = pathlib.Path(__file__).parent.parent / "docs" / "writing-optimizers.md"


def _page_classes() -> dict:
    """The imports and classes of the page's code blocks, run in one namespace (the
    blocks' training loops are run by tests/test_docs.py)."""
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    namespace: dict = {"__name__": "writing_optimizers"}
    for block in blocks:
        tree = ast.parse(block)
        tree.body = [
            node
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef))
        ]
        exec(compile(tree, str(PAGE), "exec"), namespace)
    return namespace


PAGE_CLASSES = _page_classes()
LaProp = PAGE_CLASSES["LaProp"]
LaPropW = PAGE_CLASSES["LaPropW"]
LaPropOnce = PAGE_CLASSES["LaPropOnce"]
NormalizedMomentum = PAGE_CLASSES["NormalizedMomentum"]


def laprop_reference(
    params, grads, lr, b1=0.9, b2=0.999, eps=1e-15, wd=0.0, decay=None
):
    """LaProp in NumPy, float64, leaf by leaf; `decay(path)`: which leaves decay."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    p = [np.asarray(x, np.float64) for _, x in flat]
    mu = [np.zeros_like(x) for x in p]
    nu = [np.zeros_like(x) for x in p]
    history = []
    for t, g_tree in enumerate(grads, start=1):
        g_leaves = treedef.flatten_up_to(g_tree)
        for i, g in enumerate(g_leaves):
            if g is None:
                continue
            g = np.asarray(g, np.float64)
            nu[i] = b2 * nu[i] + (1 - b2) * g * g
            mu[i] = b1 * mu[i] + (1 - b1) * g / (np.sqrt(nu[i] / (1 - b2**t)) + eps)
            u = -lr * mu[i] / (1 - b1**t)
            if decay is not None and decay(flat[i][0]):
                u = u - lr * wd * p[i]
            p[i] = p[i] + u
        history.append(jax.tree.unflatten(treedef, [x.copy() for x in p]))
    return history


def assert_close(actual, expected, rtol=2e-5, atol=2e-6):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a, np.float64), e, rtol=rtol, atol=atol)


def run_steps(opt, params, grads, donate=False, **extra):
    """The parameters after each step (with `donate`, only the last one is alive:
    each step consumes its inputs) and the last state."""
    if donate:
        params = jax.tree.map(jnp.copy, params)  # the caller's stay alive
    state = opt.init(params)
    history = []
    for g in grads:
        params, state = opt.step(g, state, params, donate=donate, **extra)
        history.append(params)
    return history, state


@pytest.mark.parametrize("donate", [False, True], ids=["step", "donated step"])
def test_laprop_matches_numpy_over_many_steps(donate):
    params = nested_tree(seed=3)
    grads = list(grad_stream(params, 25, seed=4))
    history, _ = run_steps(LaProp(3e-2), params, grads, donate=donate)
    expected = laprop_reference(params, grads, 3e-2)
    assert_close(history[-1], expected[-1])
    assert not np.allclose(expected[-1]["dense"]["w"], params["dense"]["w"], atol=0.1)


def test_the_page_laprop_re_creates_eqxopt_laprop():
    # The page's class is a teaching copy of the shipped one (without its decay).
    params = nested_tree(seed=3)
    grads = list(grad_stream(params, 30, seed=4))
    page, _ = run_steps(LaProp(3e-2, b1=0.8), params, grads)
    shipped, _ = run_steps(eqxopt.LaProp(3e-2, b1=0.8), params, grads)
    assert_close(page[-1], jax.tree.map(np.asarray, shipped[-1]), rtol=1e-6, atol=1e-7)


def test_laprop_update_and_optax_form_agree_with_step():
    params = nested_tree(seed=5)
    grads = list(grad_stream(params, 12, seed=6))
    opt = LaProp(1e-2, b1=0.8)
    stepped, _ = run_steps(opt, params, grads)

    state, by_update = opt.init(params), params
    tx = opt.to_optax()
    optax_state, by_optax = tx.init(params), params
    for g in grads:
        updates, state = opt.update(g, state, by_update)
        by_update = eqxopt.apply_updates(by_update, updates)
        updates, optax_state = tx.update(g, optax_state, by_optax)
        by_optax = optax.apply_updates(by_optax, updates)
    assert_close(by_update, jax.tree.map(np.asarray, stepped[-1]), rtol=1e-6, atol=1e-7)
    assert_close(by_optax, jax.tree.map(np.asarray, stepped[-1]), rtol=1e-6, atol=1e-7)


def test_none_gradients_and_non_float_leaves_are_left_alone():
    params = {"w": jnp.ones((3, 4)), "frozen": jnp.full(5, 2.0), "n": jnp.arange(3)}
    grads = [
        {"w": g["w"], "frozen": None, "n": None}
        for g in grad_stream({"w": params["w"]}, 6, seed=1)
    ]
    history, state = run_steps(LaProp(1e-2), params, grads)
    np.testing.assert_array_equal(history[-1]["frozen"], params["frozen"])
    np.testing.assert_array_equal(history[-1]["n"], params["n"])
    np.testing.assert_array_equal(state.mu["frozen"], jnp.zeros(5))
    expected = laprop_reference(
        {"w": params["w"]}, [{"w": g["w"]} for g in grads], 1e-2
    )
    assert_close(history[-1]["w"], expected[-1]["w"])


def test_low_precision_parameters_keep_their_dtype_and_compute_in_float32():
    params = {"w": jnp.linspace(-1, 1, 12, dtype=jnp.bfloat16).reshape(3, 4)}
    grads = [eqxopt.tree_cast(g, jnp.bfloat16) for g in grad_stream(params, 5, seed=2)]
    history, state = run_steps(LaProp(1e-2), params, grads)
    assert history[-1]["w"].dtype == jnp.bfloat16
    assert state.mu["w"].dtype == jnp.bfloat16  # stored like its parameter
    expected = laprop_reference(params, grads, 1e-2)
    assert_close(history[-1], expected[-1], rtol=2e-2, atol=2e-2)


def test_quantized_moments_follow_the_declarations():
    """`nu` is declared non-negative: its 8-bit storage is the unsigned map, `mu`'s
    the signed one; the run stays close to the float32 one."""
    params = {"w": jax.random.normal(jax.random.key(0), (64, 64))}
    grads = list(grad_stream(params, 10, seed=7))
    q = eqxopt.Blockwise8bit(block_size=64, min_size=256)
    quantized = LaProp(1e-3, mu_dtype=q, nu_dtype=q)
    state = quantized.init(params)
    assert isinstance(state.mu["w"], eqxopt.QuantizedArray)
    assert state.nu["w"].map_name.endswith("unsigned")
    assert not state.mu["w"].map_name.endswith("unsigned")
    low, _ = run_steps(quantized, params, grads)
    full, _ = run_steps(LaProp(1e-3), params, grads)
    moved = np.abs(np.asarray(full[-1]["w"] - params["w"])).max()
    error = np.abs(np.asarray(low[-1]["w"] - full[-1]["w"])).max()
    assert error < 0.05 * moved


def test_new_hyperparameter_values_and_schedules_reuse_the_compiled_step():
    params = nested_tree(seed=1)
    grads = next(grad_stream(params, 1))

    @eqx.filter_jit
    def train_step(opt, state, params, grads):
        return opt.step(grads, state, params)

    opt = LaProp(1e-3)
    train_step(opt, opt.init(params), params, grads)
    with compiles() as compiled:
        for lr in (3e-4, jnp.asarray(2e-3)):
            again = LaProp(lr, b1=0.95)
            train_step(again, again.init(params), params, grads)
    assert compiled == []


def test_a_schedule_is_evaluated_at_the_step():
    params = {"w": jnp.ones(4)}
    grads = list(grad_stream(params, 6, seed=3))
    schedule = eqxopt.WarmupCosine(1e-2, 0.0, 2, 6)
    history, _ = run_steps(LaProp(schedule), params, grads)
    # LaProp's first update has size lr * |g| / |g| = lr: zero at step 0 of warmup.
    np.testing.assert_allclose(history[0]["w"], params["w"], atol=0)
    assert not np.allclose(history[-1]["w"], params["w"])


def test_the_native_kernels_run_an_element_wise_rule_where_they_are_on():
    params = nested_tree(seed=2)
    report = extend.explain_kernels(LaProp(1e-3), params)
    if not eqxopt.native_kernels_available():
        # One line saying why: not installed, not built, or not for this JAX.
        assert len(report.splitlines()) == 1 and "native CPU kernels" in report
        return
    lines = [line for line in report.splitlines() if "LaProp.leaf on" in line]
    assert len(lines) == len(jax.tree.leaves(params))
    assert all(line.endswith("native kernel") for line in lines), report


def test_a_layer_wise_rule_runs_as_xla_code():
    params = nested_tree(seed=2)
    report = extend.explain_kernels(NormalizedMomentum(1e-3), params)
    lines = [line for line in report.splitlines() if ".leaf on" in line]
    assert not any(line.endswith("native kernel") for line in lines), report
    if eqxopt.native_kernels_available():
        assert len(lines) == len(jax.tree.leaves(params)), report


def test_normalized_momentum_matches_numpy():
    params = nested_tree(seed=8)
    grads = list(grad_stream(params, 15, seed=9))
    history, _ = run_steps(NormalizedMomentum(1e-2, momentum=0.8), params, grads)
    p = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
    v = [np.zeros_like(x) for x in p]
    for g_tree in grads:
        for i, g in enumerate(jax.tree.leaves(g_tree)):
            v[i] = 0.8 * v[i] + np.asarray(g, np.float64)
            p[i] = p[i] - 1e-2 * v[i] / (np.sqrt(np.mean(v[i] ** 2)) + 1e-8)
    assert_close(jax.tree.leaves(history[-1]), p)


def test_a_decay_mask_selects_the_leaves_that_decay():
    params = nested_tree(seed=4)
    grads = list(grad_stream(params, 10, seed=5))
    opt = LaPropW(
        1e-2, weight_decay=0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim == 2, p)
    )
    history, _ = run_steps(opt, params, grads)
    shapes = {
        jax.tree_util.keystr(k): x.ndim
        for k, x in jax.tree_util.tree_leaves_with_path(params)
    }
    expected = laprop_reference(
        params,
        grads,
        1e-2,
        wd=0.1,
        decay=lambda path: shapes[jax.tree_util.keystr(path)] == 2,
    )
    assert_close(history[-1], expected[-1])
    with pytest.raises(ValueError, match="mask"):
        LaPropW(1e-2, mask={"no": True}).init(params)


def test_values_computed_once_per_step_give_the_same_numbers():
    params = nested_tree(seed=6)
    grads = list(grad_stream(params, 10, seed=7))
    once, _ = run_steps(LaPropOnce(1e-2), params, grads)
    each, _ = run_steps(LaProp(1e-2), params, grads)
    assert_close(once[-1], jax.tree.map(np.asarray, each[-1]), rtol=1e-6, atol=1e-7)


def test_field_helpers_validate_at_construction():
    with pytest.raises(ValueError, match="b1"):
        LaProp(1e-3, b1=1.5)
    with pytest.raises(ValueError, match="learning_rate"):
        LaProp(-1.0)
    with pytest.raises(TypeError, match="nu_dtype"):
        LaProp(1e-3, nu_dtype="not a dtype")
    with pytest.raises(TypeError, match="velocity_dtype"):
        NormalizedMomentum(1e-3, velocity_dtype=3)


def test_a_wrong_state_is_refused_naming_the_argument():
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.ones(3)}
    other = eqxopt.AdamW(1e-3).init(params)
    with pytest.raises(TypeError, match="state"):
        LaProp(1e-3).update(grads, other, params)
    with pytest.raises(TypeError, match="state"):
        LaProp(1e-3).step(grads, other, params)


class _State(eqx.Module):
    step: Int[Array, ""]
    mu: PyTree


_ANNOTATIONS = {
    "learning_rate": extend.ScalarOrSchedule,
    "mu_dtype": extend.StorageLike,
    "mask": extend.MaskLike,
    "b1": extend.ScalarOrSchedule,
}


def _declare(**attributes):
    """A per-leaf optimizer class `Mine` made from a class body; an attribute
    given as a function is called with the body (to refer to its fields)."""
    body = {
        "__annotations__": dict(_ANNOTATIONS),
        "learning_rate": extend.learning_rate_field(),
        "mu_dtype": extend.dtype_field(storage=True),
        "mask": extend.mask_field(),
        "b1": extend.hyper(0.9),
        "state_type": _State,
        "elementwise": True,
        "leaf": lambda self, h, t, g, p, mu: (-h.learning_rate * g, mu),
    }
    for name, value in attributes.items():
        called = callable(value) and name not in ("leaf", "__annotations__")
        body[name] = value(body) if called else value
    return type("Mine", (extend.AbstractLeafwiseOptimizer,), body)


def test_a_correct_declaration_makes_a_working_optimizer():
    cls = _declare(moments=lambda b: (extend.Moment("mu", dtype=b["mu_dtype"]),))
    params = {"w": jnp.ones(3)}
    new, _ = cls(0.5).step({"w": jnp.ones(3)}, cls(0.5).init(params), params)
    np.testing.assert_allclose(new["w"], 0.5)


_ELSEWHERE = extend.hyper(0.5)  # a field of no class


@pytest.mark.parametrize(
    "attributes, message",
    [
        (
            {"moments": ("mu",)},
            r"^Mine.moments must hold eqxopt.extend.Moment declarations",
        ),
        (
            {"moments": lambda b: (extend.Moment("mu", dtype=b["b1"]),)},
            r"^Mine: Moment\('mu', dtype=...\) refers to b1, which is no dtype "
            r"option: declare `b1: StorageLike = dtype_field\(storage=True\)`",
        ),
        (
            {"moments": (extend.Moment("mu", dtype=_ELSEWHERE),)},
            r"^Mine: Moment\('mu', dtype=...\) refers to a field that Mine does "
            r"not have \(its fields are learning_rate, mu_dtype, mask, b1\)",
        ),
        (
            {"moments": (extend.Moment("mu", fill=_ELSEWHERE),)},
            r"^Mine: Moment\('mu', fill=...\) refers to a field that Mine does not "
            "have",
        ),
        (
            {"moments": (extend.Moment("nu"),)},
            r"^Mine: its state _State has no field for the moments \['nu'\]",
        ),
        (
            {
                "moments": (extend.Moment("mu"),),
                "decay_mask": lambda b: extend.ref(b["b1"]),
            },
            r"^Mine: decay_mask refers to b1, which is no mask option: declare "
            r"`b1: MaskLike = mask_field\(\)`",
        ),
        (
            {
                "moments": (extend.Moment("mu"),),
                "decoupled_decay": lambda b: extend.ref(b["mask"]),
            },
            r"^Mine: decoupled_decay refers to mask, which is no hyperparameter",
        ),
        (
            {"moments": (extend.Moment("mu"),), "decay_mask": "mask"},
            r"^Mine: decay_mask names a field by the string 'mask'; refer to the "
            r"field itself",
        ),
        # The engine passes h, t, g, p and one argument per moment.
        (
            {
                "moments": (extend.Moment("mu"),),
                "leaf": lambda self, h, g, p, mu: (g, mu),
            },
            r"^Mine.leaf\(self, h, g, p, mu\) cannot take what the engine passes: "
            r"leaf\(self, h, t, g, p, mu\), that is h \(the optimizer at this "
            r"step\), t \(the step count after this update\), g and p",
        ),
        (
            {
                "moments": (extend.Moment("mu"),),
                "decay_mask": lambda b: extend.ref(b["mask"]),
                "leaf": lambda self, h, t, g, p, mu: (g, mu),
            },
            r"^Mine.leaf\(self, h, t, g, p, mu\) cannot take what the engine passes: "
            r"leaf\(self, h, t, g, p, mu, decayed\).*then the leaf's flag",
        ),
    ],
)
def test_a_wrong_declaration_fails_when_the_class_is_made(attributes, message):
    with pytest.raises(TypeError, match=message):
        _declare(**attributes)


def test_a_field_named_by_a_string_is_refused_naming_the_fix():
    with pytest.raises(
        TypeError,
        match=r"^Mine: Moment\('mu', dtype=...\) names a field by the string "
        r"'mu_dtype'; refer to the field itself: mu_dtype in the class body that "
        r"declares it \(extend.ref\(mu_dtype\) where it stands alone\), or "
        r"extend.fields_of\(Base\).mu_dtype for a field of a base class$",
    ):
        _declare(moments=(extend.Moment("mu", dtype="mu_dtype"),))


def test_fields_of_refers_to_a_field_of_a_base_class():
    base = _declare(moments=lambda b: (extend.Moment("mu", dtype=b["mu_dtype"]),))

    class Child(base):  # pyright: ignore
        moments = (extend.Moment("mu", dtype=extend.fields_of(base).mu_dtype),)

    state = Child(0.5, mu_dtype=jnp.bfloat16).init({"w": jnp.ones(3)})
    assert state.mu["w"].dtype == jnp.bfloat16
    with pytest.raises(AttributeError, match="Mine has no field 'mu_dtyp'"):
        extend.fields_of(base).mu_dtyp  # noqa: B018


def test_h_is_the_optimizer_at_the_step_with_every_field():
    """The friction point of a namespace of listed names: `leaf` reads any field
    of its optimizer from `h` (here a plain float option, not a hyperparameter),
    and a misspelled one is Python's error naming the class."""
    seen = []

    def leaf(self, h, t, g, p, mu):
        seen.append((type(h), h.beta, isinstance(h.learning_rate, jax.Array)))
        return -h.learning_rate * h.beta * g, mu

    cls = _declare(
        __annotations__={**_ANNOTATIONS, "beta": float},
        beta=lambda b: 2.0,
        moments=(extend.Moment("mu"),),
        leaf=leaf,
    )
    params = {"w": jnp.ones(3)}
    opt = cls(0.5)
    new, _ = opt.step({"w": jnp.ones(3)}, opt.init(params), params)
    np.testing.assert_allclose(new["w"], 0.0)
    assert seen[0][0] is cls and seen[0][1] == 2.0
    assert seen[0][2]  # the schedule evaluated: an array

    def misspelled(self, h, t, g, p, mu):
        return -h.learning_rat * g, mu

    wrong = _declare(moments=(extend.Moment("mu"),), leaf=misspelled)
    with pytest.raises(AttributeError, match="'Mine' object has no attribute "):
        wrong(0.5).step({"w": jnp.ones(3)}, wrong(0.5).init(params), params)


def test_a_trust_ratio_optimizer_without_axis_name_names_the_field_to_declare():
    class Plain(extend.AbstractTrustRatioOptimizer):
        learning_rate: extend.ScalarOrSchedule = extend.learning_rate_field()
        state_type = _State
        moments = (extend.Moment("mu"),)

        def leaf(self, h, t, g, p, mu):
            return -h.learning_rate * self.scaled(h, g, p), mu

    with pytest.raises(
        TypeError,
        match=r"^Plain cannot be built: AbstractTrustRatioOptimizer requires the "
        r"field `axis_name`: declare `axis_name: extend.AxisName = "
        r"extend.axis_name_field\(\)`$",
    ):
        Plain(0.1)

    class WithAxis(Plain):
        axis_name: extend.AxisName = extend.axis_name_field()

    params = {"w": jnp.full(3, 2.0)}
    opt = WithAxis(0.1)
    new, _ = opt.step({"w": jnp.ones(3)}, opt.init(params), params)
    # The trust ratio |p| / |g| scales the unit gradient to the parameter's norm.
    np.testing.assert_allclose(new["w"], 2.0 - 0.1 * 2.0, rtol=1e-6)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"name": "2mu"}, r"Moment: name must be a field name, got '2mu'"),
        (
            {"name": "mu", "dtype": jnp.float32},
            r"Moment\('mu'\): dtype is the optimizer's field of the moment's "
            r"storage option \(dtype=mu_dtype\) or None",
        ),
        (
            {"name": "mu", "nonnegative": 1},
            r"Moment\('mu'\): nonnegative must be a bool",
        ),
    ],
)
def test_a_bad_moment_is_refused(arguments, message):
    with pytest.raises(TypeError, match=message):
        extend.Moment(**arguments)


def test_moment_like_makes_a_declared_moment_as_the_engine_does():
    q = eqxopt.Blockwise8bit(block_size=64, min_size=64)
    opt = LaProp(1e-3, nu_dtype=q)
    params = {"w": jnp.ones((16, 16)), "n": jnp.arange(2)}
    made = extend.moment_like(opt, params, "nu")
    assert isinstance(made["w"], eqxopt.QuantizedArray)
    assert made["w"].map_name.endswith("unsigned")
    assert made["n"] is None
    expected = opt.init(params).nu["w"]
    np.testing.assert_array_equal(made["w"].codes, expected.codes)
    with pytest.raises(
        TypeError, match="LaProp makes a moment 'v' that its `moments` do not declare"
    ):
        extend.moment_like(opt, params, "v")


def test_extend_lists_what_it_exports():
    assert sorted(extend.__all__) == extend.__all__
    for name in extend.__all__:
        assert hasattr(extend, name), name


def test_the_api_reference_documents_every_name():
    page = (PAGE.parent / "api" / "extend.md").read_text()
    documented = set(re.findall(r"^::: eqxopt\.extend\.(\w+)$", page, re.M))
    aliases = set(re.findall(r"^- `(\w+)`", page, re.M))
    aliases |= {"Params", "Grads", "PerExampleGrads", "Updates", "State"}
    assert sorted(set(extend.__all__) - documented - aliases) == []


class _ReturnsAnotherState(LaProp):
    def run(self, grads, state, params, *, apply):
        out, new = super().run(grads, state, params, apply=apply)
        return out, eqxopt.AdamState(step=new.step, mu=new.mu, nu=new.nu)


class _ReturnsAnotherTree(LaProp):
    def run(self, grads, state, params, *, apply):
        _, new = super().run(grads, state, params, apply=apply)
        return {"other": jnp.zeros(2)}, new


def test_the_annotations_check_the_state_a_transform_returns():
    """The signatures' annotations (the state of the optimizer's own `state_type`)
    are checked by jaxtyping and beartype: an optimizer whose rule returns another
    optimizer's state fails its first call, not later, with a message naming the
    class its `init` makes (raised from jaxtyping's error, which caught it)."""
    import jaxtyping

    params = {"w": jnp.ones(3)}
    opt = _ReturnsAnotherState(1e-3)
    with pytest.raises(
        TypeError,
        match=r"^_ReturnsAnotherState.transform returned a new state of type "
        r"AdamState; _ReturnsAnotherState.init\(params\) makes a LaPropState",
    ) as caught:
        opt.update(params, opt.init(params), params)
    assert isinstance(caught.value.__cause__, jaxtyping.TypeCheckError)
    assert "the return value" in str(caught.value.__cause__)


def test_updates_of_another_structure_are_refused_naming_the_leaf():
    params = {"w": jnp.ones(3)}
    opt = _ReturnsAnotherTree(1e-3)
    with pytest.raises(
        TypeError,
        match=r"^_ReturnsAnotherTree.transform returned updates does not have the "
        r"tree structure of params: params has \['w'\] that updates lacks",
    ):
        opt.update(params, opt.init(params), params)


@pytest.mark.parametrize("filtered", [False, True], ids=["model", "eqx.filter"])
def test_models_with_non_array_leaves_or_none_step_and_update(filtered):
    """An Equinox model has functions among its leaves, and a filtered one `None`
    there: updates and new parameters have its structure either way."""
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    params = eqx.filter(model, eqx.is_inexact_array) if filtered else model
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2)) ** 2))(model)
    for opt in (LaProp(1e-2), NormalizedMomentum(1e-2), eqxopt.AdamW(1e-2)):
        state = opt.init(params)
        updates, _ = opt.update(grads, state, params)
        new, _ = opt.step(grads, state, params)
        stepped = eqxopt.apply_updates(params, updates)
        assert jax.tree.structure(new) == jax.tree.structure(params)
        arrays = (eqx.filter(new, eqx.is_array), eqx.filter(stepped, eqx.is_array))
        for a, b in zip(*map(jax.tree.leaves, arrays), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)
