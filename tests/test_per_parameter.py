"""Per-parameter options: `LearningRateMultipliers` (torch's parameter groups with
their own `lr`) and `Maximize` (torch's `maximize=True`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import (
    Trajectory,
    assert_histories_close,
    compiles,
    grad_stream,
    run_eqxopt,
)

torch = pytest.importorskip("torch")

STEPS = 30


def _leaf(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


PARAMS = {"emb": _leaf(0, 5, 3), "dense": {"w": _leaf(1, 3, 4), "b": _leaf(2, 4)}}
GRADS = list(grad_stream(PARAMS, STEPS))


def run_torch_groups(make_opt, params, grads, group_of):
    """A torch optimizer over the leaves of `params`, with one parameter group per
    distinct `group_of(path)` (its keyword arguments)."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    tensors = [
        torch.nn.Parameter(torch.tensor(np.asarray(x, np.float32)))
        for _, x in with_paths
    ]
    groups = {}
    for (path, _), t in zip(with_paths, tensors):
        key = tuple(sorted(group_of(jax.tree_util.keystr(path)).items()))
        groups.setdefault(key, []).append(t)
    opt = make_opt([{"params": ts, **dict(k)} for k, ts in groups.items()])
    history = Trajectory(params)
    for g in grads:
        for t, gl in zip(tensors, jax.tree.leaves(g)):
            t.grad = torch.tensor(np.asarray(gl, np.float32))
        opt.step()
        history.append(
            treedef.unflatten([jnp.asarray(t.detach().numpy().copy()) for t in tensors])
        )
    return history


LR = 0.01


def _groups(path):
    if "emb" in path:
        return {"lr": LR * 0.1}
    if "'b'" in path:
        return {"lr": LR * 3.0}
    return {}


MULTIPLIERS = {"emb": 0.1, "dense": {"w": 1.0, "b": 3.0}}


def test_multipliers_match_torch_adamw_param_groups():
    expected = run_torch_groups(
        lambda groups: torch.optim.AdamW(groups, lr=LR, weight_decay=0.5),
        PARAMS, GRADS, _groups,
    )  # fmt: skip
    opt = eqxopt.LearningRateMultipliers(
        eqxopt.AdamW(LR, weight_decay=0.5), MULTIPLIERS
    )
    assert_histories_close(run_eqxopt(opt, PARAMS, GRADS), expected)


def _by_name(params):
    return {"emb": 0.1, "dense": {"w": 1.0, "b": 3.0}}


def test_multipliers_as_a_function_match_torch_sgd_param_groups():
    expected = run_torch_groups(
        lambda groups: torch.optim.SGD(groups, lr=LR, momentum=0.9, nesterov=True),
        PARAMS, GRADS, _groups,
    )  # fmt: skip
    opt = eqxopt.LearningRateMultipliers(
        eqxopt.SGD(LR, momentum=0.9, nesterov=True), _by_name
    )
    assert_histories_close(run_eqxopt(opt, PARAMS, GRADS), expected)


def test_a_prefix_multiplier_covers_its_subtree_and_new_values_reuse_the_step():
    g = GRADS[0]
    opt = eqxopt.LearningRateMultipliers(eqxopt.SGD(0.1), {"emb": 0.0, "dense": 2.0})
    updates, _ = opt.update(g, opt.init(PARAMS), PARAMS)
    np.testing.assert_array_equal(updates["emb"], np.zeros((5, 3)))
    np.testing.assert_allclose(updates["dense"]["b"], -0.2 * g["dense"]["b"], rtol=1e-6)
    with compiles() as log:
        other = eqxopt.LearningRateMultipliers(
            eqxopt.SGD(0.1), {"emb": 1.0, "dense": 0.5}
        )
        other.update(g, other.init(PARAMS), PARAMS)
    assert log == []


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: eqxopt.LearningRateMultipliers(eqxopt.SGD(0.1), {"emb": -1.0}),
         ValueError, r"multipliers\['emb'\] must be finite and >= 0, got -1.0"),
        (lambda: eqxopt.LearningRateMultipliers(eqxopt.SGD(0.1), {"emb": "x"}),
         TypeError, r"multipliers\['emb'\] must be a float, got str"),
        (lambda: eqxopt.LearningRateMultipliers(eqxopt.SGD(0.1), 1.0 * jnp.ones(2)),
         ValueError, "must be a scalar"),
        (lambda: eqxopt.LearningRateMultipliers(0.1, 1.0),
         TypeError, "inner must be an eqxopt transform"),
        (lambda: eqxopt.LearningRateMultipliers(eqxopt.SGD(0.1), {"x": 1.0})
         .init(PARAMS), ValueError, "multipliers"),
    ],
)  # fmt: skip
def test_bad_multipliers_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (lambda: eqxopt.AdamW(LR, weight_decay=0.5),
         lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=0.5, maximize=True)),
        (lambda: eqxopt.SGD(LR, momentum=0.9),
         lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9, maximize=True)),
    ],
    ids=["AdamW", "SGD"],
)  # fmt: skip
def test_maximize_matches_torch(ours, theirs):
    expected = run_torch_groups(theirs, PARAMS, GRADS, lambda path: {})
    actual = run_eqxopt(eqxopt.Maximize(ours()), PARAMS, GRADS)
    assert_histories_close(actual, expected)


def test_maximize_ascends_and_keeps_none_gradients():
    params = {"w": jnp.ones(2), "n": jnp.ones(2)}
    opt = eqxopt.Maximize(eqxopt.SGD(0.5))
    grads = {"w": jnp.ones(2), "n": None}
    new, _ = opt.step(grads, opt.init(params), params)
    np.testing.assert_allclose(new["w"], [1.5, 1.5])
    np.testing.assert_array_equal(new["n"], params["n"])


def test_skip_large_updates_matches_optax():
    optax = pytest.importorskip("optax")
    import functools

    from helpers import run_optax

    # every fourth gradient is large: skipped
    grads = [
        jax.tree.map(functools.partial(jnp.multiply, 10.0 if i % 4 == 0 else 1.0), g)
        for i, g in enumerate(GRADS)
    ]
    bound = 60.0
    expected = run_optax(
        optax.MultiSteps(
            optax.adamw(0.05, weight_decay=0.1),
            1,
            should_skip_update_fn=functools.partial(
                optax.skip_large_updates, max_squared_norm=bound
            ),
        ).gradient_transformation(),
        PARAMS,
        grads,
    )
    opt = eqxopt.SkipLargeUpdates(eqxopt.AdamW(0.05, weight_decay=0.1), bound)
    actual = run_eqxopt(opt, PARAMS, grads)
    assert_histories_close(actual, expected)
    state = opt.init(PARAMS)
    _, state = opt.update(grads[0], state, PARAMS)
    assert bool(state.should_skip) and int(state.inner.step) == 0
    _, state = opt.update(grads[1], state, PARAMS)
    assert not bool(state.should_skip) and int(state.inner.step) == 1
    with pytest.raises(ValueError, match="max_squared_norm"):
        eqxopt.SkipLargeUpdates(eqxopt.SGD(0.1), 0.0)


def _mean_loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def test_microbatch_equals_the_full_batch_gradient():
    import equinox as eqx

    model = eqx.nn.MLP(3, 1, 8, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (12, 3))
    y = jax.random.normal(jax.random.key(2), (12, 1))
    grad_fn = eqx.filter_value_and_grad(_mean_loss)
    loss, grads = grad_fn(model, x, y)
    for k in (1, 3, 4):
        loss_k, grads_k = eqx.filter_jit(eqxopt.microbatch(grad_fn, k, (1, 2)))(
            model, x, y
        )
        np.testing.assert_allclose(loss_k, loss, rtol=1e-6)
        for a, b in zip(jax.tree.leaves(grads_k), jax.tree.leaves(grads)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        assert jax.tree.structure(grads_k) == jax.tree.structure(grads)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda f: eqxopt.microbatch(f, 0), ValueError, "num_microbatches must be"),
        (lambda f: eqxopt.microbatch(f, 2.0), TypeError, "num_microbatches must be"),
        (lambda f: eqxopt.microbatch(f, 5)(None, jnp.ones((12, 3)), jnp.ones(12)),
         ValueError, r"argument 1 has a leaf of shape \(12, 3\)"),
        (lambda f: eqxopt.microbatch(f, 2, (1, 5))(None, jnp.ones((12, 3))),
         ValueError, "batch_argnums holds 5"),
    ],
)  # fmt: skip
def test_microbatch_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(_mean_loss)


def test_sgd_velocity_dtype():
    params = {"w": jnp.ones(4, jnp.bfloat16)}
    opt = eqxopt.SGD(0.1, momentum=0.9, velocity_dtype=jnp.float32)
    state = opt.init(params)
    assert state.velocity["w"].dtype == jnp.float32
    g = {"w": jnp.full(4, 1e-3, jnp.bfloat16)}
    new, state = opt.step(g, state, params)
    assert new["w"].dtype == jnp.bfloat16 and state.velocity["w"].dtype == jnp.float32
    np.testing.assert_allclose(state.velocity["w"], np.float32(jnp.bfloat16(1e-3)))
    with pytest.raises(TypeError, match="velocity_dtype"):
        eqxopt.SGD(0.1, velocity_dtype=jnp.int32)
