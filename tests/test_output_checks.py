"""What a transform returns is checked before it is returned or applied: an update
or new state whose leaf has another shape or dtype than the parameters and `init`
say is refused, naming the optimizer and the leaf, on `update`, `step`,
`make_train_step`, `to_optax` and packed parameters, for optimizers written with
`eqxopt.extend` (a per-leaf rule, or a whole `transform`). And the public methods'
annotations: what `typing.get_type_hints` shows."""

import typing

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax  # noqa: F401  (to_optax needs it installed)
import pytest
from jaxtyping import Array, Int, PyTree

import eqxopt
from eqxopt import extend


class MomentState(eqx.Module):
    step: Int[Array, ""]
    mu: PyTree


class ShortUpdate(extend.AbstractLeafwiseOptimizer):
    """A per-leaf rule whose update has one element: `p + u` would broadcast it."""

    learning_rate: extend.ScalarOrSchedule = extend.learning_rate_field()

    state_type = MomentState
    moments = (extend.Moment("mu"),)
    elementwise = False

    def leaf(self, h, t, g, p, mu):
        return -h.learning_rate * g.reshape(-1)[:1], mu


class HalfUpdate(extend.AbstractLeafwiseOptimizer):
    """A per-leaf rule whose update is float16 for float32 parameters."""

    learning_rate: extend.ScalarOrSchedule = extend.learning_rate_field()

    state_type = MomentState
    moments = (extend.Moment("mu"),)
    elementwise = True

    def leaf(self, h, t, g, p, mu):
        return (-h.learning_rate * g).astype(jnp.float16), mu


class WideMoment(extend.AbstractLeafwiseOptimizer):
    """A per-leaf rule whose new moment has an extra axis."""

    learning_rate: extend.ScalarOrSchedule = extend.learning_rate_field()

    state_type = MomentState
    moments = (extend.Moment("mu"),)
    elementwise = False

    def leaf(self, h, t, g, p, mu):
        return -h.learning_rate * g, jnp.stack([mu, mu])


class WholeTreeShort(extend.AbstractTransform):
    """A transform written whole (not per leaf) with the same mistake."""

    reads_params = None

    def init(self, params):
        return MomentState(step=extend.zero_step(), mu=None)

    def transform(self, grads, state, params):
        updates = jax.tree.map(lambda g: g.reshape(-1)[:1], grads)
        return updates, MomentState(step=extend.increment(state.step), mu=None)


CASES = {
    "short-update": (
        ShortUpdate,
        r"^ShortUpdate.(leaf returned an update|transform returned updates\['w'\]) "
        r"of shape \(1,\) \(its parameter's shape is \(3,\)\),? for "
        r"params\['w'\] \(float32\[3\]\)",
    ),
    "float16-update": (
        HalfUpdate,
        r"^HalfUpdate.(leaf returned an update|transform returned updates\['w'\]) "
        r"in float16, which does not hold its parameter's dtype float32 .* for "
        r"params\['w'\]",
    ),
    "wide-moment": (
        WideMoment,
        r"^WideMoment.transform(_step)? returned a new state with state.mu\['w'\] "
        r"of shape \(2, 3\); WideMoment.init\(params\) makes shape \(3,\) there",
    ),
    "whole-tree": (
        WholeTreeShort,
        r"^WholeTreeShort.transform returned updates\['w'\] of shape \(1,\) \(its "
        r"parameter's shape is \(3,\)\), for params\['w'\] \(float32\[3\]\)",
    ),
}


def make(name):
    cls, message = CASES[name]
    return cls(0.1) if cls is not WholeTreeShort else cls(), message


PARAMS = {"w": jnp.ones(3)}
GRADS = {"w": jnp.full(3, 0.5)}


@pytest.mark.parametrize("name", list(CASES))
def test_update_refuses_naming_the_leaf(name):
    opt, message = make(name)
    with pytest.raises(TypeError, match=message):
        opt.update(GRADS, opt.init(PARAMS), PARAMS)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_step_refuses_before_applying(name, donate):
    opt, message = make(name)
    params = jax.tree.map(jnp.copy, PARAMS)
    state = opt.init(params)
    with pytest.raises(TypeError, match=message):
        opt.step(GRADS, state, params, donate=donate)
    # Nothing was consumed or changed: the trace refused before any program ran.
    assert not params["w"].is_deleted()
    np.testing.assert_array_equal(params["w"], 1.0)


@pytest.mark.parametrize("name", list(CASES))
def test_make_train_step_refuses(name):
    opt, message = make(name)

    def loss(model, x):
        return jnp.sum(model["w"] * x)

    step = eqxopt.make_train_step(loss, opt)
    with pytest.raises(TypeError, match=message):
        step(jax.tree.map(jnp.copy, PARAMS), opt.init(PARAMS), jnp.ones(3))


@pytest.mark.parametrize("name", list(CASES))
def test_to_optax_refuses(name):
    opt, message = make(name)
    tx = opt.to_optax()
    with pytest.raises(TypeError, match=message):
        tx.update(GRADS, tx.init(PARAMS), PARAMS)


class ShortElementwise(ShortUpdate):
    """`ShortUpdate` declared element-wise, as a packed model requires."""

    elementwise = True


def test_packed_parameters_refuse_a_short_update():
    opt = ShortElementwise(0.1)
    packed = eqxopt.pack({"w": jnp.ones(3), "b": jnp.ones(2)})
    grads = jax.tree.map(jnp.ones_like, packed)
    with pytest.raises(
        TypeError, match=r"^ShortElementwise.leaf returned an update of shape \(1,\)"
    ):
        opt.step(grads, opt.init(packed), packed)


def test_apply_updates_refuses_an_update_it_would_broadcast():
    with pytest.raises(
        ValueError,
        match=r"^updates\['w'\] has shape \(1,\) but params\['w'\] has shape "
        r"\(3,\); an update has its parameter's shape$",
    ):
        eqxopt.apply_updates(PARAMS, {"w": jnp.ones(1)})


def test_built_in_optimizers_pass_the_checks_with_low_precision_parameters():
    """bf16 parameters get float32 updates inside (wider is allowed) and their
    own dtype out of `update`."""
    params = {"w": jnp.ones(3, jnp.bfloat16)}
    grads = {"w": jnp.ones(3, jnp.bfloat16)}
    for opt in (eqxopt.AdamW(0.1), eqxopt.SGD(0.1, momentum=0.9), eqxopt.Lion(0.1)):
        updates, _ = opt.update(grads, opt.init(params), params)
        assert updates["w"].dtype == jnp.bfloat16 and updates["w"].shape == (3,)


def test_the_public_methods_and_constructors_are_annotated():
    """The annotations of `update`/`step` relate the arguments (jaxtyping's tree
    structure "P" and per-leaf shapes), and constructors show what they take:
    none of them is a bare `Any`."""
    for method in (eqxopt.AdamW.update, eqxopt.AdamW.step):
        hints = typing.get_type_hints(method)
        for name in ("grads", "state", "params", "return"):
            assert hints[name] is not typing.Any, (method, name)
        assert "'P'" in str(hints["grads"]) and "?*shape" in str(hints["grads"])
        assert str(hints["params"]).count("'P'") >= 1
    init = typing.get_type_hints(eqxopt.AdamW.__init__)
    for name in (
        "learning_rate",
        "b1",
        "b2",
        "eps",
        "weight_decay",
        "mu_dtype",
        "mask",
    ):
        assert init[name] is not typing.Any, name
    assert eqxopt.AbstractSchedule in typing.get_args(init["learning_rate"])
    assert init["nesterov"] is bool


def test_bare_any_constructor_arguments_across_the_catalog():
    """Every optimizer, transform and schedule in `eqxopt.__all__` shows a real
    type for each constructor argument."""
    bare = []
    for name in eqxopt.__all__:
        cls = getattr(eqxopt, name)
        if not (isinstance(cls, type) and issubclass(cls, eqx.Module)):
            continue
        if not issubclass(cls, (eqxopt.AbstractTransform, eqxopt.AbstractSchedule)):
            continue
        for arg, hint in typing.get_type_hints(cls.__init__).items():
            if hint is typing.Any:
                bare.append(f"{name}.{arg}")
    assert bare == []


def test_a_wrong_state_is_refused_by_the_annotations_naming_the_class():
    """The state's annotation is the optimizer's own state class: beartype refuses
    another optimizer's state, and the error says which one was expected."""
    import jaxtyping

    opt = eqxopt.AdamW(0.1)
    with pytest.raises(
        TypeError,
        match=r"^state must be the AdamState that AdamW.init\(params\) returns, got "
        r"SGDState",
    ) as caught:
        opt.update(GRADS, eqxopt.SGD(0.1).init(PARAMS), PARAMS)
    assert isinstance(caught.value.__cause__, jaxtyping.TypeCheckError)


def test_a_wrong_gradient_shape_is_caught_by_the_annotations_naming_the_leaf():
    import jaxtyping

    opt = eqxopt.Adam(0.1)
    with pytest.raises(
        ValueError, match=r"^grads\['w'\] has shape \(2,\) but params\['w'\] has shape"
    ) as caught:
        opt.step({"w": jnp.ones(2)}, opt.init(PARAMS), PARAMS)
    assert isinstance(caught.value.__cause__, jaxtyping.TypeCheckError)
