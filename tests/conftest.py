import gc
import os
import sys

import jax
import pytest

import fast_compile

# The platform the tests run on: the CPU, unless EQXOPT_TEST_PLATFORM names another
# in `jax_platforms`' terms ("cuda", "tpu"; "cuda,cpu" keeps the CPU beside it).
# The CPU by default keeps JAX from grabbing other backends and makes every failure
# reproducible; tests that need the native CPU kernels are marked `needs_compiler`
# and skip elsewhere.
TEST_PLATFORM = os.environ.get("EQXOPT_TEST_PLATFORM", "cpu")

# XLA:CPU compiles the tests' programs with its least effort (see fast_compile.py);
# before JAX starts its backend.
if fast_compile.ENABLED:
    os.environ["XLA_FLAGS"] = fast_compile.xla_flags_with_fast_compile(
        os.environ.get("XLA_FLAGS", "")
    )
jax.config.update("jax_platforms", TEST_PLATFORM)
if TEST_PLATFORM != "cpu":
    # The references (optax, torch and NumPy on the CPU) multiply float32 matrices
    # in float32; XLA on a GPU would use TF32 by default.
    jax.config.update("jax_default_matmul_precision", "highest")
# The processes tests start (8 host devices, the native kernels' switches, training
# across processes) test the CPU, whatever platform this one tests.
os.environ["JAX_PLATFORMS"] = "cpu"

# JAX's strict dtype promotion, as equinox's tests run: every implicit promotion
# between dtypes raises, so eqxopt never promotes behind a user's back. References
# that promote implicitly (optax, some NumPy transcriptions) run inside
# `jax.numpy_dtype_promotion("standard")`. EQXOPT_TEST_STRICT_PROMOTION=0 turns it
# off (to tell a promotion failure from a numerical one).
STRICT_PROMOTION = os.environ.get("EQXOPT_TEST_STRICT_PROMOTION", "1") == "1"
if STRICT_PROMOTION:
    jax.config.update("jax_numpy_dtype_promotion", "strict")

# EQXOPT_TEST_COMPILATION_CACHE names a directory for JAX's persistent compilation
# cache: a second run of the tests (the run without the native backend after the
# run with it, in CI) then loads what the first compiled instead of compiling again.
COMPILATION_CACHE = os.environ.get("EQXOPT_TEST_COMPILATION_CACHE")
if COMPILATION_CACHE:
    # No size limit: with one, every write scans the whole directory under a lock.
    # (An entry read while another worker writes it fails zlib's check and is
    # compiled again.) Set in the environment too, which JAX reads at start-up:
    # for the processes tests start.
    for option, value in (
        ("jax_compilation_cache_dir", COMPILATION_CACHE),
        ("jax_persistent_cache_min_compile_time_secs", 0.0),
        ("jax_persistent_cache_min_entry_size_bytes", 0),
    ):
        jax.config.update(option, value)
        os.environ[option.upper()] = str(value)


def _max_memory_maps() -> int | None:
    """The kernel's limit on memory mappings per process (Linux), or `None`."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


# A test process keeps every program it has compiled (JAX's caches hold them), and
# each loaded XLA:CPU executable maps a few regions of memory. Over the whole suite
# a worker reached Linux's limit on mappings per process (vm.max_map_count, 65,530
# by default); the next executable then failed to load, and the C++ exception that
# jaxlib raises for that failure killed the process. Once this process holds half
# the limit (counted every few tests: a count reads the whole map), JAX's caches are
# dropped; later tests compile, or load from the persistent cache, what they use.
MAX_MEMORY_MAPS = _max_memory_maps()
_tests_run = [0]


def _memory_maps() -> int:
    with open("/proc/self/maps", "rb") as f:
        return sum(1 for _ in f)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _tests_run[0] += 1
    if MAX_MEMORY_MAPS is None or _tests_run[0] % 20:
        return
    if _memory_maps() > MAX_MEMORY_MAPS // 2:
        jax.clear_caches()
        gc.collect()


# `make test-no-native`: the package under test is a copy without its native backend.
if os.environ.get("EQXOPT_TEST_WITHOUT_NATIVE", "0") == "1":
    import importlib.util

    import eqxopt

    assert importlib.util.find_spec("eqxopt._native") is None, eqxopt.__file__

# Where the native kernels must be available (CI, on a machine with g++), a test
# marked `needs_compiler` fails instead of skipping.
REQUIRE_NATIVE = os.environ.get("EQXOPT_TEST_REQUIRE_NATIVE", "0") == "1"

_native_available: list[bool] = []


def native_kernels_here() -> bool:
    """`eqxopt.native_kernels_available()`, asked once per process, and only when a
    test needs it (the first call builds the kernels)."""
    if not _native_available:
        import eqxopt

        _native_available.append(eqxopt.native_kernels_available())
    return _native_available[0]


def skip_without_native_kernels() -> None:
    if native_kernels_here():
        return
    reason = (
        "the native CPU kernels are not available here (no C++ compiler, or the "
        "backend is off for this JAX)"
    )
    if REQUIRE_NATIVE:
        pytest.fail(f"{reason}, and EQXOPT_TEST_REQUIRE_NATIVE=1", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_compiler") is not None:
        skip_without_native_kernels()
    # References that draw from torch's global generator (stochastic rounding,
    # random probes) give the same numbers in every run and in any test order.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)


@pytest.fixture
def needs_compiler() -> None:
    """The fixture form of `@pytest.mark.needs_compiler` (for a fixture or helper
    that only some tests reach)."""
    skip_without_native_kernels()


def _catalog_case(item: pytest.Item) -> str | None:
    """The name of the catalog case (`catalog.CatalogCase`) an item runs, or
    `None`."""
    from catalog import CatalogCase

    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec is not None else None
    return case.name if isinstance(case, CatalogCase) else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within each file, the tests run over catalog cases run case by case (every
    test of the first case, then every test of the second, ...) instead of test by
    test.

    eqxopt keeps the last 64 programs of each compiled function (`update`, `step`;
    `_core._compile.PROGRAMS_KEPT`), and the catalog holds more cases than that:
    test by test, each test compiled again what the tests before it had compiled
    for the same case. Case by case, the tests of one case share those programs
    (test_catalog.py: 242 s -> 141 s in one process). The same tests run, each as
    before; only their order changes (alike on every xdist worker), and the other
    items keep their places."""
    by_file: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if _catalog_case(item) is not None:
            by_file.setdefault(item.nodeid.split("::")[0], []).append(i)
    for places in by_file.values():
        group = [items[i] for i in places]
        first: dict[str | None, int] = {}
        for n, item in enumerate(group):
            first.setdefault(_catalog_case(item), n)
        group.sort(key=lambda item: first[_catalog_case(item)])
        for i, item in zip(places, group):
            items[i] = item
