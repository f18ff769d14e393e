// eqxopt's one native library: the XLA FFI handlers for element-wise steps,
// `Packed`'s copies and steps of leaves with quantized moments, compiled as one
// translation unit so that they share one registry of rule functions and one thread
// pool (`common.h`). `_build.py` copies every file of this folder next to this one,
// hashes them all for the cache key, and compiles this file.

#include "common.h"
#include "elementwise.cc"
#include "quantized.cc"
