"""Native element-wise steps: an optimizer's per-leaf rule as one C loop per leaf.

On XLA:CPU an element-wise rule with several outputs (update, first and second
moment, ...) runs as one single-threaded loop per output, each reading the inputs
again: AdamW makes three passes over 40 bytes per parameter where one pass over 28
bytes would do. Every rule that `map_leaves` is told is element-wise
(`elementwise=True`) can instead run here, without the optimizer doing anything:

1. The rule is traced once on float32 scalars (`jax.make_jaxpr`). Equations that
   do not depend on the leaf's elements (learning rate, bias corrections, literals)
   stay in the XLA program and reach the loop as a vector of float32 scalars.
2. The rest becomes C: one statement per equation inside one loop over elements, so
   every intermediate lives in registers. Only a white-list of element-wise
   primitives is translated; anything else (a reduction, a complex number, an
   unknown primitive) makes the rule fall back to XLA's code.
3. The C function is compiled once (`_native.load_kernel`, cached on disk) and
   called through an XLA FFI custom call, one per leaf, which splits large leaves
   across threads.

They run the steps that write in place (`update`/`step` with `donate=True`, the
custom call aliasing each output to the buffer it replaces). A step into new buffers
is bound by their allocation (page faults on every new page), which XLA's passes pay
no worse, so those keep XLA's code. Inside `step`, the loop also adds the update to
the parameter (`p + u`, exactly as `apply_updates` does for float32), so the step is
a single pass; the update itself is then produced only if something other than the
apply reads it.

The results are those of XLA's code to rounding, with the same elements finite:
each operation rounds the same way (no fast-math), a multiply whose only user is an
add or subtract is fused into an FMA exactly where XLA:CPU lets LLVM fuse it (on
machines with FMA; with one, `nu - mu * mu` stays finite when `mu * mu` overflows),
and `exp`/`log`/`tanh`/`pow` come from the C library.

The native path is used for float32 leaves when the default backend is a single CPU
device (with several devices a custom call could force sharded arrays to be
gathered, so XLA's code runs instead). `set_native_kernels(False)` or the
environment variable `EQXOPT_NATIVE=0` turn it off. Differentiating through a step
(`jax.jvp`/`jax.grad` of `opt.step`) uses XLA's code via a custom JVP, and so do
programs exported with `jax.export` (the custom call lives in this process only).
"""

import contextlib
import contextvars
import functools
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

from .._core import _dispatch
from . import _build as _native

_enabled = [_native.env_flag("EQXOPT_NATIVE", True)]


def set_native_kernels(enabled: bool) -> None:
    """Turns eqxopt's native CPU kernels on (the default) or off.

    With them on, donated steps (`donate=True`) of element-wise optimizer rules on
    float32 leaves run as one compiled C loop per leaf (single pass, in place,
    multi-threaded for large leaves) when the default JAX backend is a single CPU
    device. With them off, XLA's own per-leaf code runs.
    Results agree to rounding. eqxopt's own compiled steps are dropped, so the next
    `opt.step`/`opt.update` traces again; a step inside your own `jax.jit` keeps the
    code it was compiled with until that function traces again. The environment
    variable `EQXOPT_NATIVE=0` (or `false`/`no`/`off`) sets the default to off.

    **Arguments:**

    - `enabled`: a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    if enabled != _enabled[0]:
        _enabled[0] = enabled
        _dispatch.clear_caches()


def native_kernels_available() -> bool:
    """Whether steps traced now would use the native CPU kernels: they are switched
    on, the default backend is one CPU device, and the kernels could be built (this
    builds them on first call: a few seconds, once per machine)."""
    return usable()


def usable() -> bool:
    if not _enabled[0]:
        return False
    devices = jax.devices()
    if len(devices) != 1 or devices[0].platform != "cpu":
        return False
    return _native.handler() is not None


# --------------------------------------------------------------------------------------
# How the entry points tell the engine what happens to its results.
# --------------------------------------------------------------------------------------

# During the trace of `step`: maps id(update) -> (update, new parameter) for updates
# whose parameter the kernel has already produced.
_applied: contextvars.ContextVar[dict[int, tuple[Any, Any]] | None] = (
    contextvars.ContextVar("eqxopt_applied", default=None)
)
# During the trace of a donating entry: outputs may overwrite their inputs.
_in_place: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "eqxopt_in_place", default=False
)


@contextlib.contextmanager
def tracing_entry(*, step: bool, donated: bool) -> Iterator[dict[int, Any] | None]:
    applied: dict[int, Any] | None = {} if step else None
    tokens = (_applied.set(applied), _in_place.set(donated))
    try:
        yield applied
    finally:
        _applied.reset(tokens[0])
        _in_place.reset(tokens[1])


def applied_param(applied: dict[int, Any] | None, update: Any) -> Any:
    """The new parameter the kernel made for `update`, or `None`."""
    if applied is None:
        return None
    hit = applied.get(id(update))
    return hit[1] if hit is not None and hit[0] is update else None


# --------------------------------------------------------------------------------------
# From a rule to C.
# --------------------------------------------------------------------------------------


class Unsupported(Exception):
    """The rule uses something the C translation does not handle."""


_UNARY = {
    "neg": "(-{0})",
    "sqrt": "std::sqrt({0})",
    "rsqrt": "(1.0f / std::sqrt({0}))",
    "abs": "std::fabs({0})",
    "sign": "eqx_sign({0})",
    "exp": "std::exp({0})",
    "exp2": "std::exp2({0})",
    "log": "std::log({0})",
    "log1p": "std::log1p({0})",
    "expm1": "std::expm1({0})",
    "tanh": "std::tanh({0})",
    "logistic": "(1.0f / (1.0f + std::exp(-{0})))",
    "floor": "std::floor({0})",
    "ceil": "std::ceil({0})",
    "square": "({0} * {0})",
    "copy": "{0}",
    "copy_p": "{0}",
    "is_finite": "std::isfinite({0})",
    "not": "(!{0})",
}
_BINARY = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "max": "eqx_max({0}, {1})",
    "min": "eqx_min({0}, {1})",
    "pow": "std::pow({0}, {1})",
    "gt": "({0} > {1})",
    "lt": "({0} < {1})",
    "ge": "({0} >= {1})",
    "le": "({0} <= {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "and": "({0} && {1})",
    "or": "({0} || {1})",
}
# Primitives whose operands must be booleans (on integers they are bitwise).
_BOOLEAN_ONLY = {"and", "or", "not"}
_CALLS = {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "remat"}

_PRELUDE = """\
#include <cmath>
#include <cstdint>
static inline float eqx_max(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float eqx_min(float a, float b) { return (a < b || a != a) ? a : b; }
static inline float eqx_sign(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);
}
"""

_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)


class _Vector:
    """A per-element value in the generated code."""

    __slots__ = ("dtype", "name")

    def __init__(self, name: str, dtype: np.dtype):
        self.name, self.dtype = name, dtype


class _Scalar:
    """A value that does not depend on the elements (computed in XLA)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class Op:
    """One translated equation, kept to re-run the rule in JAX (for derivatives)."""

    __slots__ = ("operands", "out", "params", "primitive")

    def __init__(self, primitive, params, operands, out):
        self.primitive, self.params, self.operands, self.out = (
            primitive,
            params,
            operands,
            out,
        )


class Program:
    """A rule translated for one set of outputs.

    `scalars` are the element-independent values (tracers of the enclosing trace)
    the loop reads; `ops`/`outputs` describe the loop for `reference`; `source` is
    the C function."""

    def __init__(self, source, scalars, ops, outputs, n_in):
        self.kernel_id: int | None = None
        self.vector: Any = None
        self.source = source
        self.scalars = scalars
        self.ops = ops
        self.outputs = outputs
        self.n_in = n_in


class _Lowering:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.scalars: list[Any] = []
        self.scalar_names: dict[int, str] = {}
        self.ops: list[Op] = []
        self.forms: dict[str, tuple[str, str, str]] = {}
        self.known: dict[tuple[str, str], str] = {}
        self.counter = itertools.count()

    def scalar_ref(self, value: Any, dtype: np.dtype) -> tuple[str, tuple]:
        if jnp.shape(value) != ():
            raise Unsupported("a value captured by the rule is not a scalar")
        key = id(value)
        if key not in self.scalar_names:
            self.scalar_names[key] = f"s{len(self.scalars)}"
            self.scalars.append(value)
        name = self.scalar_names[key]
        index = int(name[1:])
        return (f"({name} != 0.0f)" if dtype == _BOOL else name), ("s", index)

    def ref(self, item: Any, dtype: np.dtype) -> tuple[str, tuple]:
        if isinstance(item, _Vector):
            return item.name, ("v", item.name)
        return self.scalar_ref(item.value, dtype)

    def new(self, expr: str, dtype: np.dtype, form: tuple | None = None) -> _Vector:
        """A new vector `expr`; `form` is `(op, a, b)` for the float `add`, `sub`,
        `mul` and `neg` (`b` unused) that `contract` may fuse into an FMA."""
        ctype = "bool" if dtype == _BOOL else "float"
        # One vector per distinct expression, as XLA's CSE leaves it: a product
        # that XLA shares between two users is not fused into either (`contract`).
        if (ctype, expr) in self.known:
            return _Vector(self.known[ctype, expr], dtype)
        name = f"v{next(self.counter)}"
        self.known[ctype, expr] = name
        self.lines.append(f"    const {ctype} {name} = {expr};")
        if form is not None:
            self.forms[name] = form
        return _Vector(name, dtype)

    def contract(self, stored: list[str]) -> list[str]:
        """The loop's lines with `a * b + c` patterns fused into FMAs where XLA:CPU
        fuses them: XLA lets LLVM contract any float multiply whose only user is an
        add or subtract (`FPOpFusion::Fast`; `inf - inf` becomes `fma(-m, m, inf)`),
        and which elements come out finite depends on it. `EQX_FMA` is `fmaf` on
        machines with FMA, where XLA contracts, and a multiply and an add elsewhere.
        `stored`: the expressions the loop stores."""
        text = "\n".join([*self.lines, *stored])
        uses: dict[str, int] = {}
        for name in re.findall(r"\bv\d+\b", text):
            uses[name] = uses.get(name, 0) + 1
        # Each name's definition is one occurrence; a single user makes two.
        single = {name for name, n in uses.items() if n == 2}

        def mul(x: str) -> tuple[str, str] | None:
            form = self.forms.get(x)
            if form is not None and form[0] == "mul" and x in single:
                return form[1], form[2]
            return None

        def negated_mul(x: str) -> tuple[str, str] | None:
            # `a + (-(m * n))`: XLA rewrites it to `a - m * n`.
            form = self.forms.get(x)
            if form is not None and form[0] == "neg" and x in single:
                return mul(form[1])
            return None

        fused: dict[str, str] = {}
        for name, form in self.forms.items():
            op, a, b = form
            if op not in ("add", "sub"):
                continue
            if op == "sub":
                options = [(mul(a), "", f"-{b}"), (mul(b), "-", a)]
            else:
                options = [
                    (mul(a), "", b),
                    (mul(b), "", a),
                    (negated_mul(b), "-", a),
                    (negated_mul(a), "-", b),
                ]
            for m, sign, addend in options:
                if m is not None:
                    fused[name] = f"EQX_FMA({sign}{m[0]}, {m[1]}, {addend})"
                    break
        lines = []
        for line in self.lines:
            name = line.split()[2]
            if name in fused:
                line = f"    const float {name} = {fused[name]};"
            lines.append(line)
        return lines

    def walk(self, jaxpr: Any, env: dict) -> None:
        def read(v: Any) -> Any:
            if isinstance(v, jex.Literal):
                return _Scalar(v.val)
            return env[v]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            if all(isinstance(x, _Scalar) for x in ins):
                params = eqn.primitive.get_bind_params(eqn.params)
                outs = eqn.primitive.bind(*(x.value for x in ins), **params)
                if not eqn.primitive.multiple_results:
                    outs = [outs]
                for v, out in zip(eqn.outvars, outs):
                    env[v] = _Scalar(out)
                continue
            name = eqn.primitive.name
            if name in _CALLS:
                sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
                if sub is None:
                    raise Unsupported(f"call primitive {name} without a jaxpr")
                inner = getattr(sub, "jaxpr", sub)
                consts = getattr(sub, "consts", ())
                inner_env = dict(zip(inner.invars, ins))
                inner_env.update(
                    (v, _Scalar(c)) for v, c in zip(inner.constvars, consts)
                )
                self.walk(inner, inner_env)
                for v, o in zip(eqn.outvars, inner.outvars):
                    env[v] = (
                        _Scalar(o.val) if isinstance(o, jex.Literal) else inner_env[o]
                    )
                continue
            (out,) = eqn.outvars
            dtype = np.dtype(out.aval.dtype)
            if out.aval.shape != () or dtype not in (_F32, _BOOL):
                raise Unsupported(f"{name} gives {out.aval}")
            in_dtypes = [np.dtype(v.aval.dtype) for v in eqn.invars]
            if any(d not in (_F32, _BOOL) for d in in_dtypes):
                raise Unsupported(f"{name} on {in_dtypes}")
            if name in _BOOLEAN_ONLY and any(d != _BOOL for d in in_dtypes):
                raise Unsupported(f"bitwise {name}")
            refs = [self.ref(x, d) for x, d in zip(ins, in_dtypes)]
            exprs = [r[0] for r in refs]
            operands = tuple(r[1] for r in refs)
            form = None
            if name in _UNARY:
                expr = _UNARY[name].format(*exprs)
                if name == "neg":
                    form = ("neg", exprs[0], "")
                elif name == "square":
                    form = ("mul", exprs[0], exprs[0])
            elif name in _BINARY:
                expr = _BINARY[name].format(*exprs)
                if name in ("add", "sub", "mul") and dtype == _F32:
                    form = (name, exprs[0], exprs[1])
            elif name == "integer_pow":
                expr = self.integer_pow(exprs[0], eqn.params["y"])
                form = self.forms.get(expr)  # `x**2` is the multiply `x * x`
            elif name == "select_n" and len(exprs) == 3 and in_dtypes[0] == _BOOL:
                expr = f"({exprs[0]} ? {exprs[2]} : {exprs[1]})"
            elif name == "clamp":
                expr = f"eqx_min(eqx_max({exprs[1]}, {exprs[0]}), {exprs[2]})"
            elif name == "convert_element_type":
                if in_dtypes[0] == dtype:
                    expr = exprs[0]
                elif dtype == _F32:
                    expr = f"({exprs[0]} ? 1.0f : 0.0f)"
                else:
                    expr = f"({exprs[0]} != 0.0f)"
            else:
                raise Unsupported(f"primitive {name}")
            vector = self.new(expr, dtype, form)
            self.ops.append(Op(eqn.primitive, dict(eqn.params), operands, vector.name))
            env[out] = vector

    def integer_pow(self, x: str, y: int) -> str:
        # The multiplications JAX's own lowering does (binary exponentiation).
        if y == 0:
            return "1.0f"
        base, acc, n = x, None, abs(y)
        while n > 0:
            if n & 1:
                if acc is None:
                    acc = base
                else:
                    form = ("mul", acc, base)
                    acc = self.new(f"({acc} * {base})", _F32, form).name
            n >>= 1
            if n > 0:
                base = self.new(f"({base} * {base})", _F32, ("mul", base, base)).name
        return f"(1.0f / {acc})" if y < 0 else str(acc)


def translate(rule: Callable, n_in: int, extra_args: tuple, outputs: str) -> Program:
    """Translates `rule(*inputs, *extra_args)` (inputs: `n_in` float32 scalars).

    `outputs`: `"update"` (the rule's outputs), `"step"` (the first output replaced
    by `inputs[1] + output`, the applied parameter) or `"direction"` (the first
    output only)."""

    def traced(*xs):
        return rule(*xs, *extra_args)

    spec = jax.ShapeDtypeStruct((), jnp.float32)
    try:
        closed = jax.make_jaxpr(traced)(*([spec] * n_in))
    except Exception as error:
        # A rule that needs the leaf's shape (or a genuine error, which XLA's path
        # then raises where it belongs).
        raise Unsupported(f"the rule does not trace on scalars: {error}") from error
    jaxpr = closed.jaxpr
    low = _Lowering()
    env: dict = {}
    for i, v in enumerate(jaxpr.invars):
        env[v] = _Vector(f"x{i}", _F32)
    for v, c in zip(jaxpr.constvars, closed.consts):
        env[v] = _Scalar(c)
    low.walk(jaxpr, env)

    results = []
    for v in jaxpr.outvars:
        item = _Scalar(v.val) if isinstance(v, jex.Literal) else env[v]
        aval: Any = v.aval
        if np.dtype(aval.dtype) != _F32 or aval.shape != ():
            raise Unsupported(f"an output is {aval}")
        results.append(low.ref(item, _F32))
    if outputs == "step":
        # The apply `p + u` (in XLA's program the same fusion as `u`).
        term = results[0][0]
        applied = low.new(f"(x1 + {term})", _F32, ("add", "x1", term))
        results[0] = (applied.name, ("step", results[0][1]))
    elif outputs == "direction":
        results = results[:1]

    stored = [f"    out{o}[i] = {r[0]};" for o, r in enumerate(results)]
    body = "\n".join(
        [
            *(f"    const float x{i} = in{i}[i];" for i in range(n_in)),
            *low.contract(stored),
            *stored,
        ]
    )
    # GCC vectorises the loop only when the pointers are `__restrict__` parameters,
    # hence the inner function. (Outputs may alias inputs element for element; each
    # iteration reads before it writes, so that is safe.)
    pointers = [f"const float* __restrict__ in{i}" for i in range(n_in)]
    pointers += [f"float* __restrict__ out{o}" for o in range(len(results))]
    unpacked = [f"in[{i}]" for i in range(n_in)]
    unpacked += [f"out[{o}]" for o in range(len(results))]
    scalars = "\n".join(
        f"  const float s{k} = scalars[{k}];" for k in range(len(low.scalars))
    )
    signature = (
        f"({', '.join(pointers)},\n"
        "                        const float* __restrict__ scalars, int64_t n)"
    )
    loop = (
        f"{signature} {{\n{scalars}\n"
        f"  for (int64_t i = 0; i < n; ++i) {{\n{body}\n  }}\n}}\n"
    )
    call = f"({', '.join(unpacked)}, scalars, n);"
    source = (
        f"{_PRELUDE}"
        "#if defined(__x86_64__)\n"
        # XLA compiles for the host: FMAs (and AVX2) exactly where it has them.
        "#define EQX_FMA(a, b, c) std::fma(a, b, c)\n"
        f'__attribute__((target("avx2,fma"))) static void loop_fma{loop}'
        "#undef EQX_FMA\n"
        "#define EQX_FMA(a, b, c) ((a) * (b) + (c))\n"
        f"static void loop_plain{loop}"
        'extern "C" void eqxopt_kernel(const float* const* in, float* const* out,\n'
        "                              const float* scalars, int64_t n) {\n"
        '  static const bool fma = __builtin_cpu_supports("fma") &&\n'
        '                          __builtin_cpu_supports("avx2");\n'
        f"  if (fma) loop_fma{call} else loop_plain{call}\n}}\n"
        "#else\n"
        # Other CPUs XLA targets (AArch64) always have FMA.
        "#define EQX_FMA(a, b, c) std::fma(a, b, c)\n"
        f"static inline void loop{loop}"
        'extern "C" void eqxopt_kernel(const float* const* in, float* const* out,\n'
        "                              const float* scalars, int64_t n) {\n"
        f"  loop{call}\n}}\n"
        "#endif\n"
    )
    return Program(source, low.scalars, low.ops, [r[1] for r in results], n_in)


# --------------------------------------------------------------------------------------
# Running a program.
# --------------------------------------------------------------------------------------


def _as_f32(value: Any) -> Any:
    return jnp.asarray(value).astype(jnp.float32)


def scalar_vector(program: Program) -> jax.Array:
    if not program.scalars:
        return jnp.zeros((1,), jnp.float32)
    return jnp.stack([_as_f32(v) for v in program.scalars])


def reference(program: Program, scalars: jax.Array, *inputs: jax.Array) -> list:
    """The program evaluated by JAX primitives (what XLA would run), on leaves of
    any shape: used for derivatives and in tests."""
    shape = jnp.shape(inputs[0])
    values: dict[str, Any] = {}

    def get(ref: tuple) -> Any:
        kind, key = ref
        if kind == "s":
            return jnp.broadcast_to(scalars[key], shape)
        return values[key]

    for i, x in enumerate(inputs):
        values[f"x{i}"] = x
    for op in program.ops:
        args = [get(r) for r in op.operands]
        # Booleans travel as 0/1 floats in `scalars`.
        args = [
            a != 0 if r[0] == "s" and _wants_bool(op, j) else a
            for j, (a, r) in enumerate(zip(args, op.operands))
        ]
        values[op.out] = op.primitive.bind(*args, **op.params)
    outs = []
    for ref in program.outputs:
        if ref[0] == "step":
            outs.append(inputs[1] + get(ref[1]))
        else:
            outs.append(get(ref))
    return outs


def _wants_bool(op: Op, position: int) -> bool:
    name = op.primitive.name
    if name in _BOOLEAN_ONLY:
        return True
    return name == "select_n" and position == 0


class _Spec:
    """Static data of one kernel call (hashed by identity for `custom_jvp`)."""

    def __init__(
        self, program: Program, kernel_id: int, n_leaves: int, aliases: dict[int, int]
    ):
        self.program, self.kernel_id = program, kernel_id
        self.n_leaves, self.aliases = n_leaves, aliases


def _reference_leaves(spec: _Spec, scalars: jax.Array, *inputs: jax.Array) -> list:
    n_in = spec.program.n_in
    return [
        out
        for j in range(spec.n_leaves)
        for out in reference(spec.program, scalars, *inputs[j * n_in : (j + 1) * n_in])
    ]


# The kernels' custom call, or (in exported programs, which cannot carry it) the
# same rule as XLA operations.
_elementwise = _native.ffi_or_xla(
    _native.target_name(),
    lambda scalars, *inputs, static: _reference_leaves(static, scalars, *inputs),
)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _call(spec: _Spec, scalars: jax.Array, *inputs: jax.Array) -> list:
    return _elementwise.bind(
        scalars,
        *inputs,
        static=spec,
        aliases=tuple(spec.aliases.items()),
        attributes=(
            ("kernel", np.int64(spec.kernel_id)),
            ("n_in", np.int64(spec.program.n_in)),
        ),
    )


@_call.defjvp
def _call_jvp(spec: _Spec, primals: tuple, tangents: tuple) -> tuple:
    return jax.jvp(functools.partial(_reference_leaves, spec), primals, tangents)


def order_after(x: jax.Array) -> jax.Array:
    """One element of `x`, to append to a call's scalar vector (the kernel reads
    only its own scalars, at the front), so that the call comes after `x` in XLA's
    dependency order.

    Inside a user's train step, a parameter written in place is also read by the
    backward pass: `dx = dy @ w.T` flows into the gradients of the layers before `w`,
    not into `w`'s own gradient, so nothing orders that read before the write and
    XLA's copy insertion keeps a full copy of `w` (and of every weight, for XLA's own
    update fusions and optax's too). Making the call wait for the gradient of the
    previous leaf in tree order (for models whose tree follows the forward pass, that
    gradient is made from the `dx` that read `w`) lets XLA drop the copy; each
    gradient still dies soon after it is made, so temporaries stay small. Nothing
    depends on the guess being right: where the order is not proven, XLA copies."""
    return jnp.reshape(x, (-1,))[:1].astype(jnp.float32)


def load(program: Program) -> int:
    """Builds (or finds) `program`'s kernel; `Unsupported` if that fails."""
    if program.kernel_id is None:
        try:
            program.kernel_id = _native.load_kernel(program.source)
        except Exception as error:  # a full disk, a compiler error: XLA's code
            _native.warn_once(error)
            raise Unsupported(f"the kernel could not be built: {error}") from error
        program.vector = scalar_vector(program)
    return program.kernel_id


def run_many(
    program: Program,
    leaves: Sequence[Sequence[jax.Array]],
    aliases: dict[int, int],
    after: Sequence[jax.Array] = (),
) -> list[list]:
    """Runs `program` on one or more leaves in one custom call (one XLA thunk);
    `aliases` maps a leaf's input positions to the outputs that reuse their buffers.
    `after`: arrays the call is made to depend on (see `order_after`). Returns each
    leaf's outputs."""
    kernel_id = load(program)
    n_in, n_out = program.n_in, len(program.outputs)
    # Argument 0 of the custom call is the scalar vector; leaves are leaf-major.
    flat_aliases = {
        1 + j * n_in + i: j * n_out + o
        for j in range(len(leaves))
        for i, o in aliases.items()
    }
    spec = _Spec(program, kernel_id, len(leaves), flat_aliases)
    vector = program.vector
    if after:
        vector = jnp.concatenate([vector, *map(order_after, after)])
    outs = _call(spec, vector, *(x for leaf in leaves for x in leaf))
    return [outs[j * n_out : (j + 1) * n_out] for j in range(len(leaves))]


def in_place() -> bool:
    return _in_place.get()


def applying() -> dict[int, Any] | None:
    return _applied.get()
