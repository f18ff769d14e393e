"""DiLoCo (Douillard et al., 2023): with H = 1 and an outer SGD at learning rate 1,
data-parallel SGD bit for bit; with H > 1 (inner AdamW, outer Nesterov SGD), a
NumPy transcription of the algorithm over several outer rounds, under
`jax.vmap` replicas and under `jax.shard_map` on an 8-device CPU mesh (the two
agree); the compiled programs' all-reduces (none in a local step, one per leaf in
a synchronisation, one per leaf in every data-parallel step); two processes
joined by `jax.distributed` against one process with two replicas; checkpoints;
and the errors."""

import pathlib
import tempfile
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import run_on_8_devices

R = 4  # replicas
H = 3  # inner steps per round
ROUNDS = 4
LR, WD, EPS = 1e-2, 0.1, 1e-8
B1, B2 = 0.9, 0.999
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9


def problem(replicas=R, steps=H * ROUNDS):
    """Each replica's own linear-regression data for each step: `x[r, k]` of shape
    (8, 4), `y[r, k]` of shape (8, 3); and the starting parameters."""
    rng = np.random.default_rng(0)
    true = rng.normal(size=(4, 3))
    x = rng.normal(size=(replicas, steps, 8, 4))
    y = x @ true + 0.1 * rng.normal(size=(replicas, steps, 8, 3))
    params = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=(3,))}
    return x, y, params


def loss(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def np_grads(params, x, y):
    """`jax.grad(loss)` in NumPy float64."""
    err = 2 * (x @ params["w"] + params["b"] - y) / y.size
    return {"w": x.T @ err, "b": err.sum(axis=0)}


def transcription(x, y, params, *, h=H, rounds=ROUNDS):
    """DiLoCo (the paper's Algorithm 1) in NumPy float64: inner AdamW on each
    replica (torch's form), outer Nesterov SGD (torch's) on the average of the
    replicas' distances from the anchor. The parameters of every replica after
    each inner step (shape (steps, replicas, ...) per leaf)."""
    replicas = x.shape[0]
    anchor = {k: v.copy() for k, v in params.items()}
    buf = None
    reps = [{k: v.copy() for k, v in params.items()} for _ in range(replicas)]
    m = [{k: np.zeros_like(v) for k, v in params.items()} for _ in range(replicas)]
    v = [{k: np.zeros_like(v) for k, v in params.items()} for _ in range(replicas)]
    history = []
    t = 0
    for _ in range(rounds):
        for _ in range(h):
            t += 1
            for r in range(replicas):
                g = np_grads(reps[r], x[r, t - 1], y[r, t - 1])
                for k in params:
                    p = reps[r][k] * (1 - LR * WD)
                    m[r][k] = B1 * m[r][k] + (1 - B1) * g[k]
                    v[r][k] = B2 * v[r][k] + (1 - B2) * g[k] ** 2
                    mhat = m[r][k] / (1 - B1**t)
                    vhat = v[r][k] / (1 - B2**t)
                    reps[r][k] = p - LR * mhat / (np.sqrt(vhat) + EPS)
            if t % h == 0:
                delta = {
                    k: np.mean([anchor[k] - rep[k] for rep in reps], axis=0)
                    for k in params
                }
                if buf is None:
                    buf = {k: delta[k].copy() for k in params}
                else:
                    buf = {k: OUTER_MOMENTUM * buf[k] + delta[k] for k in params}
                for k in params:
                    anchor[k] = anchor[k] - OUTER_LR * (
                        delta[k] + OUTER_MOMENTUM * buf[k]
                    )
                reps = [{k: anchor[k].copy() for k in params} for _ in reps]
            history.append({k: np.stack([rep[k] for rep in reps]) for k in params})
    return history


def make_opt(axis_name="replica", h=H):
    return eqxopt.DiLoCo(
        eqxopt.AdamW(LR, weight_decay=WD, eps=EPS),
        sync_every=h,
        outer=eqxopt.SGD(OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True),
        axis_name=axis_name,
    )


def replica_step(opt, how):
    """One step of one replica on its batch: `opt.step`, or `opt.local_step`
    (no synchronisation) for `how="local"`."""
    method = opt.local_step if how == "local" else opt.step

    def step(state, params, x, y):
        g = jax.grad(loss)(params, x, y)
        return method(g, state, params)

    return step


def run_vmapped(opt, x, y, params, *, how="step"):
    """Every replica's parameters after each step, the replicas as a vmapped axis
    named "replica"; `how="local"` takes local steps and syncs every H-th."""
    stacked = jax.tree.map(
        lambda p: jnp.broadcast_to(jnp.asarray(p, jnp.float32), (x.shape[0], *p.shape)),
        params,
    )
    state = jax.vmap(opt.init)(stacked)
    step = jax.jit(jax.vmap(replica_step(opt, how), axis_name="replica"))
    sync = jax.jit(jax.vmap(opt.sync, axis_name="replica"))
    history = []
    for k in range(x.shape[1]):
        stacked, state = step(state, stacked, jnp.asarray(x[:, k], jnp.float32),
                              jnp.asarray(y[:, k], jnp.float32))  # fmt: skip
        if how == "local" and (k + 1) % opt.sync_every == 0:
            stacked, state = sync(state, stacked)
        history.append(stacked)
    return history, state


def assert_close_to(history, expected, rtol, atol):
    worst = 0.0
    for got, want in zip(history, expected, strict=True):
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol, atol)
            worst = max(worst, float(np.max(np.abs(np.asarray(got[k]) - want[k]))))
    return worst


def test_h1_with_outer_sgd_at_rate_one_is_data_parallel_sgd_bit_for_bit():
    # Parameters, gradients and learning rate on a grid of 2^-10 small enough
    # that every product, sum and mean over 4 replicas is exact in float32: the
    # replicas' average of `p - lr g_r` is then `p - lr mean(g)` exactly.
    rng = np.random.default_rng(3)
    params = {
        "w": jnp.asarray(rng.integers(-64, 64, (5, 3)) / 64, jnp.float32),
        "b": jnp.asarray(rng.integers(-64, 64, (3,)) / 64, jnp.float32),
    }
    grads = [
        jax.tree.map(
            lambda p: jnp.asarray(rng.integers(-8, 8, (R, *p.shape)) / 8, p.dtype),
            params,
        )
        for _ in range(6)
    ]
    lr = 2.0**-3
    opt = eqxopt.DiLoCo(
        eqxopt.SGD(lr), sync_every=1, outer=eqxopt.SGD(1.0), axis_name="replica"
    )
    stacked = jax.tree.map(lambda p: jnp.broadcast_to(p, (R, *p.shape)), params)
    state = jax.vmap(opt.init)(stacked)
    by_update = (stacked, state)
    step = jax.jit(jax.vmap(opt.step, axis_name="replica"))
    update = jax.jit(jax.vmap(opt.update, axis_name="replica"))
    dp = params
    for g in grads:
        # Data parallel: the gradients averaged over the replicas, one SGD step.
        dp = jax.tree.map(lambda p, g: p - lr * jnp.mean(g, axis=0), dp, g)
        stacked, state = step(g, state, stacked)
        u, s = update(g, by_update[1], by_update[0])
        by_update = (eqxopt.apply_updates(by_update[0], u), s)
        for k in params:
            for r in range(R):
                assert np.array_equal(stacked[k][r], dp[k]), k
                assert np.array_equal(by_update[0][k][r], dp[k]), k
        # Exact, and not trivially: the parameters moved.
    assert not np.array_equal(dp["w"], params["w"])


def test_h1_on_a_loss_is_data_parallel_sgd():
    x, y, params = problem(steps=8)
    lr = 0.05
    opt = eqxopt.DiLoCo(
        eqxopt.SGD(lr), sync_every=1, outer=eqxopt.SGD(1.0), axis_name="replica"
    )
    history, _ = run_vmapped(opt, x, y, params)
    dp = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params)
    for k in range(x.shape[1]):
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(
            dp, jnp.asarray(x[:, k], jnp.float32), jnp.asarray(y[:, k], jnp.float32)
        )
        dp = jax.tree.map(lambda p, g: p - lr * jnp.mean(g, axis=0), dp, g)
        for name in dp:
            np.testing.assert_allclose(history[k][name][0], dp[name], 1e-6, 1e-7)
            assert np.array_equal(history[k][name][0], history[k][name][R - 1])


def test_matches_the_transcription_under_vmap_and_local_steps_with_sync_agree():
    x, y, params = problem()
    expected = transcription(x, y, params)
    opt = make_opt()
    history, state = run_vmapped(opt, x, y, params)
    worst = assert_close_to(history, expected, rtol=2e-5, atol=2e-6)
    assert worst < 2e-6
    # The replicas differ between synchronisations and agree at each one.
    assert not np.array_equal(history[0]["w"][0], history[0]["w"][1])
    assert np.array_equal(history[H - 1]["w"][0], history[H - 1]["w"][1])
    assert int(state.step[0]) == H * ROUNDS
    # The anchor is the parameters after the last round.
    np.testing.assert_array_equal(state.anchor["w"], history[-1]["w"])
    # Local steps and a separate sync every H: the same numbers.
    local, _ = run_vmapped(opt, x, y, params, how="local")
    for a, b in zip(history, local):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)


def test_default_outer_is_the_papers_nesterov_sgd_and_one_replica_runs_alone():
    opt = eqxopt.DiLoCo(eqxopt.AdamW(1e-3))
    assert opt.sync_every == 8
    assert repr(opt.outer) == (
        "SGD(learning_rate=0.7, momentum=0.9, nesterov=True, dampening=0.0)"
    )
    # One replica (no axis_name): the outer step on its own distance.
    x, y, params = problem(replicas=1)
    expected = transcription(x, y, params)
    history, _ = run_vmapped(make_opt(axis_name=None), x, y, params)
    assert_close_to(history, expected, rtol=2e-5, atol=2e-6)


def test_state_round_trips_through_equinox_and_orbax_checkpoints():
    import orbax.checkpoint as ocp

    x, y, params = problem()
    opt = make_opt()
    first, state = run_vmapped(opt, x[:, :5], y[:, :5], params)
    saved = (first[-1], state)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "ckpt.eqx"
        eqx.tree_serialise_leaves(path, saved)
        template = jax.tree.map(jnp.zeros_like, saved)
        got = eqx.tree_deserialise_leaves(
            path, template, filter_spec=eqxopt.sharded_deserialise_filter_spec
        )
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(pathlib.Path(tmp, "orbax").absolute(), saved)
            checkpointer.wait_until_finished()
            got_orbax = checkpointer.restore(
                pathlib.Path(tmp, "orbax").absolute(),
                jax.tree.map(ocp.utils.to_shape_dtype_struct, template),
            )
    for restored in (got, got_orbax):
        assert jax.tree.structure(restored) == jax.tree.structure(saved)
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved)):
            assert np.array_equal(a, b)
    # Resuming from the restored state continues the run bit for bit.
    step = jax.jit(jax.vmap(replica_step(opt, "step"), axis_name="replica"))
    resumed = saved
    for_restored = got
    for k in range(5, 9):
        xs, ys = jnp.asarray(x[:, k], jnp.float32), jnp.asarray(y[:, k], jnp.float32)
        resumed = step(resumed[1], resumed[0], xs, ys)
        for_restored = step(for_restored[1], for_restored[0], xs, ys)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(for_restored)):
        assert np.array_equal(a, b)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="sync_every must be an int >= 1"):
        eqxopt.DiLoCo(eqxopt.SGD(0.1), sync_every=0)
    with pytest.raises(TypeError, match="sync_every must be an int >= 1"):
        eqxopt.DiLoCo(eqxopt.SGD(0.1), sync_every=2.5)
    with pytest.raises(TypeError, match="inner must be an eqxopt transform"):
        eqxopt.DiLoCo(lambda g: g)
    with pytest.raises(TypeError, match="outer must be an eqxopt transform"):
        eqxopt.DiLoCo(eqxopt.SGD(0.1), outer="sgd")
    with pytest.raises(TypeError, match="axis_name must be None, a mesh axis name"):
        eqxopt.DiLoCo(eqxopt.SGD(0.1), axis_name=3)
    # An axis that is not bound where the step runs, named at the first sync.
    opt = eqxopt.DiLoCo(eqxopt.SGD(0.1), sync_every=1, axis_name="data")
    params = {"w": jnp.ones(3)}
    with pytest.raises(ValueError, match="DiLoCo: axis_name 'data' is not bound"):
        opt.step({"w": jnp.ones(3)}, opt.init(params), params)
    with pytest.raises(ValueError, match="DiLoCo: axis_name 'data' is not bound"):
        jax.vmap(opt.sync, axis_name="replica")(
            jax.vmap(opt.init)({"w": jnp.ones((2, 3))}), {"w": jnp.ones((2, 3))}
        )


# On 8 CPU devices: replicas as the "data" axis of a mesh under shard_map (each
# device one replica), against the vmapped run and the transcription, and the
# all-reduces each compiled program holds.
SCRIPT = textwrap.dedent(
    r"""
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    import eqxopt
    from eqxopt._core._jax_api import shard_map
    from test_diloco import (
        H, loss, make_opt, problem, replica_step, run_vmapped, transcription,
    )

    R = 8
    mesh = Mesh(np.array(jax.devices()), ("data",))

    def per_device(f):
        # Each device's block has a leading axis of 1: its replica.
        def body(*args):
            out = f(*jax.tree.map(lambda a: a[0], args))
            return jax.tree.map(lambda a: a[None], out)
        return jax.jit(shard_map(body, mesh=mesh, in_specs=P("data"),
                                 out_specs=P("data")))

    def all_reduces(fn, *args):
        # In the compiled program: the all-reduces and the float32 elements
        # they carry (XLA may combine several leaves' into one); in the
        # lowered one, before XLA's passes: one per reduced leaf.
        lowered = fn.lower(*args)
        ops = [line for line in lowered.compile().as_text().splitlines()
               if " all-reduce(" in line]
        elements = 0
        for line in ops:
            result = line.split("=", 1)[1].split(" all-reduce(", 1)[0]
            for dims in re.findall(r"f32\[([0-9,]*)\]", result):
                elements += int(np.prod([int(d) for d in dims.split(",") if d]))
        return len(ops), elements, lowered.as_text().count("all_reduce")

    x, y, params = problem(replicas=R)
    expected = transcription(x, y, params)
    opt = make_opt(axis_name="data")
    stacked = jax.tree.map(
        lambda p: jnp.broadcast_to(jnp.asarray(p, jnp.float32), (R, *p.shape)),
        params)
    state = per_device(opt.init)(stacked)
    step = per_device(replica_step(opt, "step"))
    local = per_device(replica_step(opt, "local"))
    sync = per_device(opt.sync)
    xs = lambda k: jnp.asarray(x[:, k], jnp.float32)
    ys = lambda k: jnp.asarray(y[:, k], jnp.float32)

    history = []
    p, s = stacked, state
    for k in range(x.shape[1]):
        p, s = step(s, p, xs(k), ys(k))
        history.append(p)
    worst = 0.0
    for got, want in zip(history, expected, strict=True):
        for name in want:
            np.testing.assert_allclose(np.asarray(got[name]), want[name],
                                       rtol=2e-5, atol=2e-6)
            worst = max(worst, float(np.abs(np.asarray(got[name])
                                            - want[name]).max()))
    vmapped, _ = run_vmapped(make_opt(), x, y, params)
    gap = 0.0
    for a, b in zip(history, vmapped):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7)
            gap = max(gap, float(np.abs(np.asarray(a[name] - b[name])).max()))
    # Local steps with a separate sync: the same numbers.
    p, s = stacked, state
    for k in range(x.shape[1]):
        p, s = local(s, p, xs(k), ys(k))
        if (k + 1) % H == 0:
            p, s = sync(s, p)
        for name in p:
            np.testing.assert_allclose(p[name], history[k][name],
                                       rtol=1e-6, atol=1e-7)

    # Data parallel: the gradients averaged over "data" every step.
    dp_opt = eqxopt.AdamW(1e-2)
    def dp_step(s, p, x, y):
        g = jax.lax.pmean(jax.grad(loss)(p, x, y), "data")
        return dp_opt.step(g, s, p)
    dp = per_device(dp_step)
    dp_state = per_device(dp_opt.init)(stacked)
    leaves = len(jax.tree.leaves(params))
    size = sum(np.size(p) for p in jax.tree.leaves(params))
    counts = {
        "local": all_reduces(local, state, stacked, xs(0), ys(0)),
        "sync": all_reduces(sync, state, stacked),
        "step": all_reduces(step, state, stacked, xs(0), ys(0)),
        "data parallel": all_reduces(dp, dp_state, stacked, xs(0), ys(0)),
        "leaves": leaves,
        "size": size,
    }
    print("WORST", worst, "GAP", gap)
    print("COUNTS", counts)
    """
)


def test_shard_map_on_8_devices_matches_vmap_and_communicates_h_times_less():
    out = run_on_8_devices(SCRIPT)
    counts = eval(out.split("COUNTS", 1)[1].strip())
    worst, gap = (float(v) for v in out.split("WORST", 1)[1].split()[0:3:2])
    assert worst < 2e-6 and gap < 1e-6
    leaves, size = counts["leaves"], counts["size"]
    # (compiled all-reduces, the elements they carry, lowered all-reduces). A
    # local step communicates nothing; a synchronisation one all-reduce per
    # leaf as lowered (XLA may combine them into fewer), carrying every
    # parameter once; a data-parallel step the same, every step. Over H steps
    # DiLoCo moves `size` numbers, data parallelism `H * size`.
    assert counts["local"] == (0, 0, 0)
    ops, elements, lowered = counts["sync"]
    assert 1 <= ops <= leaves and elements == size and lowered == leaves
    assert counts["data parallel"] == counts["sync"]
    # The all-in-one step holds the synchronisation's all-reduces (in the branch
    # of its `lax.cond` that runs every H-th step).
    assert counts["step"] == counts["sync"]


# Two processes joined by `jax.distributed` (gloo collectives on localhost), one
# CPU device and one replica each: the "data" axis spans the processes.
WORKER = textwrap.dedent(
    """
    import sys

    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    coordinator, index, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(coordinator, num_processes=2, process_id=index)

    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from eqxopt._core._jax_api import shard_map
    from test_diloco import make_opt, problem, replica_step

    mesh = Mesh(np.array(jax.devices()), ("data",))
    split = NamedSharding(mesh, P("data"))

    def per_device(f):
        def body(*args):
            out = f(*jax.tree.map(lambda a: a[0], args))
            return jax.tree.map(lambda a: a[None], out)
        return jax.jit(shard_map(body, mesh=mesh, in_specs=P("data"),
                                 out_specs=P("data")))

    def global_array(mine):
        # This process's replica: a block of 1 along the replica axis.
        return jax.make_array_from_process_local_data(
            split, np.asarray(mine, np.float32)[None])

    x, y, params = problem(replicas=2)
    opt = make_opt(axis_name="data")
    p = {k: global_array(v) for k, v in params.items()}
    s = per_device(opt.init)(p)
    step = per_device(replica_step(opt, "step"))
    for k in range(x.shape[1]):
        p, s = step(s, p, global_array(x[index, k]), global_array(y[index, k]))
    mine = {k: np.asarray(v.addressable_shards[0].data)[0] for k, v in p.items()}
    np.savez(out, **mine)
    print("worker", index, "done", flush=True)
    """
)


def _free_port():
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process_with_two_replicas(tmp_path):
    import os
    import subprocess
    import sys

    from helpers import package_path

    env = dict(os.environ)
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    env["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=1"])
    env["JAX_PLATFORMS"] = "cpu"
    tests = str(pathlib.Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join(
        [package_path(), tests, env.get("PYTHONPATH", "")]
    )
    coordinator = f"127.0.0.1:{_free_port()}"
    outs = [tmp_path / f"replica{i}.npz" for i in range(2)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, coordinator, str(i), str(outs[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for w in workers:
            logs.append(w.communicate(timeout=240)[0])
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    assert all(w.returncode == 0 for w in workers), "\n".join(logs)

    # One process, the two replicas a vmapped axis.
    x, y, params = problem(replicas=2)
    history, _ = run_vmapped(make_opt(), x, y, params)
    for i, out in enumerate(outs):
        got = np.load(out)
        for k in params:
            np.testing.assert_allclose(got[k], history[-1][k][i], rtol=1e-6, atol=1e-7)
    # The run ended on a synchronisation: both replicas hold the same anchor.
    first, second = np.load(outs[0]), np.load(outs[1])
    assert all(np.array_equal(first[k], second[k]) for k in params)


@pytest.mark.slow
def test_on_the_demos_model_h8_reaches_data_parallel_accuracy_within_a_point():
    # examples/train_digits.py's CNN and AdamW schedule, 4 replicas of 32 images
    # a step for 600 steps: data parallel (the 4 batches' gradients averaged
    # every step) against DiLoCo with H = 8 and the paper's outer Nesterov SGD,
    # which synchronises 75 times instead of 600.
    from helpers import load_script

    demo = load_script("examples/train_digits.py")
    replicas, steps, batch, h = 4, 600, 32, 8
    data = demo.load_data(0)
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    index = demo.batches(len(data.y_train), batch * replicas, steps, 0)
    index = jnp.asarray(index).reshape(steps, replicas, batch)
    model_key, augment_key = jax.random.split(jax.random.key(0))
    params, static = eqx.partition(demo.CNN(model_key), eqx.is_array)

    def loss_at(p, rows, step):
        model = eqx.combine(p, static)
        return demo.augmented_loss(model, x, y, rows, augment_key, step)

    def test_accuracy(p):
        model = eqx.combine(p, static)
        return float(demo.accuracy(model, data.x_test, data.y_test))

    inner = demo.make_optimizer(steps)

    @jax.jit
    def data_parallel(p, s, rows, step):
        g = jax.vmap(jax.grad(loss_at), in_axes=(None, 0, None))(p, rows, step)
        return inner.step(jax.tree.map(lambda a: a.mean(0), g), s, p)

    p, s = params, inner.init(params)
    for i in range(steps):
        p, s = data_parallel(p, s, index[i], i)
    reference = test_accuracy(p)

    diloco = eqxopt.DiLoCo(inner, sync_every=h, axis_name="replica")

    @jax.jit
    def local_sgd(p, s, rows, step):
        def one(p, s, rows):
            return diloco.step(jax.grad(loss_at)(p, rows, step), s, p)

        return jax.vmap(one, axis_name="replica")(p, s, rows)

    p = jax.tree.map(lambda a: jnp.broadcast_to(a, (replicas, *a.shape)), params)
    s = jax.vmap(diloco.init)(p)
    for i in range(steps):
        p, s = local_sgd(p, s, index[i], i)
    assert all(np.array_equal(a[0], a[-1]) for a in jax.tree.leaves(p))
    got = test_accuracy(jax.tree.map(lambda a: a[0], p))
    print(f"test accuracy: data parallel {reference:.4f}, DiLoCo H=8 {got:.4f}")
    assert reference > 0.97
    assert got > reference - 0.01
