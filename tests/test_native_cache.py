"""The native kernels' disk cache and environment variables, each in a fresh
interpreter: no state of the cache directory may crash the process or keep the
kernels off, and `EQXOPT_NATIVE`/`EQXOPT_NUM_THREADS` are parsed strictly."""

import hashlib
import json
import os
import shutil
import stat

import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from conftest import skip_without_native_kernels
from test_native import run_script

# The native backend's own tests: skipped where the kernels are not available.
pytestmark = pytest.mark.needs_compiler

STEP = """
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import jax.numpy as jnp
        import numpy as np
        import eqxopt
        available = eqxopt.native_kernels_available()
        params = {"w": jnp.linspace(-1.0, 1.0, 6), "big": jnp.ones(1 << 17)}
        opt = eqxopt.AdamW(0.1)
        state = opt.init(params)
        for _ in range(2):
            grads = {k: jnp.cos(v) for k, v in params.items()}
            params, state = opt.step(grads, state, params, donate=True)
        result = np.asarray(params["w"]).tolist()
        big = float(params["big"].sum())
    print("available", available)
    print("warnings", [str(w.message) for w in caught])
    print("result", result)
    print("big", big)
"""


def expected():
    params = {"w": jnp.linspace(-1.0, 1.0, 6), "big": jnp.ones(1 << 17)}
    opt = eqxopt.AdamW(0.1)
    state = opt.init(params)
    for _ in range(2):
        grads = {k: jnp.cos(v) for k, v in params.items()}
        params, state = opt.step(grads, state, params)
    return np.asarray(params["w"]), float(params["big"].sum())


def run_step(cache, **env):
    result = run_script(STEP, EQXOPT_CACHE_DIR=str(cache), **env)
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    out = result.stdout
    want_w, want_big = expected()
    got_w = eval(out.split("result ")[1].split("\n")[0])
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out.split("big ")[1]), want_big, rtol=1e-6)
    available = out.split("available ")[1].split("\n")[0] == "True"
    return available, eval(out.split("warnings ")[1].split("\n")[0])


def libraries(cache):
    return sorted(p for p in cache.iterdir() if p.suffix == ".so")


def assert_cache_valid(cache):
    libs = libraries(cache)
    assert any(p.name.startswith("eqxopt_ffi_") for p in libs)
    assert any(p.name.startswith("eqxopt_kernel_") for p in libs)
    for lib in libs:
        record = json.loads(lib.with_suffix(".json").read_text())
        data = lib.read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    skip_without_native_kernels()
    cache = tmp_path_factory.mktemp("built")
    assert run_step(cache) == (True, [])
    assert_cache_valid(cache)
    return cache


def truncate(lib):
    lib.write_bytes(lib.read_bytes()[:4096])


def zero_bytes(lib):
    lib.write_bytes(b"")


def garbage(lib):
    lib.write_bytes(os.urandom(lib.stat().st_size))


def unloadable(lib):
    # Not a library, with a record that matches it: only loading tells.
    data = b"not an ELF file " * 1000
    lib.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    lib.with_suffix(".json").write_text(
        json.dumps({"size": len(data), "sha256": digest})
    )


def stale_record(lib):
    record = json.loads(lib.with_suffix(".json").read_text())
    record["sha256"] = "0" * 64
    lib.with_suffix(".json").write_text(json.dumps(record))


def no_record(lib):
    lib.with_suffix(".json").unlink()


def garbage_record(lib):
    lib.with_suffix(".json").write_bytes(b"\xff{not json")


def read_only_empty(lib):
    zero_bytes(lib)
    lib.chmod(stat.S_IRUSR)


CORRUPTIONS = [
    truncate,
    zero_bytes,
    garbage,
    unloadable,
    stale_record,
    no_record,
    garbage_record,
    read_only_empty,
]


@pytest.mark.parametrize(
    ("corrupt", "which"),
    [(c, "eqxopt_kernel_") for c in CORRUPTIONS]
    + [(c, "eqxopt_ffi_") for c in (truncate, zero_bytes, unloadable)],
    ids=[f"kernel-{c.__name__}" for c in CORRUPTIONS]
    + [f"handler-{c.__name__}" for c in (truncate, zero_bytes, unloadable)],
)
@pytest.mark.needs_compiler
@pytest.mark.slow
def test_a_damaged_cache_is_rebuilt(built, tmp_path, corrupt, which):
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)
    damaged = [p for p in libraries(cache) if p.name.startswith(which)]
    assert damaged
    for lib in damaged:
        corrupt(lib)
    assert run_step(cache) == (True, [])
    assert_cache_valid(cache)
    assert [p.name for p in libraries(cache)] == [p.name for p in libraries(built)]


@pytest.mark.needs_compiler
def test_libraries_are_keyed_on_the_compiler(built, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)
    compiler = tmp_path / "my-c++"
    compiler.write_text(f'#!/bin/sh\nexec {shutil.which("g++")} "$@"\n')
    compiler.chmod(0o755)
    assert run_step(cache, CXX=str(compiler)) == (True, [])
    new = set(libraries(cache)) - {cache / p.name for p in libraries(built)}
    assert {p.name.split("_")[1] for p in new} == {"ffi", "kernel"}
    assert_cache_valid(cache)


def spellings(*values: str) -> list:
    """`values` for an environment variable, each read by a fresh Python process:
    the first two in `make test`, the others in `make test-slow`."""
    slow = pytest.mark.slow
    return [pytest.param(v, marks=() if i < 2 else slow) for i, v in enumerate(values)]


@pytest.mark.parametrize("value", spellings("0", " NO ", "false", "Off"))
def test_native_off_spellings(value, tmp_path):
    assert run_step(tmp_path, EQXOPT_NATIVE=value) == (False, [])
    assert list(tmp_path.iterdir()) == []  # nothing was built


@pytest.mark.needs_compiler
@pytest.mark.parametrize("value", spellings("1", "YES", "true", "on"))
def test_native_on_spellings(value, built):
    assert run_step(built, EQXOPT_NATIVE=value) == (True, [])


@pytest.mark.parametrize("value", spellings("maybe", "2", "-1"))
def test_native_other_values_warn_once_and_keep_the_default(value, built):
    available, caught = run_step(built, EQXOPT_NATIVE=value)
    assert available
    assert caught == [
        f"EQXOPT_NATIVE={value!r} is not one of 1/true/yes/on or 0/false/no/off; "
        "using the default (on)"
    ]


@pytest.mark.needs_compiler
@pytest.mark.parametrize("value", spellings("1", "16", "2"))
def test_num_threads_takes_a_positive_integer(value, built):
    assert run_step(built, EQXOPT_NUM_THREADS=value) == (True, [])


@pytest.mark.parametrize("value", spellings("abc", "0", "-3", "1.5", "4 threads"))
def test_num_threads_other_values_warn_once_and_use_every_core(value, built):
    available, caught = run_step(built, EQXOPT_NUM_THREADS=value)
    assert available
    assert caught == [
        f"EQXOPT_NUM_THREADS={value.strip()!r} is not a positive integer; using one "
        "thread per core"
    ]
