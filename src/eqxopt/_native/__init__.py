"""The native CPU backend: element-wise rules translated to C and run in place as
XLA custom calls. Importing it registers it as the engine's backend
(`eqxopt._core._backend`, the one point where the core consults it); the core never
imports it. `_compat` holds every JAX internal it relies on (listed, with the JAX
versions tested, in README.md here); `_build` compiles and caches the shared
libraries; `_ffi` defines the custom calls and the switch; `_fused` translates
rules and runs them for the engine; `_quantized` does the same for leaves with
8-bit/4-bit moments; `_shard` finds where a step's leaves live and runs the kernels
of sharded leaves on each device's shard; `_plugin` is what the core calls.
"""

from .._core import _backend
from ._plugin import NativeBackend

_backend.register(NativeBackend())
