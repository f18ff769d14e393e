"""Shared test helpers: trees, reference runs against optax and torch, and a count
of the programs XLA compiles (through `jax.monitoring`, not eqxopt's caches)."""

import contextlib
import importlib
import importlib.util
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np

import eqxopt
import fast_compile

# JAX records this duration event once per program handed to XLA's compiler (a hit
# in JAX's in-memory caches records nothing).
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_open_logs: list[list[str]] = []


def _on_event_duration(event: str, duration: float, **kwargs: Any) -> None:
    del duration
    if event == _BACKEND_COMPILE:
        for log in _open_logs:
            log.append(str(kwargs.get("fun_name", "?")))


# Registered once, for the whole session (`compiles` opens and closes logs).
jax.monitoring.register_event_duration_secs_listener(_on_event_duration)


@contextlib.contextmanager
def compiles() -> Iterator[list[str]]:
    """The names of the programs XLA compiles inside the `with` block, in order.

    Counts through JAX's public monitoring events, so it sees every compilation
    (eqxopt's steps, the native backend's programs and eager operations alike): warm
    the same shapes up first, then assert that the block compiled nothing.
    """
    log: list[str] = []
    _open_logs.append(log)
    try:
        yield log
    finally:
        _open_logs.remove(log)


def nested_tree(seed: int = 0, dtype: Any = jnp.float32) -> dict:
    """A nested dict/list/tuple tree with leaves of 0 to 3 dimensions."""
    rng = np.random.default_rng(seed)

    def leaf(*shape):
        return jnp.asarray(rng.normal(size=shape), dtype=dtype)

    return {
        "scale": leaf(),
        "dense": {"w": leaf(3, 4), "b": leaf(4)},
        "layers": [{"w": leaf(2, 3, 2), "b": leaf(2)}, (leaf(5), leaf())],
    }


def grad_stream(params: Any, steps: int, seed: int = 1) -> Iterator[Any]:
    """`steps` gradient trees shaped like `params`, reproducible."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield jax.tree.map(
            lambda p: jnp.asarray(rng.normal(size=p.shape), dtype=p.dtype), params
        )


def run_eqxopt(
    opt: eqxopt.AbstractTransform, params: Any, grads: list[Any], **extra: Any
) -> list[Any]:
    """The parameters after each step of `opt.update` + `eqxopt.apply_updates`."""
    state = opt.init(params)
    history = []
    for g in grads:
        updates, state = opt.update(g, state, params, **extra)
        params = eqxopt.apply_updates(params, updates)
        history.append(params)
    return history


class Trajectory(list):
    """A reference run: the parameters after each step, and `start`, the parameters it
    started from. `assert_histories_close` checks that a `Trajectory` moved well
    beyond the tolerance of the comparison (parameters that barely move would match
    any optimizer)."""

    def __init__(self, start: Any):
        super().__init__()
        self.start = start


# How many tolerances (`atol + rtol * |x|`) some element of a reference run must have
# moved from its start by the last step.
MOVED_TOLERANCES = 100.0


def assert_moved(
    start: Any, end: Any, rtol: float, atol: float, factor: float = MOVED_TOLERANCES
) -> None:
    """Some element of `end` lies more than `factor` tolerances (`atol + rtol * |end|`,
    as `np.testing.assert_allclose` computes them) from where it was in `start`."""
    best = 0.0
    for s, e in zip(jax.tree.leaves(start), jax.tree.leaves(end)):
        s = np.asarray(s, np.float64)
        e = np.asarray(e, np.float64)
        if e.size == 0:
            continue
        moved = np.abs(e - s)
        tol = atol + rtol * np.abs(e)
        if np.any(moved > factor * tol):
            return
        best = max(best, float(np.max(moved / np.maximum(tol, 1e-300))))
    raise AssertionError(
        f"the reference run moved at most {best:.3g} tolerances (rtol={rtol}, "
        f"atol={atol}) from its start, under {factor}: a comparison this close "
        "would pass for almost any optimizer; take more steps or a larger step size"
    )


def run_optax(tx: Any, params: Any, grads: list[Any]) -> Trajectory:
    import optax

    # optax promotes implicitly (a Python float to the power of the int32 count):
    # JAX's standard promotion for the reference, whatever the tests' setting.
    with jax.numpy_dtype_promotion("standard"):
        state = tx.init(params)
        update = jax.jit(tx.update)
        history = Trajectory(params)
        for g in grads:
            updates, state = update(g, state, params)
            params = optax.apply_updates(params, updates)
            history.append(params)
    return history


def run_torch(
    make_opt: Callable[[list[Any]], Any],
    params: Any,
    grads: list[Any],
) -> Trajectory:
    """Runs a torch.optim optimizer on the leaves of `params` (float64 off)."""
    import torch

    leaves, treedef = jax.tree.flatten(params)
    tensors = [
        torch.nn.Parameter(torch.tensor(np.asarray(x, dtype=np.float32)))
        for x in leaves
    ]
    opt = make_opt(tensors)
    history = Trajectory(params)
    for g in grads:
        for t, gl in zip(tensors, jax.tree.leaves(g)):
            t.grad = torch.tensor(np.asarray(gl, dtype=np.float32))
        opt.step()
        # Copy on the host first: `numpy()` shares torch's buffer, and JAX may read
        # (or alias) a NumPy array after `jnp.asarray` returns, so torch's in-place
        # updates of later steps would otherwise rewrite this step's record now and
        # then.
        history.append(
            jax.tree.unflatten(
                treedef, [jnp.asarray(t.detach().numpy().copy()) for t in tensors]
            )
        )
    return history


def assert_trees_close(actual: Any, expected: Any, rtol=2e-5, atol=2e-6) -> None:
    a_leaves, a_def = jax.tree.flatten(actual)
    e_leaves, e_def = jax.tree.flatten(expected)
    assert a_def == e_def, f"{a_def} != {e_def}"
    for path, a, e in zip(
        [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(actual)],
        a_leaves,
        e_leaves,
    ):
        np.testing.assert_allclose(
            np.asarray(a, np.float64),
            np.asarray(e, np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"at {path}",
        )


def assert_histories_close(actual, expected, rtol=2e-5, atol=2e-6) -> None:
    """Each step's trees agree; where either side is a reference run (a `Trajectory`
    from `run_optax` or `run_torch`), it must also have moved well beyond the
    tolerance (`assert_moved`)."""
    assert len(actual) == len(expected)
    for history in (expected, actual):
        if isinstance(history, Trajectory) and len(history):
            assert_moved(history.start, history[-1], rtol, atol)
            break
    for step, (a, e) in enumerate(zip(actual, expected)):
        try:
            assert_trees_close(a, e, rtol=rtol, atol=atol)
        except AssertionError as err:
            raise AssertionError(f"step {step}: {err}") from None


def package_path() -> str:
    """The directory the eqxopt under test is imported from (the checkout's `src`,
    or the copy `make test-no-native` makes), for the `PYTHONPATH` of subprocesses."""
    return str(pathlib.Path(eqxopt.__file__).resolve().parents[1])


def run_on_8_devices(script: str, *, xla_defaults: bool = False) -> str:
    """Runs `script` in a new Python process with 8 host CPU devices (the count must
    be set before JAX starts); its standard output, once it has exited cleanly.
    `xla_defaults=True` has XLA compile with its default code generation, not the
    tests' fast one (see fast_compile.py)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if xla_defaults:
        flags = fast_compile.xla_flags_without_fast_compile(flags)
    env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [package_path(), str(root / "tests"), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(relative_path: str) -> Any:
    """Imports a script of this checkout (an example, a docs generator) as a module,
    registered in `sys.modules` as `script_<file name>` (dataclasses look their
    module up by name)."""
    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def trained_by_update(opt: Any) -> Callable[[Any, list[Any]], Any]:
    """`(params, grads_list) -> params` after `opt.init` and one `opt.update` plus
    `eqxopt.apply_updates` per gradient: traceable, for `jit` and `shard_map`."""

    def train(params: Any, grads: list[Any]) -> Any:
        state = opt.init(params)
        for g in grads:
            updates, state = opt.update(g, state, params)
            params = eqxopt.apply_updates(params, updates)
        return params

    return train


def in_place(fn: Callable[[], Any]) -> Any:
    """`fn()` (a call of `eqxopt.map_leaves`, inside a `jax.jit`) traced as the
    engine traces a donated step: the native backend, where it is on, then runs
    element-wise rules as its kernels."""
    from eqxopt._core import _backend

    backend = _backend.active()
    if backend is None:
        return fn()
    trace = _backend.EntryTrace(
        in_place=True, grads_given=False, placement=None, inputs=((), (), ())
    )
    with backend.tracing(trace):
        return fn()


def enable_x64(on: bool = True) -> Any:
    """A context in which `jax_enable_x64` is `on`: `jax.enable_x64` where this JAX
    has it, else `jax.experimental.enable_x64` (the oldest JAX supported)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(on)
    return importlib.import_module("jax.experimental").enable_x64(on)
