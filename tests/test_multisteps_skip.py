"""`MultiSteps`'s `should_skip_update_fn` and optax's two predicates for it
(`skip_not_finite`, `skip_large_updates`), against optax's `MultiSteps` with the
same predicate: the parameters, the counters and `skip_state` after every step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from helpers import assert_trees_close, grad_stream, nested_tree

STEPS = 24
PARAMS = nested_tree()


def stream():
    """Gradients with a NaN, an infinity or a hundredfold gradient at some steps
    (none on two update steps in a row, so both predicates accept some updates)."""
    out = list(grad_stream(PARAMS, STEPS))
    for i in (2, 9, 16):
        out[i] = dict(out[i], scale=jnp.asarray(jnp.nan))
    for i in (5, 20):
        out[i] = dict(
            out[i],
            dense=dict(out[i]["dense"], b=out[i]["dense"]["b"].at[1].set(-jnp.inf)),
        )
    for i in (7, 13):
        out[i] = jax.tree.map(lambda g: 100 * g, out[i])
    return out


GRADS = stream()
# Between the squared norms of the plain gradients (about 20) and the huge ones.
BOUND = 40.0

PREDICATES = {
    "skip_not_finite": (eqxopt.skip_not_finite, optax.skip_not_finite),
    "skip_large_updates": (
        functools.partial(eqxopt.skip_large_updates, max_squared_norm=BOUND),
        functools.partial(optax.skip_large_updates, max_squared_norm=BOUND),
    ),
}


@pytest.mark.parametrize("mean", [True, False])
@pytest.mark.parametrize("name", list(PREDICATES))
def test_multisteps_with_a_predicate_matches_optax(name, mean):
    ours_fn, theirs_fn = PREDICATES[name]
    ours = eqxopt.MultiSteps(eqxopt.Adam(0.05), 3, mean, should_skip_update_fn=ours_fn)
    ref = optax.MultiSteps(
        optax.adam(0.05), 3, use_grad_mean=mean, should_skip_update_fn=theirs_fn
    )
    params, theirs = PARAMS, PARAMS
    state = ours.init(params)
    with jax.numpy_dtype_promotion("standard"):  # optax promotes implicitly
        ref_state = ref.init(theirs)
        update = jax.jit(ref.update)
    assert_trees_close(state.skip_state, ref_state.skip_state, rtol=0, atol=0)
    skipped = updated = 0
    for step, g in enumerate(GRADS):
        before = int(state.gradient_step)
        params, state = ours.step(g, state, params)
        with jax.numpy_dtype_promotion("standard"):
            updates, ref_state = update(g, ref_state, theirs)
            theirs = optax.apply_updates(theirs, updates)
        what = f"step {step}"
        assert_trees_close(params, theirs, rtol=2e-5, atol=2e-6)
        assert sorted(state.skip_state) == sorted(ref_state.skip_state), what
        for key, value in ref_state.skip_state.items():
            np.testing.assert_allclose(
                state.skip_state[key], value, rtol=1e-6, err_msg=what
            )
            assert state.skip_state[key].dtype == value.dtype, what
        assert int(state.mini_step) == int(ref_state.mini_step), what
        assert int(state.gradient_step) == int(ref_state.gradient_step), what
        skipped += bool(state.skip_state["should_skip"])
        updated += bool(ours.has_updated(state))
        assert bool(ours.has_updated(state)) == (state.gradient_step > before), what
    assert skipped >= 5 and updated >= 3
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))


def test_a_skipped_call_leaves_the_state_as_it_was():
    opt = eqxopt.MultiSteps(
        eqxopt.SGD(0.1, momentum=0.9), 2, should_skip_update_fn=eqxopt.skip_not_finite
    )
    state = opt.init(PARAMS)
    params, state = opt.step(GRADS[0], state, PARAMS)
    new, after = opt.step(GRADS[2], state, params)  # a NaN: skipped
    assert_trees_close(new, params, rtol=0, atol=0)
    for field in ("mini_step", "gradient_step", "acc", "counts", "inner"):
        assert_trees_close(getattr(after, field), getattr(state, field), rtol=0, atol=0)
    assert bool(after.skip_state["should_skip"])
    assert int(after.skip_state["num_not_finite"]) == 1


@pytest.mark.parametrize("every_k", [1, 3])
def test_has_updated_is_false_after_a_skipped_call(every_k):
    # Issue 39, item 2: a call skipped right after an update said it had updated.
    opt = eqxopt.MultiSteps(
        eqxopt.Adam(0.05), every_k, should_skip_update_fn=eqxopt.skip_not_finite
    )
    params, state = PARAMS, opt.init(PARAMS)
    assert not bool(opt.has_updated(state))
    seen = set()
    for step, g in enumerate(GRADS):
        new, state = opt.step(g, state, params)
        moved = any(
            bool(jnp.any(a != b))
            for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params))
        )
        skipped = bool(state.skip_state["should_skip"])
        assert bool(opt.has_updated(state)) == moved, f"step {step}"
        assert bool(state.skipped) == skipped, f"step {step}"
        seen.add((moved, skipped))
        params = new
    # Updates, skipped calls, and (every_k > 1) calls that only accumulated.
    assert {(True, False), (False, True)} <= seen


def test_without_a_predicate_the_state_holds_no_more_arrays():
    plain = eqxopt.MultiSteps(eqxopt.SGD(0.1), 2)
    state = plain.init(PARAMS)
    assert plain.should_skip_update_fn is None
    assert state.skip_state == () and state.skipped is None
    _, state = plain.update(GRADS[0], state, PARAMS)
    assert state.skip_state == () and state.skipped is None
    # The same leaves as the state's other fields: checkpoints of leaves load.
    fields = (
        state.mini_step,
        state.gradient_step,
        state.acc,
        state.counts,
        state.inner,
    )
    assert len(jax.tree.leaves(state)) == len(jax.tree.leaves(fields))


def test_the_predicates_match_optax():
    tree = {"a": jnp.asarray([1.0, jnp.nan, jnp.inf]), "b": jnp.asarray(2.0), "c": None}
    finite = {"a": jnp.asarray([1.0, -2.0]), "b": jnp.asarray(3.0)}
    for updates in (tree, finite):
        theirs_tree = {k: v for k, v in updates.items() if v is not None}
        for ours_fn, theirs_fn in PREDICATES.values():
            ours = ours_fn(updates, jnp.asarray(0), None)
            theirs = theirs_fn(theirs_tree, jnp.asarray(0), None)
            assert bool(ours[0]) == bool(theirs[0])
            assert sorted(ours[1]) == sorted(theirs[1])
            for key, value in theirs[1].items():
                np.testing.assert_allclose(ours[1][key], value, rtol=1e-6)


def test_should_skip_update_fn_errors():
    with pytest.raises(TypeError, match="should_skip_update_fn must be a function"):
        eqxopt.MultiSteps(eqxopt.SGD(0.1), 2, should_skip_update_fn=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="should_skip_update_fn must be a function"):
        eqxopt.MultiSteps(eqxopt.SGD(0.1), 2, should_skip_update_fn=eqxopt.SGD(0.1))  # type: ignore[arg-type]

    def not_a_bool(updates, gradient_step, params):
        return jnp.asarray(1.0), ()

    opt = eqxopt.MultiSteps(eqxopt.SGD(0.1), 2, should_skip_update_fn=not_a_bool)
    with pytest.raises(ValueError, match="should_skip_update_fn must return a bool"):
        opt.update(GRADS[0], opt.init(PARAMS), PARAMS)
