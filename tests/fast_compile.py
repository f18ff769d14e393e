"""How the tests have XLA:CPU compile: with its least effort, unless
EQXOPT_TEST_FAST_COMPILE=0.

Most of a test run is XLA:CPU compiling small programs, and the tests check what
they compute, not how fast they run. So `conftest.py` adds `FLAGS` to `XLA_FLAGS`
before JAX starts its backend (and in the environment, for the processes tests
start): LLVM's optimizations off and XLA's older loop emitters. The operations are
the same, but LLVM no longer fuses a multiply and an add into one rounding, so a
result can move in its last bits. The few tests whose claim is about XLA's default
code (bit-for-bit equality of two programs, the native kernels against XLA's code)
compile with `XLA_DEFAULTS` as their compiler options, or start their processes
with `xla_flags_without_fast_compile`. `make test-no-native` and `make
test-oldest` run with the flags off."""

import os

ENABLED = os.environ.get("EQXOPT_TEST_FAST_COMPILE", "1") == "1"

FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
)

# What XLA uses when these flags are not given, as `compile(compiler_options=...)`
# takes them; None with the flags off (nothing to undo, and the oldest supported
# XLA has no `xla_cpu_use_fusion_emitters`).
XLA_DEFAULTS = (
    {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}
    if ENABLED
    else None
)


def xla_flags_with_fast_compile(xla_flags: str) -> str:
    flags = xla_flags.split()
    return " ".join(flags + [f for f in FLAGS if f not in flags])


def xla_flags_without_fast_compile(xla_flags: str) -> str:
    return " ".join(f for f in xla_flags.split() if f not in FLAGS)
