"""The tests run on the platform EQXOPT_TEST_PLATFORM names (the CPU by default), so
that the same suite runs unchanged on a GPU or a TPU."""

import os
import pathlib
import re
import subprocess
import sys

import jax

from conftest import TEST_PLATFORM

ROOT = pathlib.Path(__file__).resolve().parents[1]
# `jax.default_backend()` for each of `jax_platforms`' names.
BACKEND = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}


def test_the_default_backend_is_the_test_platform():
    first = TEST_PLATFORM.split(",")[0]
    assert jax.default_backend() == BACKEND.get(first, first)
    if first != "cpu":
        # float32 references compare against float32 products, not TF32 ones.
        assert jax.config.jax_default_matmul_precision == "highest"


def test_the_environment_variable_chooses_the_platform():
    """A platform this machine does not have fails the run in JAX's start, which
    names it: the variable reaches `jax_platforms`."""
    env = {**os.environ, "EQXOPT_TEST_PLATFORM": "no_such_platform"}
    test = "tests/test_platform.py::test_the_default_backend_is_the_test_platform"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0, done.stdout
    # JAX's own error, not the assertion above (which a forced CPU would fail too).
    assert re.search("backend 'no_such_platform'", done.stdout, re.IGNORECASE), (
        done.stdout
    )


def test_processes_the_tests_start_run_on_the_cpu():
    # Tests of 8 host devices, of the native kernels' switches and of training
    # across processes start Python processes of their own: CPU tests.
    done = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend())"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cpu"
