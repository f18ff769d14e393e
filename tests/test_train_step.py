"""Whole train steps (forward, backward and the optimizer step in one `jit`): the
donated step writes every weight in place with no copy, and the train-step helper."""

import re
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from helpers import assert_trees_close, run_on_8_devices


class Block(eqx.Module):
    """A transformer block: attention's query, key and value projections all read the
    same input, so the backward pass reads each weight in three parallel branches."""

    ln: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, width: int, key, bias: bool = False):
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln = eqx.nn.LayerNorm(width)
        self.attn = eqx.nn.MultiheadAttention(
            4,
            width,
            use_query_bias=bias,
            use_key_bias=bias,
            use_value_bias=bias,
            use_output_bias=bias,
            key=k1,
        )
        self.up = eqx.nn.Linear(width, 2 * width, key=k2)
        self.down = eqx.nn.Linear(2 * width, width, key=k3)

    def __call__(self, x):
        h = jax.vmap(self.ln)(x)
        x = x + self.attn(h, h, h)
        return x + jax.vmap(lambda v: self.down(jax.nn.gelu(self.up(v))))(x)


def small_model(width: int = 256, bias: bool = False):
    # Width 256: the weights are large enough for a kernel call each; the norms
    # and biases share calls. With `bias`, each attention projection has a bias
    # too: a sibling's bias then lies between a projection and the norm before it.
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return [
        eqx.nn.Linear(8, width, key=k1),
        Block(width, k2, bias),
        Block(width, k3, bias),
        eqx.nn.Linear(width, 1, key=k3),
    ]


def loss_fn(model, x, y):
    h = jax.vmap(model[0])(x)
    for block in model[1:-1]:
        h = block(h)
    return jnp.mean((jax.vmap(model[-1])(h) - y) ** 2)


def batch():
    x = jax.random.normal(jax.random.key(1), (6, 8))
    return x, jnp.sin(x[:, :1])


def copies_of_inputs(hlo: str) -> list[str]:
    """Copies in an optimized HLO module of an entry parameter (or of such a copy)."""
    inputs = set(re.findall(r"(%\S+) = \S+ parameter\(", hlo))
    found = []
    for name, shape, operand in re.findall(
        r"(%\S+) = (\S+?)\{[^}]*\} copy\((%[^)]+)\)", hlo
    ):
        if operand in inputs:
            inputs.add(name)
            found.append(f"{shape} copy({operand})")
    return found


def peak_bytes(memory) -> int:
    """Live at once in a compiled step (XLA's memory analysis): the arguments, the
    outputs not written over an argument, and the temporaries."""
    return (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes
    )


def fresh(tree):
    """Own buffers for every array (a donated step consumes its inputs)."""
    return jax.tree.map(lambda v: jnp.copy(v) if eqx.is_array(v) else v, tree)


def hand_written_step(opt):
    # The optimizer and the batch go first, not donated (a donated batch has no
    # output to reuse its buffers: JAX would warn).
    @eqx.filter_jit(donate="all-except-first")
    def step(opt_and_batch, model, state):
        opt, x, y = opt_and_batch
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        model, state = opt.step(grads, state, model, donate=True)
        return model, state, loss

    return step


@pytest.mark.parametrize(
    "opt",
    [eqxopt.AdamW(1e-3), eqxopt.SGD(1e-2, momentum=0.9)],
    ids=["AdamW", "SGD-momentum"],
)
@pytest.mark.needs_compiler
def test_donated_train_step_copies_no_weight(opt):
    """The in-place writes of the native kernels come after every read of the
    weights in the backward pass, so XLA keeps no copy of any of them (it did: a
    full copy of every weight matrix, from reads such as `dx = dy @ w.T` that nothing
    ordered before the write)."""
    assert eqxopt.native_kernels_available()
    model, (x, y) = small_model(), batch()
    state = opt.init(model)
    step = hand_written_step(opt)
    compiled = step.lower((opt, x, y), model, state).compile()
    text = compiled.compiled.as_text()
    assert "eqxopt_elementwise" in text
    assert copies_of_inputs(text) == []
    # The same numbers as XLA's own code.
    got = step((opt, x, y), *fresh((model, state)))
    eqxopt.set_native_kernels(False)
    try:
        expected = hand_written_step(opt)((opt, x, y), model, state)
    finally:
        eqxopt.set_native_kernels(True)
    assert_trees_close(got, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------ make_train_step


def close(actual, expected, rtol=1e-6, atol=1e-7):
    """`assert_trees_close` on the arrays of two trees (models hold functions too)."""
    assert_trees_close(
        eqx.filter(actual, eqx.is_array),
        eqx.filter(expected, eqx.is_array),
        rtol=rtol,
        atol=atol,
    )


def mlp():
    return eqx.nn.MLP(8, 1, 16, 2, key=jax.random.key(2))


def mlp_loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def run_steps(step, model, state, n=3, **kwargs):
    losses = []
    x, y = batch()
    for _ in range(n):
        model, state, loss = step(model, state, x, y, **kwargs)
        losses.append(loss)
    return model, state, losses


@pytest.mark.parametrize(
    "opt",
    [eqxopt.AdamW(1e-2), eqxopt.SGD(1e-2, momentum=0.9), eqxopt.LAMB(1e-2)],
    ids=["AdamW", "SGD-momentum", "LAMB"],
)
def test_make_train_step_matches_a_hand_written_step(opt):
    model = mlp()
    got = run_steps(
        eqxopt.make_train_step(mlp_loss, opt), fresh(model), opt.init(model)
    )

    @eqx.filter_jit
    def by_hand(model, state, x, y):
        loss, grads = eqx.filter_value_and_grad(mlp_loss)(model, x, y)
        model, state = opt.step(grads, state, model)
        return model, state, loss

    expected = run_steps(by_hand, model, opt.init(model))
    close(got, expected)
    # The activation function (not an array) passes through.
    assert got[0].activation is model.activation


class CompileCount:
    """Counts XLA compiles while active (JAX's compile events)."""

    def __init__(self):
        self.count, self.active = 0, False
        jax.monitoring.register_event_duration_secs_listener(self.listen)

    def listen(self, event, duration, **kwargs):
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


COMPILES = CompileCount()


def test_make_train_step_reuses_the_compiled_step_for_new_hyperparameters():
    model = mlp()
    opt = eqxopt.AdamW(1e-2)
    step = eqxopt.make_train_step(mlp_loss, opt)
    x, y = batch()
    state = opt.init(model)
    step(fresh(model), fresh(state), x, y)  # compiles
    # (Building a schedule evaluates it at its breakpoints, to check its range:
    # eager operations, compiled once per process, outside the counted steps.)
    schedule = eqxopt.AdamW(eqxopt.WarmupCosine(1e-2, 1e-4, 5, 50))
    other = eqxopt.AdamW(eqxopt.WarmupCosine(3e-2, 1e-5, 2, 20))
    schedule_states = schedule.init(model), other.init(model)
    COMPILES.count, COMPILES.active = 0, True
    try:
        results = []
        for lr in (3e-2, 1e-3):
            new = eqxopt.AdamW(lr)
            results.append(step(fresh(model), fresh(state), x, y, opt=new))
            results.append(
                eqxopt.make_train_step(mlp_loss, new)(fresh(model), fresh(state), x, y)
            )
        step(fresh(model), schedule_states[0], x, y, opt=schedule)
        first_schedule_compiles = COMPILES.count
        step(fresh(model), schedule_states[1], x, y, opt=other)
    finally:
        COMPILES.active = False
    # A new schedule structure compiles once; new values of either never do.
    assert COMPILES.count == first_schedule_compiles <= 1
    # ... and the new values are used.
    for lr, pair in zip((3e-2, 1e-3), (results[:2], results[2:])):
        for got in pair:
            expected = eqxopt.AdamW(lr).step(
                eqx.filter_grad(mlp_loss)(model, x, y), state, model
            )
            close(got[:2], expected)


def test_make_train_step_has_aux():
    def loss_with_aux(model, x, y):
        pred = jax.vmap(model)(x)
        return jnp.mean((pred - y) ** 2), {"pred": pred}

    model, opt = mlp(), eqxopt.Adam(1e-2)
    step = eqxopt.make_train_step(loss_with_aux, opt, has_aux=True)
    x, y = batch()
    new_model, state, loss, aux = step(fresh(model), opt.init(model), x, y)
    close(aux["pred"], jax.vmap(model)(x))
    close(loss, mlp_loss(model, x, y))
    close(
        (new_model, state),
        opt.step(eqx.filter_grad(mlp_loss)(model, x, y), opt.init(model), model),
        rtol=1e-6,
        atol=1e-7,
    )


def test_make_train_step_on_packed_parameters():
    model, opt = mlp(), eqxopt.AdamW(1e-2)
    step = eqxopt.make_train_step(mlp_loss, opt)
    packed = eqxopt.pack(model)
    new_packed, state, losses = run_steps(step, packed, opt.init(packed))
    assert isinstance(new_packed, eqxopt.Packed)
    assert isinstance(state.mu, eqxopt.Packed)
    tree_model, _, tree_losses = run_steps(step, fresh(model), opt.init(model))
    close(losses, tree_losses)
    close(new_packed.unpack(), tree_model)


@pytest.mark.parametrize("bias", [False, True], ids=["no-biases", "attention-biases"])
@pytest.mark.needs_compiler
def test_make_train_step_donated_step_copies_no_weight(bias):
    """No copy of a weight, and a peak memory no higher than optax's; with
    attention biases too (a sibling projection's bias between a projection and the
    norm before it: the step by hand copies the value projections there)."""
    opt = eqxopt.AdamW(1e-3)
    model, (x, y) = small_model(bias=bias), batch()
    step = eqxopt.make_train_step(loss_fn, opt)
    state = opt.init(model)
    compiled = step.lower(model, state, x, y).compile()
    text = compiled.as_text()
    assert "eqxopt_elementwise" in text
    assert copies_of_inputs(text) == []
    # Every model and state buffer is written over (aliased); the only new outputs
    # are the loss, the int32 marker `eqx.filter_jit` returns, and the output
    # tuple's table of pointers (8 bytes an output).
    memory = compiled.memory_analysis()
    donated = jax.tree.leaves(eqx.filter((model, state), eqx.is_array))
    assert memory.alias_size_in_bytes == sum(leaf.nbytes for leaf in donated)
    new_bytes = memory.output_size_in_bytes - memory.alias_size_in_bytes
    assert new_bytes <= 4 + 4 + 8 * (len(donated) + 2)
    # Peak memory (arguments, new outputs, temporaries) no higher than optax's step
    # as its docs write it (it was 1.09x: large gradients alive at once while their
    # weights waited for the in-place writes).
    tx = optax.adamw(1e-3)

    @eqx.filter_jit(donate="all-except-first")
    def optax_step(batch, model, opt_state):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, *batch)
        params = eqx.filter(model, eqx.is_array)
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(model, updates), opt_state, loss

    # optax promotes dtypes as JAX does by default.
    with jax.numpy_dtype_promotion("standard"):
        optax_state = tx.init(eqx.filter(model, eqx.is_array))
        lowered = optax_step.lower((x, y), model, optax_state)
    assert peak_bytes(memory) <= peak_bytes(
        lowered.compile().compiled.memory_analysis()
    )


def test_make_train_step_donates_model_and_state_and_keeps_static_values():
    # The step's own dispatch (not `eqx.filter_jit`) keeps filter_jit's rules: model
    # and state arrays are donated, the batch's are not, and a non-array argument is
    # static (a new value compiles again and is used).
    def scaled_loss(model, x, y, scale):
        return scale * mlp_loss(model, x, y)

    model, opt = mlp(), eqxopt.SGD(1e-2, momentum=0.9)
    step = eqxopt.make_train_step(scaled_loss, opt)
    x, y = batch()
    results = {}
    for scale in (1.0, 2.0):
        given, state = fresh(model), opt.init(model)
        results[scale] = step(given, state, x, y, scale)
        assert given.layers[0].weight.is_deleted()
        # The step count and a velocity per weight and bias.
        assert len(jax.tree.leaves(state)) == 1 + len(
            jax.tree.leaves(eqx.filter(model, eqx.is_array))
        )
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state))
        assert not x.is_deleted()
        assert results[scale][0].activation is model.activation
    for scale, got in results.items():
        grads = eqx.filter_grad(scaled_loss)(model, x, y, scale)
        close(got[:2], opt.step(grads, opt.init(model), model))
        close(got[2], scaled_loss(model, x, y, scale))


def test_make_train_step_rejects_bad_arguments():
    with pytest.raises(TypeError, match="loss_fn must be callable, got int"):
        eqxopt.make_train_step(3, eqxopt.SGD(0.1))  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="opt must be an eqxopt transform"):
        eqxopt.make_train_step(mlp_loss, "adam")  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="has_aux must be a bool, got str"):
        eqxopt.make_train_step(mlp_loss, eqxopt.SGD(0.1), has_aux="yes")  # pyright: ignore[reportArgumentType]


def test_make_train_step_aux_follows_each_batch_shape():
    """A non-array aux (the batch size) is the one of the batch just stepped: the
    program traced for each shape returns its own, as with `eqx.filter_jit`."""

    def loss_with_size(model, x, y):
        return mlp_loss(model, x, y), {"size": x.shape[0], "name": "mse"}

    opt = eqxopt.SGD(1e-2)
    step = eqxopt.make_train_step(loss_with_size, opt, has_aux=True)
    model, state = mlp(), opt.init(mlp())
    sizes = []
    for n in (8, 16, 8, 4):
        x = jax.random.normal(jax.random.key(n), (n, 8))
        model, state, _, aux = step(model, state, x, jnp.sin(x[:, :1]))
        sizes.append(aux["size"])
        assert aux["name"] == "mse"
    assert sizes == [8, 16, 8, 4]


def _value_step(opt, loss):
    """A step by hand that passes the loss (and the loss or gradient function of
    the parameters on this batch) to the keywords `opt` takes."""

    @eqx.filter_jit
    def step(model, state, x, y):
        value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
        extra = {
            "value": value,
            "value_fn": lambda p, **_: loss(p, x, y),
            "obj_fn": lambda p, *_: loss(p, x, y),
            "grad_fn": lambda p, *_: eqx.filter_grad(loss)(p, x, y),
        }
        extra = {k: v for k, v in extra.items() if opt.takes_keyword(k)}
        model, state = opt.step(grads, state, model, **extra)
        return model, state, value

    return step


@pytest.mark.parametrize(
    "opt",
    [
        eqxopt.Chain(eqxopt.SGD(1e-1), eqxopt.ReduceOnPlateau(patience=1)),
        eqxopt.Momo(1e-1),
        eqxopt.MomoAdam(1e-2),
        eqxopt.PolyakSGD(max_learning_rate=1e-1),
        eqxopt.LBFGS(),
        eqxopt.SAM(eqxopt.SGD(1e-2), rho=0.05),
        eqxopt.Sophia(1e-2),
    ],
    ids=["ReduceOnPlateau", "Momo", "MomoAdam", "PolyakSGD", "LBFGS", "SAM", "Sophia"],
)
def test_make_train_step_passes_the_loss_to_transforms_that_take_it(opt):
    """The loss (`value=`) and, for a linesearch, a Hessian estimate or a second
    gradient, the loss of the parameters on the batch: the step has them in hand."""
    model = mlp()
    got = run_steps(
        eqxopt.make_train_step(mlp_loss, opt), fresh(model), opt.init(model)
    )
    expected = run_steps(_value_step(opt, mlp_loss), model, opt.init(model))
    close(got, expected, rtol=1e-5, atol=1e-6)
    assert not jnp.allclose(
        got[0].layers[0].weight, model.layers[0].weight
    )  # the parameters moved


def test_make_train_step_passes_the_loss_with_aux():
    def loss_with_aux(model, x, y):
        return mlp_loss(model, x, y), jnp.float32(1.0)

    opt = eqxopt.PolyakSGD(max_learning_rate=1e-1)
    model, (x, y) = mlp(), batch()
    step = eqxopt.make_train_step(loss_with_aux, opt, has_aux=True)
    new_model, state, loss, aux = step(fresh(model), opt.init(model), x, y)
    expected = _value_step(opt, mlp_loss)(model, opt.init(model), x, y)
    close((new_model, state, loss), expected)
    assert aux == 1.0


def positive_loss(model, x, y):
    loss = mlp_loss(model, x, y)
    return eqx.error_if(loss, loss > 0, "the loss is positive")


def test_make_train_step_raises_equinox_runtime_errors():
    """`eqx.error_if` in the loss raises `eqx.EquinoxRuntimeError` with its
    message, as from a step written with `eqx.filter_jit`."""
    opt = eqxopt.SGD(1e-2)
    model, (x, y) = mlp(), batch()
    step = eqxopt.make_train_step(positive_loss, opt)
    with pytest.raises(eqx.EquinoxRuntimeError, match="the loss is positive"):
        step(fresh(model), opt.init(model), x, y)

    @eqx.filter_jit
    def by_hand(model, state, x, y):
        loss, grads = eqx.filter_value_and_grad(positive_loss)(model, x, y)
        return *opt.step(grads, state, model), loss

    with pytest.raises(eqx.EquinoxRuntimeError, match="the loss is positive"):
        by_hand(model, opt.init(model), x, y)


def test_step_raises_equinox_runtime_errors_of_the_functions_it_is_given():
    """The same from `update`/`step` for a loss passed in (LBFGS's `value_fn`)."""
    opt = eqxopt.LBFGS()
    model, (x, y) = mlp(), batch()
    grads = eqx.filter_grad(mlp_loss)(model, x, y)
    with pytest.raises(eqx.EquinoxRuntimeError, match="the loss is positive"):
        opt.step(
            grads,
            opt.init(model),
            model,
            value=mlp_loss(model, x, y),
            value_fn=lambda p: positive_loss(p, x, y),
        )


def test_make_train_step_refuses_an_optax_optimizer():
    opt = eqxopt.SGD(1e-2)
    model, (x, y) = mlp(), batch()
    step = eqxopt.make_train_step(mlp_loss, opt)
    with pytest.raises(
        TypeError,
        match=r"^opt must be an eqxopt transform .*got GradientTransformationExtraArgs"
        r"; wrap an optax transformation as eqxopt\.from_optax\(tx\)$",
    ):
        step(model, opt.init(model), x, y, opt=optax.adamw(1e-3))
    assert not model.layers[0].weight.is_deleted()  # refused before the call
    with pytest.raises(TypeError, match=r"opt must be .*eqxopt\.from_optax\(tx\)"):
        eqxopt.make_train_step(mlp_loss, optax.sgd(1e-2))  # pyright: ignore[reportArgumentType]
    # from_optax is the way in
    wrapped = eqxopt.from_optax(optax.sgd(1e-2))
    new_model, _, _ = step(fresh(model), wrapped.init(model), x, y, opt=wrapped)
    grads = eqx.filter_grad(mlp_loss)(model, x, y)
    close(new_model, opt.step(grads, opt.init(model), model)[0])


ZERO1_SCRIPT = textwrap.dedent(
    """
    import warnings

    warnings.filterwarnings("error", message=".*donated buffers")

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import eqxopt

    mesh = Mesh(np.array(jax.devices()), ("data",))  # Auto axes
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    host = {
        "w": rng.normal(size=(16, 12)).astype(np.float32),
        "b": rng.normal(size=(8,)).astype(np.float32),
        "odd": rng.normal(size=(3, 5)).astype(np.float32),
    }
    x = rng.normal(size=(4, 16)).astype(np.float32)

    def loss(p, x):
        h = x @ p["w"]
        return jnp.mean(h**2) + jnp.mean(p["b"] ** 2) + jnp.mean(jnp.tanh(p["odd"]))

    for opt in (eqxopt.AdamW(1e-2, weight_decay=0.1), eqxopt.SGD(1e-2, momentum=0.9)):
        step = eqxopt.make_train_step(loss, opt)
        params = jax.device_put(host, replicated)
        state = eqxopt.shard_state(opt.init(params), mesh, "data")
        state_specs = [s.sharding for s in jax.tree.leaves(state)]
        one_params = jax.device_put(host, jax.devices()[0])
        one_state = opt.init(one_params)
        for _ in range(3):
            params, state, value = step(params, state, jax.device_put(x, replicated))
            one_params, one_state, one_value = step(
                one_params, one_state, jax.device_put(x, jax.devices()[0])
            )
            for k, v in params.items():
                assert v.sharding.is_equivalent_to(replicated, v.ndim), (k, v.sharding)
            for leaf, want in zip(jax.tree.leaves(state), state_specs, strict=True):
                assert leaf.sharding.is_equivalent_to(want, leaf.ndim), leaf.sharding
            for a, b in zip(
                jax.tree.leaves((params, state, value)),
                jax.tree.leaves((one_params, one_state, one_value)),
                strict=True,
            ):
                # (the partitioned program sums the gradients in another order)
                np.testing.assert_allclose(
                    np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6
                )
        assert any("data" in str(s.spec) for s in state_specs)
    print("ok")
    """
)


def test_make_train_step_keeps_a_zero1_placement_on_an_auto_mesh():
    """Replicated parameters and a state split over "data" (ZeRO-1) come back as
    they went in, as from `opt.step`, with the numbers of one device."""
    assert run_on_8_devices(ZERO1_SCRIPT).strip() == "ok"


def test_per_example_optimizers_need_the_batch_axis_at_construction():
    """An optimizer that takes per-example gradients (`DPSGD`, a `Chain` starting
    with `DifferentiallyPrivateAggregate`) is refused by `make_train_step` without
    the batch axis, when the step is made (not at its first call); with it, the
    step computes one gradient per example, as `jax.vmap` of the gradient does."""
    opt = eqxopt.DPSGD(1e-2, l2_norm_clip=1.0, noise_multiplier=0.0, seed=0)
    with pytest.raises(
        TypeError,
        match=r"^DPSGD takes per-example gradients: give make_train_step the batch "
        r"axis of each batch argument, per_example_axes=0",
    ):
        eqxopt.make_train_step(mlp_loss, opt)
    chain = eqxopt.Chain(
        eqxopt.DifferentiallyPrivateAggregate(1.0, 0.0, seed=0), eqxopt.SGD(1e-2)
    )
    with pytest.raises(TypeError, match=r"^Chain takes per-example gradients"):
        eqxopt.make_train_step(mlp_loss, chain)
    with pytest.raises(
        ValueError, match=r"^per_example_axes is for optimizers that take per-example"
    ):
        eqxopt.make_train_step(mlp_loss, eqxopt.SGD(1e-2), per_example_axes=0)

    model, (x, y) = mlp(), batch()
    step = eqxopt.make_train_step(mlp_loss, opt, per_example_axes=0)
    new_model, _, loss = step(fresh(model), opt.init(model), x, y)

    def one(m, xi, yi):
        return mlp_loss(m, xi[None], yi[None])

    grads = eqx.filter_vmap(eqx.filter_grad(one), in_axes=(None, 0, 0))(model, x, y)
    expected, _ = opt.step(grads, opt.init(model), model)
    close(new_model, expected)
    np.testing.assert_allclose(loss, mlp_loss(model, x, y), rtol=1e-6)


def test_keywords_come_from_the_declarations():
    """The step hands each transform what its `keywords` declare it wants, by what
    it is: the loss to `PolyakSGD` (`value`), the loss as a function of the
    parameters to `LBFGS` (`value_fn`) and to `Sophia` (`obj_fn`), its gradient to
    `SAM` (`grad_fn`), and nothing to a transform that declares nothing."""
    from eqxopt.extend import Supplied

    assert dict(eqxopt.PolyakSGD().wanted_keywords()) == {"value": Supplied.LOSS}
    assert dict(eqxopt.LBFGS().wanted_keywords()) == {
        "value": Supplied.LOSS,
        "value_fn": Supplied.LOSS_FUNCTION,
    }
    assert dict(eqxopt.LBFGS(linesearch=False).wanted_keywords()) == {}
    sam = eqxopt.SAM(eqxopt.SGD(0.1))
    assert sam.wanted_keywords()["grad_fn"] is Supplied.GRAD_FUNCTION
    chain = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.PolyakSGD())
    assert dict(chain.wanted_keywords()) == {"value": Supplied.LOSS}
    assert dict(eqxopt.AdamW(0.1).wanted_keywords()) == {}
    model, (x, y) = mlp(), batch()
    for opt in (eqxopt.PolyakSGD(), eqxopt.LBFGS(), sam):
        step = eqxopt.make_train_step(mlp_loss, opt)
        _, _, loss = step(fresh(model), opt.init(model), x, y)
        assert np.isfinite(loss)
