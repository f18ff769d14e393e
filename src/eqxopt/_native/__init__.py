"""The native CPU backend: element-wise rules translated to C and run in place as
XLA custom calls. `_compat` holds every JAX internal it relies on (listed, with the
JAX versions tested, in README.md here); `_build` compiles and caches the shared
libraries; `_ffi` defines the custom calls and the switch; `_fused` translates
rules and runs them for the engine (`map_leaves`); `_shard` finds where a step's
leaves live and runs the kernels of sharded leaves on each device's shard.
"""

from ._ffi import (
    native_kernels_available as native_kernels_available,
    set_native_kernels as set_native_kernels,
)
