"""Training across processes: data parallel and FSDP with `jax.distributed`.

One command starts everything on this machine (2 processes with 2 CPU devices
each, collectives through gloo over localhost), trains, and checks the result
against the same training in this one process on one device:

    python examples/multiprocess.py [--processes 2] [--local-devices 2]
                                    [--steps 10]

It exits with status 0 and prints `multiprocess: OK` when every run matches (to
float32 rounding: the processes sum the gradient over the batch in another
order), and with status 1 and the workers' output otherwise. On a cluster the
launcher is yours (SLURM, Kubernetes, `mpirun`): each process runs `worker(...)`
below with the coordinator's address, the number of processes and its own index.

What each worker does is what a multi-host training script does; eqxopt needs
nothing of its own for it:

1. `jax.distributed.initialize(...)` before anything touches a device (importing
   `jax`, `equinox` and `eqxopt` is fine). On CPU the collectives go through
   gloo (`jax_cpu_collectives_implementation`; the default from JAX 0.5 on).
2. One mesh over `jax.devices()`, every device of every process, and global
   arrays from what each process holds: `jax.make_array_from_process_local_data`
   places the whole parameter (the same in every process) or the process's own
   rows of the batch.
3. The train step is an ordinary `jax.jit` with `opt.step(..., donate=True)`;
   XLA inserts the all-reduce of the gradients (data parallel: parameters and
   optimizer state replicated, the batch split) or the gathers and
   reduce-scatters of FSDP (parameters, and with them every moment, split along
   their first dimension, so each device holds 1/N of them). `opt.init` places
   each moment like its parameter, and the step keeps those shardings.
4. `jax.experimental.multihost_utils.process_allgather` brings the result back
   to every process as NumPy arrays.

Every process must run the same jitted steps in the same order (they meet in the
collectives); a process that fails leaves the others waiting, which is why the
launcher here kills them all after `--timeout` seconds.
"""

import argparse
import contextlib
import functools
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import eqxopt

IN, OUT, WIDTH, DEPTH = 8, 4, 32, 2


# ------------------------------------------------------------------------------
# The problem: the same model, optimizers and batches in every process.
# ------------------------------------------------------------------------------


# The runs: (how the parameters are laid out, a title, the optimizer). The clip
# reads the global norm of gradients that FSDP keeps split over all devices.
def runs() -> list[tuple[str, str, eqxopt.AbstractTransform]]:
    adamw = eqxopt.AdamW(1e-2, weight_decay=0.1)
    clipped = eqxopt.Chain(eqxopt.ClipByGlobalNorm(0.5), adamw)
    return [
        ("dp", "data parallel, AdamW", adamw),
        ("fsdp", "FSDP, ClipByGlobalNorm + AdamW", clipped),
    ]


def make_model() -> eqx.nn.MLP:
    """An MLP whose weights are NumPy arrays drawn from a seeded generator, the
    same in every process. (Equinox's own initialisation would do as well;
    drawing with NumPy compiles nothing, a second less per process.)"""
    shapes = eqx.filter_eval_shape(
        lambda: eqx.nn.MLP(
            IN, OUT, WIDTH, DEPTH, activation=jnp.tanh, key=jax.random.key(0)
        )
    )
    rng = np.random.default_rng(1)

    def draw(leaf):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        bound = 1 / np.sqrt(leaf.shape[-1])
        return rng.uniform(-bound, bound, size=leaf.shape).astype(leaf.dtype)

    return jax.tree.map(draw, shapes)


def make_batches(steps: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """`steps` global batches of `batch` rows: inputs and regression targets."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps, batch, IN)).astype(np.float32)
    w = rng.normal(size=(IN, OUT)).astype(np.float32)
    y = np.tanh(x @ w) + 0.1 * rng.normal(size=(steps, batch, OUT)).astype(
        np.float32
    )
    return x, y.astype(np.float32)


def make_train_step(opt: eqxopt.AbstractTransform, static: Any):
    def loss_fn(params, x, y):
        model = eqx.combine(params, static)
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    # The parameters and the state are donated: the step updates them in place.
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params, state = opt.step(grads, state, params, donate=True)
        return params, state, loss

    return train_step


def train(opt, params, static, batches, place_batch, check_state=None):
    """`opt` for one step per batch; the final parameters, state and losses."""
    state = opt.init(params)
    if check_state is not None:
        check_state(state)
    train_step = make_train_step(opt, static)
    losses = []
    for x, y in zip(*batches):
        params, state, loss = train_step(params, state, *place_batch(x, y))
        losses.append(loss)
    # The state came from `init` placed as the step returns it: one compilation.
    assert train_step._cache_size() == 1, train_step._cache_size()
    return params, state, losses


def host_tree(tree: Any) -> dict[str, np.ndarray]:
    """The array leaves of `tree` as NumPy arrays, by path."""
    return {
        jax.tree_util.keystr(path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if eqx.is_array(leaf)
    }


# ------------------------------------------------------------------------------
# A worker: one of the processes.
# ------------------------------------------------------------------------------


def fsdp_spec(shape: tuple[int, ...], n: int) -> P:
    """FSDP: split along the first dimension where it divides evenly."""
    return P("data") if shape and shape[0] % n == 0 else P()


def worker(
    coordinator: str,
    processes: int,
    index: int,
    steps: int,
    batch: int,
    out: str,
) -> None:
    start = time.monotonic()
    # Before anything touches a device. Gloo is the default on CPU from JAX 0.5;
    # older JAX needs it asked for.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator, num_processes=processes, process_id=index
    )
    assert jax.process_count() == processes and jax.process_index() == index
    print(
        f"process {index}: joined in {time.monotonic() - start:.1f} s",
        flush=True,
    )
    # every device of every process, the same order in each
    devices = jax.devices()
    n = len(devices)
    mesh = Mesh(np.array(devices), ("data",))
    batch_sharding = NamedSharding(mesh, P("data"))

    # This process's rows of each global batch: the rows of its own devices.
    x_all, y_all = make_batches(steps, batch)
    rows = batch // processes
    mine = slice(index * rows, (index + 1) * rows)

    def place_batch(x, y):
        # `x`, `y` are the global batch here only to cut this process's rows out
        # of it; a real input pipeline loads just those.
        return tuple(
            jax.make_array_from_process_local_data(batch_sharding, a[mine])
            for a in (x, y)
        )

    # The assembled global batch is the whole batch, in order.
    x0 = place_batch(x_all[0], y_all[0])[0]
    np.testing.assert_array_equal(
        multihost_utils.process_allgather(x0, tiled=True), x_all[0]
    )

    def check_state(state):
        # `opt.init` places every state leaf on the parameters' mesh, which
        # spans both processes: each moment like its parameter, the 0-d step
        # counter replicated. Nothing is left on this process's default device.
        for x in jax.tree.leaves(state):
            assert x.sharding.device_set == set(mesh.devices.flat), x.sharding

    params, static = eqx.partition(make_model(), eqx.is_array)
    results = {}
    for layout, title, opt in runs():
        shardings = jax.tree.map(
            lambda p, layout=layout: NamedSharding(
                mesh, P() if layout == "dp" else fsdp_spec(p.shape, n)
            ),
            params,
        )
        # The whole parameter is in every process (the same model from the same
        # seed); each device takes its part of it.
        placed = jax.tree.map(
            lambda p, s: jax.make_array_from_process_local_data(
                s, np.asarray(p), p.shape
            ),
            params,
            shardings,
        )
        final, state, losses = train(
            opt, placed, static, (x_all, y_all), place_batch, check_state
        )
        check_placement(final, state, shardings, title)
        gathered = multihost_utils.process_allgather((final, state), tiled=True)
        for part, tree in zip(("params", "state"), gathered):
            for path, value in host_tree(tree).items():
                results[f"{layout}/{part}{path}"] = value
        results[f"{layout}/losses"] = np.asarray(
            multihost_utils.process_allgather(jnp.stack(losses), tiled=True)
        )
        print(
            f"process {index}: {title}: "
            f"done at {time.monotonic() - start:.1f} s",
            flush=True,
        )
    if index == 0:
        np.savez(out, **results)
    jax.distributed.shutdown()
    print(
        f"process {index}: {n} devices, {len(jax.local_devices())} local, "
        f"finished in {time.monotonic() - start:.1f} s",
        flush=True,
    )


def check_placement(params, state, shardings, what: str) -> None:
    """The step kept each parameter's sharding, and each moment has its
    parameter's (FSDP: each device holds 1/N of the state, too)."""
    for p, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
        assert p.sharding.is_equivalent_to(s, p.ndim), (what, p.sharding, s)
    adam = state["AdamW"] if isinstance(state, eqxopt.ChainState) else state
    for moments in (adam.mu, adam.nu):
        for m, s in zip(jax.tree.leaves(moments), jax.tree.leaves(shardings)):
            assert m.sharding.is_equivalent_to(s, m.ndim), (what, m.sharding, s)


# ------------------------------------------------------------------------------
# The launcher: start the workers, run the reference here, compare.
# ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What process 0 prints (and then waits) when the coordinator's port was taken
# between `free_port` and the coordinator binding it: then the launcher tries
# once more, on a new port.
_PORT_TAKEN = ("failed to add port", "address already in use")


def port_taken(logs: list) -> bool:
    # `os.pread` leaves the file's offset (shared with the worker writing it)
    # alone.
    text = (
        os.pread(logs[0].fileno(), 1 << 16, 0).decode(errors="replace").lower()
    )
    return any(words in text for words in _PORT_TAKEN)


def start_workers(args, out: str, logs: list, workers: list) -> None:
    """Starts the worker processes (appended to `workers`), their output going
    to the files in `logs`."""
    env = dict(os.environ)
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={args.local_devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    coordinator = f"127.0.0.1:{free_port()}"
    for index, log in enumerate(logs):
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            str(index),
        ]
        command += [
            "--coordinator",
            coordinator,
            "--processes",
            str(args.processes),
        ]
        command += ["--steps", str(args.steps), "--batch", str(args.batch)]
        command += ["--out", out, "--timeout", str(args.timeout)]
        workers.append(
            subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        )


def wait(workers: list[subprocess.Popen], logs: list, deadline: float) -> str:
    """What became of the workers: "ok" once every one has exited with status
    0; else, as soon as it is known, "port taken", "failed" (one exited with
    another status: the others would wait for it in a collective) or
    "timeout"."""
    while True:
        codes = [w.poll() for w in workers]
        if all(c == 0 for c in codes):
            return "ok"
        if port_taken(logs):
            return "port taken"
        if any(c not in (None, 0) for c in codes):
            return "failed"
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(0.05)


def run_workers(args, out: str, meanwhile: Callable[[], Any]) -> Any:
    """Runs the workers to completion, and `meanwhile()` here while they run
    (its result is returned); tries a second time (on a new port) if the
    coordinator could not bind its port; raises with the workers' output
    otherwise."""
    result = None
    for attempt in (1, 2):
        workers: list[subprocess.Popen] = []
        with contextlib.ExitStack() as stack:
            logs = [
                stack.enter_context(tempfile.TemporaryFile(mode="w+"))
                for _ in range(args.processes)
            ]
            deadline = time.monotonic() + args.timeout
            try:
                start_workers(args, out, logs, workers)
                if attempt == 1:
                    result = meanwhile()
                outcome = wait(workers, logs, deadline)
            finally:
                for w in workers:
                    if w.poll() is None:
                        w.kill()
                    w.wait()
            texts = []
            for log in logs:
                log.seek(0)
                texts.append(log.read())
        if outcome == "ok":
            if args.verbose:
                print("".join(texts), end="")
            return result
        report = "\n".join(
            f"--- worker {i} (exit status {w.returncode}):\n{t[-6000:]}"
            for i, (w, t) in enumerate(zip(workers, texts))
        )
        if attempt == 1 and outcome == "port taken":
            print(
                "the coordinator's port was taken; trying another", flush=True
            )
            continue
        why = {
            "timeout": f"ran past {args.timeout} s",
            "port taken": "found the coordinator's port taken twice",
        }.get(outcome, "failed")
        raise RuntimeError(f"the worker processes {why}:\n{report}")


def reference(steps: int, batch: int) -> dict[str, np.ndarray]:
    """The same training in this process, on one device, the whole batch at
    once."""
    device = jax.devices()[0]
    params, static = eqx.partition(make_model(), eqx.is_array)
    results = {}
    for layout, _, opt in runs():
        placed = jax.device_put(params, device)
        final, state, losses = train(
            opt, placed, static, make_batches(steps, batch), lambda x, y: (x, y)
        )
        for part, tree in (("params", final), ("state", state)):
            for path, value in host_tree(tree).items():
                results[f"{layout}/{part}{path}"] = value
        results[f"{layout}/losses"] = np.asarray(jnp.stack(losses))
    return results


def compare(got: dict, want: dict, rtol: float, atol: float) -> list[str]:
    """The differences beyond tolerance, one line each (none: a match)."""
    problems = sorted(set(got) ^ set(want))
    for key in sorted(set(got) & set(want)):
        a, b = np.asarray(got[key]), np.asarray(want[key])
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{key}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
        elif not np.allclose(a, b, rtol=rtol, atol=atol):
            err = np.max(np.abs(a.astype(np.float64) - b))
            problems.append(f"{key}: largest difference {err:.3g}")
    return problems


def launch(args) -> int:
    start = time.monotonic()
    if args.batch % (args.processes * args.local_devices):
        raise SystemExit("--batch must divide by --processes * --local-devices")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.npz")
        want = run_workers(args, out, lambda: reference(args.steps, args.batch))
        with np.load(out) as f:
            got = dict(f)
    problems = compare(got, want, rtol=args.rtol, atol=args.atol)
    # A match means something only if training moved the parameters well beyond
    # the tolerance.
    initial = host_tree(eqx.partition(make_model(), eqx.is_array)[0])
    for layout, title, _ in runs():
        moved = max(
            float(np.max(np.abs(want[f"{layout}/params{path}"] - p0)))
            for path, p0 in initial.items()
        )
        if moved < 100 * args.atol:
            problems.append(f"{title}: the parameters moved only {moved:.3g}")
    largest = max(
        float(np.max(np.abs(got[k].astype(np.float64) - want[k])))
        for k in set(got) & set(want)
        if got[k].shape == want[k].shape
    )
    print(
        f"{args.processes} processes x {args.local_devices} CPU devices, "
        f"{args.steps} steps: largest difference from one process "
        f"{largest:.3g} "
        f"({time.monotonic() - start:.1f} s)"
    )
    for layout, title, _ in runs():
        losses = got[f"{layout}/losses"]
        print(f"  {title:32} loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if problems:
        print("multiprocess: MISMATCH\n" + "\n".join(problems))
        return 1
    print("multiprocess: OK")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--local-devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--atol", type=float, default=1e-6)
    parser.add_argument(
        "--verbose", action="store_true", help="print the workers' output"
    )
    # Set by the launcher for each worker process.
    parser.add_argument(
        "--worker", type=int, default=None, help=argparse.SUPPRESS
    )
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        # A worker ends itself at the deadline too, should the launcher be gone
        # (killed) and its peer with it: it would wait in a collective for ever.
        watchdog = threading.Timer(args.timeout + 10, os._exit, (124,))
        watchdog.daemon = True
        watchdog.start()
        worker(
            args.coordinator,
            args.processes,
            args.worker,
            args.steps,
            args.batch,
            args.out,
        )
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
