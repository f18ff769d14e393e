"""Every error path names the argument or the leaf."""

import inspect
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from catalog import all_cases
from eqxopt._core import _checks


def params():
    return {
        "encoder": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)},
        "scale": jnp.ones(()),
    }


def grads():
    return jax.tree.map(lambda x: jnp.full_like(x, 0.1), params())


@pytest.mark.parametrize(
    "make,argument",
    [
        (lambda: eqxopt.SGD(-0.1), "learning_rate"),
        (lambda: eqxopt.SGD(0.1, momentum=1.0), "momentum"),
        (lambda: eqxopt.SGD(0.1, momentum=-0.1), "momentum"),
        (lambda: eqxopt.SGD(float("nan")), "learning_rate"),
        (lambda: eqxopt.Adam(0.1, b1=1.0), "b1"),
        (lambda: eqxopt.Adam(0.1, b1=-0.2), "b1"),
        (lambda: eqxopt.Adam(0.1, b2=0.0), "b2"),
        (lambda: eqxopt.Adam(0.1, b2=1.0), "b2"),
        (lambda: eqxopt.Adam(0.1, eps=0.0), "eps"),
        (lambda: eqxopt.Adam(0.1, eps_root=-1e-8), "eps_root"),
        (lambda: eqxopt.AdamW(0.1, weight_decay=-0.01), "weight_decay"),
        (lambda: eqxopt.AdamW(jnp.array(-1.0)), "learning_rate"),
        (lambda: eqxopt.SGD(jnp.ones(3)), "learning_rate"),
        (lambda: eqxopt.WarmupCosine(1e-3, 1e-2, 10, 100), "min_lr"),
        (lambda: eqxopt.WarmupCosine(1e-3, 0.0, 100, 100), "warmup_steps"),
        (lambda: eqxopt.WarmupCosine(1e-3, 0.0, -1, 100), "warmup_steps"),
        (lambda: eqxopt.WarmupCosine(-1e-3, 0.0, 1, 100), "peak_lr"),
    ],
)
def test_invalid_hyperparameters_raise_value_error_naming_them(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: eqxopt.SGD("0.1"), "learning_rate must be a float"),
        (
            lambda: eqxopt.SGD(lambda step: 0.1),
            "learning_rate must be a float, a scalar",
        ),
        (lambda: eqxopt.SGD(0.1, nesterov=1), "nesterov must be a bool"),
        (
            lambda: eqxopt.Adam(0.1, mu_dtype=jnp.int32),
            "mu_dtype must be a float dtype",
        ),
        (
            lambda: eqxopt.WarmupCosine(1e-3, 0.0, 1.5, 100),
            "warmup_steps must be an integer",
        ),
    ],
)
def test_wrong_types_raise_type_error_naming_them(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_traced_hyperparameters_skip_the_value_check():
    # A negative learning rate cannot be seen at trace time; it is not an error then.
    @jax.jit
    def build(lr):
        return eqxopt.SGD(lr).learning_rate(jnp.int32(0))

    assert float(build(-1.0)) == -1.0


OPTS = [eqxopt.SGD(0.1, momentum=0.9), eqxopt.AdamW(0.1)]
ids = ["SGD", "AdamW"]


@pytest.mark.parametrize("method", ["update", "step"])
@pytest.mark.parametrize("opt", OPTS, ids=ids)
def test_grads_missing_a_leaf(opt, method):
    g = grads()
    del g["encoder"]["b"]
    with pytest.raises(
        ValueError, match=r"params has \['encoder'\]\['b'\] that grads lacks"
    ):
        getattr(opt, method)(g, opt.init(params()), params())


@pytest.mark.parametrize("opt", OPTS, ids=ids)
def test_grads_with_an_extra_leaf(opt):
    g = grads()
    g["decoder"] = jnp.ones(2)
    with pytest.raises(ValueError, match=r"grads has \['decoder'\] that params lacks"):
        opt.update(g, opt.init(params()), params())


@pytest.mark.parametrize("opt", OPTS, ids=ids)
def test_grads_with_a_wrong_shape(opt):
    g = grads()
    g["encoder"]["w"] = jnp.ones((3, 2))
    with pytest.raises(
        ValueError,
        match=r"grads\['encoder'\]\['w'\] has shape \(3, 2\) but "
        r"params\['encoder'\]\['w'\] has shape \(2, 3\)",
    ):
        opt.step(g, opt.init(params()), params())


@pytest.mark.parametrize("opt", OPTS, ids=ids)
def test_grads_with_a_wrong_dtype(opt):
    g = grads()
    g["scale"] = g["scale"].astype(jnp.bfloat16)
    with pytest.raises(
        TypeError,
        match=r"grads\['scale'\] has dtype bfloat16 but "
        r"params\['scale'\] has dtype float32",
    ):
        opt.update(g, opt.init(params()), params())


def test_grads_for_a_non_float_parameter():
    p = {"w": jnp.ones(2), "count": jnp.array(3)}
    g = {"w": jnp.ones(2), "count": jnp.array(1)}
    opt = eqxopt.SGD(0.1)
    with pytest.raises(
        ValueError, match=r"grads\['count'\] is an array but params\['count'\]"
    ):
        opt.step(g, opt.init(p), p)


def test_grads_as_list_where_params_has_tuple():
    p = {"w": (jnp.ones(2), jnp.ones(2))}
    g = {"w": [jnp.ones(2), jnp.ones(2)]}
    opt = eqxopt.SGD(0.1)
    with pytest.raises(
        ValueError, match="grads does not have the tree structure of params"
    ):
        opt.step(g, opt.init(p), p)


def test_state_of_another_optimizer():
    with pytest.raises(
        TypeError, match=r"state must be the AdamState that AdamW\.init"
    ):
        eqxopt.AdamW(0.1).update(grads(), eqxopt.SGD(0.1).init(params()), params())


def test_state_made_for_other_params_names_the_leaf():
    opt = eqxopt.AdamW(0.1)
    other = params()
    other["encoder"]["w"] = jnp.ones((4, 3))
    with pytest.raises(
        ValueError, match=r"state\.mu\['encoder'\]\['w'\] has shape \(4, 3\) but"
    ):
        opt.update(grads(), opt.init(other), params())


def test_state_with_a_missing_leaf_names_it():
    opt = eqxopt.SGD(0.1, momentum=0.9)
    smaller = params()
    del smaller["scale"]
    with pytest.raises(ValueError, match=r"\.velocity\['scale'\]"):
        opt.update(grads(), opt.init(smaller), params())


def test_state_with_a_wrong_dtype_names_the_leaf():
    opt = eqxopt.Adam(0.1)
    state = opt.init(params())
    state = eqxopt.AdamState(
        step=state.step,
        mu=state.mu,
        nu=jax.tree.map(lambda x: x.astype(jnp.float16), state.nu),
    )
    with pytest.raises(
        TypeError, match=r"state\.nu\['encoder'\]\['b'\] has dtype float16"
    ):
        opt.update(grads(), state, params())


def test_state_step_with_a_wrong_dtype():
    opt = eqxopt.SGD(0.1)
    state = opt.init(params())
    state = eqxopt.SGDState(step=jnp.float32(0), velocity=state.velocity)
    with pytest.raises(TypeError, match=r"state\.step has dtype float32"):
        opt.update(grads(), state, params())


def test_unknown_keyword_is_rejected():
    opt = eqxopt.SGD(0.1)
    with pytest.raises(TypeError, match="value"):
        opt.update(grads(), opt.init(params()), params(), value=jnp.float32(1.0))


def test_a_failed_call_changes_nothing_and_the_next_call_works():
    opt = eqxopt.AdamW(0.1)
    p, g = params(), grads()
    state = opt.init(p)
    bad = dict(g, scale=jnp.ones(2))
    with pytest.raises(ValueError):
        opt.step(bad, state, p)
    _new_p, new_state = opt.step(g, state, p)
    assert int(state.step) == 0 and int(new_state.step) == 1
    np.testing.assert_array_equal(p["encoder"]["w"], jnp.ones((2, 3)))


def _float_hyperparameters(opt):
    """Name and value of each float hyperparameter of `opt` and of the transforms
    it holds: constructor arguments stored as a float scalar array (or as a
    `Constant` schedule, as a number learning rate is)."""
    found = {}
    holders = jax.tree.leaves(
        opt,
        is_leaf=lambda x: x is not opt and isinstance(x, eqxopt.AbstractTransform),
    )
    for module in [opt, *holders]:
        if not isinstance(module, eqxopt.AbstractTransform):
            continue
        for name in inspect.signature(type(module)).parameters:
            value = getattr(module, name, None)
            if isinstance(value, eqxopt.Constant):
                value = value.value
            if (
                isinstance(value, jax.Array)
                and value.ndim == 0
                and jnp.issubdtype(value.dtype, jnp.floating)
            ):
                found.setdefault(name, float(value))
    return found


def _catalog_float_arguments():
    out = []
    for case in all_cases():
        for name, value in _float_hyperparameters(case.make()).items():
            try:
                case.make(**{name: value})
            except TypeError:  # held by an inner transform the case does not expose
                continue
            out.append((case, name))
    return out


CATALOG_FLOATS = _catalog_float_arguments()
# `inf` means something for these (NAdam: no momentum warm-up, optax's NAdam).
INF_ALLOWED = {"momentum_decay"}


@pytest.mark.parametrize(
    "case,name", CATALOG_FLOATS, ids=[f"{c.name}-{n}" for c, n in CATALOG_FLOATS]
)
def test_non_finite_float_hyperparameters_raise_naming_them(case, name):
    """inf, and 1e40 (inf once stored as float32), are a ValueError naming the
    argument, for every float hyperparameter of every catalog configuration."""
    assert len(CATALOG_FLOATS) > 250
    bad = [1e40, -1e40] + ([] if name in INF_ALLOWED else [math.inf, -math.inf])
    for value in bad:
        with pytest.raises(ValueError, match=rf"\b{name}\b"):
            case.make(**{name: value})


def test_inf_learning_rate_and_overflowing_sgd_rate_are_rejected():
    with pytest.raises(ValueError, match=r"learning_rate must be .*got inf"):
        eqxopt.AdamW(learning_rate=float("inf"))
    with pytest.raises(ValueError, match=r"learning_rate must be finite in float32"):
        eqxopt.SGD(1e40)
    # A float64 value that float32 holds is fine; inf is allowed where it means
    # something (NAdam's default momentum_decay).
    eqxopt.SGD(np.float64(3e38))
    assert float(eqxopt.NAdam(0.1).momentum_decay) == math.inf


def test_donate_must_be_a_bool():
    opt = eqxopt.SGD(0.1)
    p, g = params(), grads()
    state = opt.init(p)
    for method in (opt.update, opt.step):
        with pytest.raises(TypeError, match="donate must be a bool, got 'yes'"):
            method(g, state, p, donate="yes")
        with pytest.raises(TypeError, match="donate must be a bool, got 1"):
            method(g, state, p, donate=1)
    assert not jax.tree.leaves(state)[0].is_deleted()


def test_swapped_arguments_name_the_leaf_where_the_trees_part():
    """`opt.step(model, state, grads)`: the two trees print alike (None is a leaf to
    the check), so the message names the leaf: the activation function."""
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    model_grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2))))(model)
    opt = eqxopt.Adam(1e-3)
    state = opt.init(model)
    message = (
        r"at \.activation grads has the function relu where params has None "
        r"\(update and step take grads, state, params in that order\)"
    )
    with pytest.raises(ValueError, match=message):
        opt.step(model, state, model_grads)
    with pytest.raises(ValueError, match=message):
        opt.update(model, state, model_grads)
    new_model, _ = opt.step(model_grads, state, model)  # the right order works
    assert new_model.activation is model.activation


def test_state_checks_hold_when_init_is_not_traced_again(monkeypatch):
    # What `init` makes is remembered per optimizer and parameter types, so a second
    # trace (here: donated) does not trace `init` again; its checks still hold, and
    # other parameter shapes or optimizer options trace it again.
    opt = eqxopt.Adam(0.1)
    traced = []
    init = type(opt).init

    def counted(self, p):
        traced.append(1)
        return init(self, p)

    monkeypatch.setattr(type(opt), "init", counted)
    monkeypatch.setattr(_checks, "_expected_states", {})  # none from other tests
    state = opt.init(params())
    opt.update(grads(), state, params())
    assert len(traced) == 2  # the call above and the update's check
    copy = lambda tree: jax.tree.map(lambda x: jnp.array(x, copy=True), tree)  # noqa: E731
    opt.update(grads(), copy(state), params(), donate=True)
    assert len(traced) == 2
    bad = eqxopt.AdamState(
        step=state.step,
        mu=state.mu,
        nu=jax.tree.map(lambda x: x.astype(jnp.float16), state.nu),
    )
    with pytest.raises(TypeError, match=r"state\.nu\['encoder'\]\['b'\] has dtype"):
        opt.update(grads(), bad, params(), donate=True)
    other = params()
    other["encoder"]["w"] = jnp.ones((4, 3))
    with pytest.raises(ValueError, match=r"state\.mu\['encoder'\]\['w'\] has shape"):
        opt.update(jax.tree.map(jnp.ones_like, other), state, other)
    assert len(traced) == 3
    bf16 = eqxopt.Adam(0.1, mu_dtype=jnp.bfloat16)  # another static field
    bf16.update(grads(), bf16.init(params()), params())
    assert len(traced) == 5
