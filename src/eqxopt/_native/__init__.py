"""The native CPU backend: element-wise rules translated to C and run in place as
XLA custom calls (see README.md here for the JAX internals it relies on).
"""

from ._fused import (
    native_kernels_available as native_kernels_available,
    set_native_kernels as set_native_kernels,
)
