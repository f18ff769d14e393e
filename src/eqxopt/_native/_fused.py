"""Native element-wise steps: an optimizer's per-leaf rule as one C loop per leaf.

On XLA:CPU an element-wise rule with several outputs (update, first and second
moment, ...) runs as one single-threaded loop per output, each reading the inputs
again: AdamW makes three passes over 40 bytes per parameter where one pass over 28
bytes would do. Every rule that `map_leaves` is told is element-wise
(`elementwise=True`) can instead run here, without the optimizer doing anything:

1. The rule is traced once on float32 scalars (`jax.make_jaxpr`). Equations that
   do not depend on the leaf's elements (learning rate, bias corrections, literals)
   stay in the XLA program and reach the loop as a vector of float32 scalars. The
   promise is checked: traced on each leaf's own shape, the rule must do the same
   operations on the same values (shapes aside); one that reads `g.shape` or
   `g.size`, or takes another branch for other shapes, keeps XLA's code.
2. The rest becomes C: one statement per equation inside one loop over elements, so
   every intermediate lives in registers. Only a white-list of element-wise
   primitives (matched by object, through `_compat`) is translated; anything else
   (a reduction, a complex number, an unknown primitive) makes the rule fall back
   to XLA's code.
3. The C function is compiled once (`_build.load_kernel`, cached on disk) and
   called through an XLA FFI custom call, one per leaf, which splits large leaves
   across threads.

The engine (`map_leaves`, through `Kernels` below) runs them in the steps that write
in place (`update`/`step` with `donate=True`, the custom call aliasing each output to
the buffer it replaces). A step into new buffers is bound by their allocation (page
faults on every new page), which XLA's passes pay no worse, so those keep XLA's
code. Inside `step`, the loop also adds the update to the parameter (`p + u`,
exactly as `apply_updates` does for float32), so the step is a single pass, and
the update itself is not produced.

The results are those of XLA's code to rounding, with the same elements finite:
each operation rounds the same way (no fast-math), a multiply whose only user is an
add or subtract is fused into an FMA exactly where XLA:CPU lets LLVM fuse it (on
machines with FMA; with one, `nu - mu * mu` stays finite when `mu * mu` overflows),
and `exp`/`log`/`tanh`/`pow` come from the C library.

The native path is used for float32 leaves when `_ffi.usable()` (switched on, a
tested JAX, the CPU), on the device that holds them or, for leaves sharded over a
mesh, on each device's shard (`_shard`). Differentiating through a step
(`jax.jvp`/`jax.grad` of `opt.step`) uses XLA's code via a custom JVP, and so do
programs exported with `jax.export` (the custom call lives in this process only).
"""

import contextlib
import contextvars
import dataclasses
import functools
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._core._backend import LeafResult, NotLowered
from .._core._jax_api import is_tracer
from . import _build, _compat, _ffi, _shard

# --------------------------------------------------------------------------------------
# From a rule to C.
# --------------------------------------------------------------------------------------


class Unsupported(NotLowered):
    """The rule uses something the C translation does not handle."""


# The element-wise primitives translated, as C expressions of their operands, by
# our own name for each; `_OPS` maps each primitive object of this JAX to that name.
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
_OTHER = ("integer_pow", "select_n", "clamp", "convert_element_type")
_OPS = {
    prim: name[: -len("_p")]
    for prim, name in _compat.primitives(
        *(f"{op}_p" for op in [*_UNARY, *_BINARY, *_OTHER])
    ).items()
}
# Primitives whose operands must be booleans (on integers they are bitwise).
_BOOLEAN_ONLY = {"and", "or", "not"}
# Shapes aside, an element-wise rule traced on a leaf does what it does on a scalar,
# except for broadcasting its scalars (`Rule.check`).
_BROADCAST = next(iter(_compat.primitives("broadcast_in_dim_p")), None)

_PRELUDE = """\
#include <cmath>
#include <cstdint>
static inline float eqx_max(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float eqx_min(float a, float b) { return (a < b || a != a) ? a : b; }
static inline float eqx_sign(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);
}
"""

# The AVX-512 loop's attributes: without a preferred width of 512 bits the
# compilers keep to 256-bit vectors.
_AVX512 = (
    "#if defined(__clang__)\n"
    '__attribute__((target("avx512f,avx512vl,avx2,fma"), min_vector_width(512)))\n'
    "#else\n"
    '__attribute__((target("avx512f,avx512vl,avx2,fma,prefer-vector-width=512")))\n'
    "#endif\n"
)

_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)


class _Vector(NamedTuple):
    """A per-element value in the generated code."""

    name: str
    dtype: np.dtype


class _Scalar(NamedTuple):
    """A value that does not depend on the elements (computed in XLA)."""

    value: Any


class Op(NamedTuple):
    """One translated equation, kept to re-run the rule in JAX (for derivatives):
    `name` is the primitive's in `_OPS`, `operands` refer to vectors or scalars."""

    primitive: Any
    name: str
    params: dict[str, Any]
    operands: tuple
    out: str


@dataclasses.dataclass(eq=False)
class Program:
    """A rule translated for one set of outputs.

    `scalars` are the element-independent values (tracers of the enclosing trace)
    the loop reads; `ops`/`outputs` describe the loop for `reference`; `source` is
    the C function; `kernel_id` and `vector` (the scalars stacked) are set by
    `load`."""

    source: str
    scalars: list[Any]
    ops: list[Op]
    outputs: list[tuple]
    n_in: int
    kernel_id: int | None = None
    vector: Any = None


@dataclasses.dataclass
class _Lowering:
    """The C loop being written: its lines, the scalars it reads, and (to fuse FMAs
    as XLA does) the multiplies and adds it made."""

    lines: list[str] = dataclasses.field(default_factory=list)
    scalars: list[Any] = dataclasses.field(default_factory=list)
    scalar_names: dict[int, str] = dataclasses.field(default_factory=dict)
    ops: list[Op] = dataclasses.field(default_factory=list)
    forms: dict[str, tuple[str, str, str]] = dataclasses.field(default_factory=dict)
    known: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    counter: Any = dataclasses.field(default_factory=itertools.count)

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
            if _compat.is_literal(v):
                return _Scalar(v.val)
            return env[v]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            if all(isinstance(x, _Scalar) for x in ins):
                outs = _compat.bind(eqn.primitive, eqn.params, *(x.value for x in ins))
                for v, out in zip(eqn.outvars, outs):
                    env[v] = _Scalar(out)
                continue
            body = _compat.call_body(eqn)
            if body is not None:
                inner, consts = body
                inner_env = dict(zip(inner.invars, ins))
                inner_env.update(
                    (v, _Scalar(c)) for v, c in zip(inner.constvars, consts)
                )
                self.walk(inner, inner_env)
                for v, o in zip(eqn.outvars, inner.outvars):
                    env[v] = _Scalar(o.val) if _compat.is_literal(o) else inner_env[o]
                continue
            name = _OPS.get(eqn.primitive)
            if name is None:
                raise Unsupported(
                    f"it uses `{eqn.primitive}`, which the translation to C does "
                    "not cover (it covers: "
                    + ", ".join(sorted(set(_OPS.values())))
                    + ")"
                )
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
                raise Unsupported(f"{name} on {len(exprs)} operands")
            vector = self.new(expr, dtype, form)
            op = Op(eqn.primitive, name, dict(eqn.params), operands, vector.name)
            self.ops.append(op)
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


@dataclasses.dataclass(eq=False)
class Rule:
    """`fn(*inputs, *extra)` (inputs: `n_in` float32 leaves) traced once on float32
    scalars (`Unsupported` if it does not trace there), with its translations and
    the leaf shapes it was checked on."""

    fn: Callable[..., Any]
    n_in: int
    extra: tuple = ()
    closed: Any = dataclasses.field(init=False)
    programs: dict[str, Program] = dataclasses.field(default_factory=dict, init=False)
    checked: dict[tuple, bool] = dataclasses.field(default_factory=dict, init=False)
    maths: tuple = dataclasses.field(default=(), init=False)

    def __post_init__(self) -> None:
        # A rule that needs the leaf's shape, or a genuine error (which XLA's path
        # then raises where it belongs), does not trace here.
        self.closed = self.trace(())

    def trace(self, shape: tuple[int, ...]) -> Any:
        spec = jax.ShapeDtypeStruct(shape, jnp.float32)
        try:
            return jax.make_jaxpr(self.traced)(*([spec] * self.n_in))
        except Exception as error:
            raise Unsupported(f"the rule does not trace on {shape}: {error}") from error

    def traced(self, *xs: Any) -> Any:
        return self.fn(*xs, *self.extra)

    def check(self, shape: tuple[int, ...]) -> None:
        """`Unsupported` unless the rule, traced on leaves of `shape`, does the
        operations of its scalar trace on the same values: then XLA's code for the
        leaf computes what the loop computes, element by element. (A rule promised
        element-wise may still read `g.shape` or `g.size`.)"""
        if shape not in self.checked:
            if not self.checked:  # the scalar trace's, once
                self.checked[()] = True
                self.maths = _maths(self.closed)
            self.checked[shape] = _maths(self.trace(shape)) == self.maths
        if not self.checked[shape]:
            raise Unsupported(f"the rule is not element-wise on leaves of {shape}")

    def program(self, outputs: str) -> Program:
        """The translation for `outputs` (see `translate`), built (`load`)."""
        if outputs not in self.programs:
            program = translate(self.closed, self.n_in, outputs)
            load(program)
            self.programs[outputs] = program
        return self.programs[outputs]


def _maths(closed: Any) -> tuple:
    """What a traced rule computes, without its shapes: its equations with their
    primitives, parameters and operands (numbered in order, literals by value, the
    values it closes over by identity), broadcasts of scalars left out."""
    return _jaxpr_maths(closed.jaxpr, [_constant(c) for c in closed.consts])


def _jaxpr_maths(jaxpr: Any, consts: list[Any]) -> tuple:
    names: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
    names.update((v, ("input", i)) for i, v in enumerate(jaxpr.invars))

    def atom(v: Any) -> Any:
        if _compat.is_literal(v):
            value = np.asarray(v.val)
            return ("literal", value.dtype.str, value.tobytes())
        return names[v]

    maths: list[Any] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is _BROADCAST:
            names[eqn.outvars[0]] = atom(eqn.invars[0])
            continue
        body = _compat.call_body(eqn)
        if body is None:
            params = tuple(sorted((k, _param(v)) for k, v in eqn.params.items()))
        else:  # the body; the other parameters are shardings, names, policies
            inner, inner_consts = body
            params = _jaxpr_maths(inner, [_constant(c) for c in inner_consts])
        maths.append((eqn.primitive, params, tuple(map(atom, eqn.invars))))
        for v in eqn.outvars:
            names[v] = ("value", len(maths), str(v.aval.dtype))
    maths.append(tuple(map(atom, jaxpr.outvars)))
    return tuple(maths)


def _param(value: Any) -> Any:
    if hasattr(value, "eqns") or hasattr(value, "jaxpr"):
        return ("jaxpr", str(value))  # (shapes included: no broadcasting there)
    try:
        hash(value)
    except TypeError:
        return ("repr", repr(value))
    return value


def _constant(value: Any) -> Any:
    if is_tracer(value):
        return ("captured", id(value))
    value = np.asarray(value)
    return ("constant", value.dtype.str, value.shape, value.tobytes())


def translate(closed: Any, n_in: int, outputs: str) -> Program:
    """Translates a rule traced on `n_in` float32 scalars (`closed`, a closed jaxpr).

    `outputs`: `"update"` (the rule's outputs) or `"step"` (the first output
    replaced by `inputs[1] + output`, the applied parameter)."""
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
        item = _Scalar(v.val) if _compat.is_literal(v) else env[v]
        aval: Any = v.aval
        if np.dtype(aval.dtype) != _F32 or aval.shape != ():
            raise Unsupported(f"an output is {aval}")
        results.append(low.ref(item, _F32))
    if outputs == "step":
        # The apply `p + u` (in XLA's program the same fusion as `u`).
        term = results[0][0]
        applied = low.new(f"(x1 + {term})", _F32, ("add", "x1", term))
        results[0] = (applied.name, ("step", results[0][1]))

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
        # Where the CPU has AVX-512, the same loop 16 floats at a time: division
        # and square root take most of an Adam step's arithmetic, and both round
        # each element the same way at any vector width.
        f"{_AVX512} static void loop_512{loop}"
        f'__attribute__((target("avx2,fma"))) static void loop_fma{loop}'
        "#undef EQX_FMA\n"
        "#define EQX_FMA(a, b, c) ((a) * (b) + (c))\n"
        f"static void loop_plain{loop}"
        'extern "C" void eqxopt_kernel(const float* const* in, float* const* out,\n'
        "                              const float* scalars, int64_t n) {\n"
        '  static const bool fma = __builtin_cpu_supports("fma") &&\n'
        '                          __builtin_cpu_supports("avx2");\n'
        '  static const bool avx512 = fma && __builtin_cpu_supports("avx512f") &&\n'
        '                             __builtin_cpu_supports("avx512vl");\n'
        f"  if (avx512) loop_512{call}\n"
        f"  else if (fma) loop_fma{call} else loop_plain{call}\n}}\n"
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
    """`program`'s scalars as one float32 vector, made by selects over an iota: XLA
    fuses them with the maths of every scalar into one loop (each operand of a
    concatenate would be a kernel of its own to compile), and a select copies each
    value bit for bit."""
    if not program.scalars:
        return jnp.zeros((1,), jnp.float32)
    n = len(program.scalars)
    position = jax.lax.iota(jnp.int32, n)
    vector = jax.lax.broadcast(_as_f32(program.scalars[0]), (n,))
    for k, value in enumerate(program.scalars[1:], 1):
        vector = jax.lax.select(
            position == k, jax.lax.broadcast(_as_f32(value), (n,)), vector
        )
    return vector


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
        (values[op.out],) = _compat.bind(op.primitive, op.params, *args)
    outs = []
    for ref in program.outputs:
        if ref[0] == "step":
            outs.append(inputs[1] + get(ref[1]))
        else:
            outs.append(get(ref))
    return outs


def _wants_bool(op: Op, position: int) -> bool:
    return op.name in _BOOLEAN_ONLY or (op.name == "select_n" and position == 0)


@dataclasses.dataclass(eq=False)
class _Spec:
    """Static data of one kernel call (hashed by identity for `custom_jvp`)."""

    program: Program
    kernel_id: int
    n_leaves: int
    aliases: dict[int, int]


def _reference_leaves(spec: _Spec, scalars: jax.Array, *inputs: jax.Array) -> list:
    n_in = spec.program.n_in
    return [
        out
        for j in range(spec.n_leaves)
        for out in reference(spec.program, scalars, *inputs[j * n_in : (j + 1) * n_in])
    ]


def _result_shapes(scalars: Any, *inputs: Any, static: _Spec) -> list:
    # Every result of a leaf is float32 in the shape of the leaf's inputs.
    n_in, n_out = static.program.n_in, len(static.program.outputs)
    return [
        (inputs[j * n_in].shape, _F32)
        for j in range(static.n_leaves)
        for _ in range(n_out)
    ]


@functools.cache
def _elementwise() -> Any:
    """The kernels' custom call, or (in exported programs, which cannot carry it)
    the same rule as XLA operations."""
    return _ffi.ffi_or_xla(
        _build.ELEMENTWISE_TARGET,
        lambda scalars, *inputs, static: _reference_leaves(static, scalars, *inputs),
        _result_shapes,
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _call(spec: _Spec, scalars: jax.Array, *inputs: jax.Array) -> list:
    return _elementwise().bind(
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
    update fusions and optax's too). Making the call wait for a gradient of a leaf
    before `w` in tree order (for models whose tree follows the forward pass, one
    made from the `dx` that read `w`; `waits` picks them) lets XLA drop the copy.
    Nothing depends on the guess being right: where the order is not proven, XLA
    copies."""
    return jnp.reshape(x, (-1,))[:1].astype(jnp.float32)


def load(program: Program) -> int:
    """Builds (or finds) `program`'s kernel; `Unsupported` if that fails."""
    if program.kernel_id is None:
        try:
            program.kernel_id = _build.load_kernel(program.source)
        except Exception as error:  # a full disk, a compiler error: XLA's code
            _build.warn_once(error)
            raise Unsupported(f"the kernel could not be built: {error}") from error
        program.vector = scalar_vector(program)
    return program.kernel_id


def run_many(
    program: Program,
    leaves: Sequence[Sequence[jax.Array]],
    aliases: dict[int, int],
    after: Sequence[jax.Array] = (),
    sharded: tuple[Any, Sequence[Any], Sequence[Any]] | None = None,
) -> list[list]:
    """Runs `program` on one or more leaves in one custom call (one XLA thunk);
    `aliases` maps a leaf's input positions to the outputs that reuse their buffers.
    `after`: arrays the call is made to depend on (see `order_after`). `sharded`:
    `(mesh, specs, after_specs)` to run the call on each device's shards over
    `mesh` (`_shard`), each leaf (and each of `after`) with its spec. Returns each
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
    inputs = [x for leaf in leaves for x in leaf]

    def call(vector: jax.Array, waits: Sequence[jax.Array], *inputs: jax.Array):
        if waits:
            vector = jnp.concatenate([vector, *map(order_after, waits)])
        return _call(spec, vector, *inputs)

    if sharded is None:
        outs = call(program.vector, after, *inputs)
    else:
        mesh, specs, after_specs = sharded
        in_specs = (
            _shard.PartitionSpec(),
            list(after_specs),
            *(s for s in specs for _ in range(n_in)),
        )
        out_specs = [s for s in specs for _ in range(n_out)]
        outs = _shard.per_shard(call, mesh, in_specs, out_specs)(
            program.vector, list(after), *inputs
        )
    return [outs[j * n_out : (j + 1) * n_out] for j in range(len(leaves))]


# --------------------------------------------------------------------------------------
# What the engine (`map_leaves`) uses: one rule's kernels over the leaves of one trace.
# --------------------------------------------------------------------------------------

# Which gradients a leaf's in-place call waits for (`order_after`, `waits`): the
# last `_WAIT_FOR` (enough for the parallel branches of a layer: attention's query,
# key and value projections read the same input); in a step scheduled for the least
# memory (`small_waits`), the nearest `_WAIT_SMALL` small ones (below
# `_GROUP_BELOW` elements: biases, norms) among the last `_LOOK_BACK`.
_WAIT_FOR = 4
_WAIT_SMALL = 3
_LOOK_BACK = 8
_small_waits: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "small_waits", default=False
)
# Leaves smaller than this share custom calls, this many at a time.
_GROUP_BELOW = 1 << 16
_GROUP_SIZE = 32
_F32_LEAF = jnp.dtype(jnp.float32)


def runs_alone(size: int) -> bool:
    """Whether a leaf of `size` elements gets a custom call of its own."""
    return size >= _GROUP_BELOW


# One leaf's results (the update or the new parameter, and the moments).
Result = LeafResult


@contextlib.contextmanager
def small_waits() -> Iterator[None]:
    """While tracing a step that XLA will schedule for the least memory
    (`make_train_step`): calls wait for small gradients (`waits`)."""
    token = _small_waits.set(True)
    try:
        yield
    finally:
        _small_waits.reset(token)


def waits(grads: Sequence[Any]) -> list[list[Any]]:
    """Per leaf, the gradients its call waits for (`order_after`), among those of
    the leaves before it (not `None`): the last `_WAIT_FOR`; under `small_waits`,
    the nearest `_WAIT_SMALL` small ones within the last `_LOOK_BACK` (the last
    `_WAIT_FOR` where none is small).

    A call runs after the last gradient it waits for, and its leaf's gradient lives
    until then. XLA:CPU's default schedule makes every gradient as soon as it can,
    so a block's `up` weight gradient exists before anything that proves the read
    of `down`'s weight: two of the largest gradients are alive at once whatever
    the call waits for, and the last four keep the calls earliest there. Scheduled
    for the least memory, each gradient is made next to its call, and a call that
    waits only for small gradients (made from the same `dy` as the weight beside
    them: a bias with its layer's weight) runs before the next large gradient is
    made. Three, not one: of parallel branches that read the same input, a
    sibling's bias comes before the norm that their `dx` flows into, and waiting
    for the sibling alone would not order the read before the write (XLA then
    copies the weight)."""
    small_only = _small_waits.get()
    before: list[list[Any]] = []
    previous: list[Any] = []
    for g in grads:
        small = [x for x in previous if not runs_alone(x.size)] if small_only else []
        before.append(small[-_WAIT_SMALL:] if small else previous[-_WAIT_FOR:])
        if g is not None:
            previous = [*previous, g][-_LOOK_BACK:]
    return before


def checked_rule(
    rules: dict[tuple, Rule],
    fn: Callable[..., Any],
    n_moments: int,
    flag: tuple,
    p: Any,
) -> Rule:
    """The `Rule` of `fn` for `flag` (made once, kept in `rules`), checked for
    leaves shaped like `p` (`Unsupported` if it cannot run on them)."""
    if flag not in rules:
        rules[flag] = Rule(fn, 2 + n_moments, flag)
    rule = rules[flag]
    rule.check(tuple(p.shape))
    return rule


@dataclasses.dataclass
class Kernels:
    """Runs `rule(g, p, *moments[, flag]) -> (update, *moments)` as native kernels
    on the float32 leaves `add`ed, writing over their inputs (the leaves of a donated
    step): `finish()` gives each leaf's `Result`.

    Programs are translated once per flag value and output set. Leaves below
    `_GROUP_BELOW` elements share custom calls, `_GROUP_SIZE` at a time (each call
    is an XLA thunk with a few microseconds of overhead; more leaves per call would
    make XLA's alias analysis slow to compile); larger leaves get one call each, which
    splits them across threads. With `applying` (inside `step`) the kernel also
    applies the update, and gives the new parameter in its place. `grads`: every
    leaf's gradient as the program being traced computes it (`None`: no gradient,
    or one passed into the program), in order; each call waits for the gradients
    of the leaves before its own (`order_after`)."""

    rule: Callable[..., Any]
    n_moments: int
    applying: bool
    grads: Sequence[Any]
    locator: _shard.Locator = dataclasses.field(default_factory=_shard.Locator)
    rules: dict[tuple, Rule] = dataclasses.field(default_factory=dict, init=False)
    pending: dict[tuple, list[tuple[int, list[Any]]]] = dataclasses.field(
        default_factory=dict, init=False
    )
    # Per queued leaf, where its kernel runs (`_shard.Locator.where`).
    placed: dict[int, Any] = dataclasses.field(default_factory=dict, init=False)
    # Per leaf, the gradients its call waits for.
    before: list[list[Any]] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.before = waits(self.grads)

    def takes(self, g: Any, p: Any, old: Sequence[Any]) -> bool:
        return all(
            x is not None and x.dtype == _F32_LEAF and x.shape == p.shape
            for x in (g, p, *old)
        ) and (self.locator.where(g, p, old) is not None)

    def add(self, index: int, g: Any, p: Any, old: Sequence[Any], flag: tuple) -> None:
        """Queues leaf `index`; `Unsupported` (nothing queued) if the rule cannot
        run here on it. `flag`: the rule's extra arguments (`()` or one value)."""
        rule = checked_rule(self.rules, self.rule, self.n_moments, flag, p)
        # Translated and built now, so that an untranslatable rule (or a kernel that
        # cannot be built) falls back before any leaf is queued.
        rule.program("step" if self.applying else "update")
        small = not runs_alone(p.size)
        where = self.locator.where(g, p, old)
        mesh = where.mesh if isinstance(where, _shard.Sharded) else None
        self.placed[index] = where
        key = (flag, small, mesh)
        self.pending.setdefault(key, []).append((index, [g, p, *old]))

    def finish(self) -> dict[int, Result]:
        results: dict[int, Result] = {}
        for (flag, small, _), queued in self.pending.items():
            size = _GROUP_SIZE if small else 1
            for start in range(0, len(queued), size):
                chunk = queued[start : start + size]
                for (index, _), result in zip(chunk, self.run(chunk, flag)):
                    results[index] = result
        return results

    def waits(self, chunk: list[tuple[int, list[Any]]]) -> list[Any]:
        # A call of several (small) leaves waits for what each of them waits for.
        found = {id(g): g for index, _ in chunk for g in self.before[index]}
        return list(found.values())

    def run(self, chunk: list[tuple[int, list[Any]]], flag: tuple) -> list[Result]:
        rule = self.rules[flag]
        inputs = [leaf for _, leaf in chunk]
        after = self.waits(chunk)
        sharded = None
        first = self.placed[chunk[0][0]]
        if isinstance(first, _shard.Sharded):
            # Per shard: the waits are those whose shards the devices hold.
            specs = [self.placed[index].spec for index, _ in chunk]
            known = [(x, self.locator.known(x, first.mesh)) for x in after]
            after = [x for x, s in known if s is not None]
            sharded = (first.mesh, specs, [s for _, s in known if s is not None])
        # In place: each output reuses the buffer of the parameter or moment it
        # replaces.
        moments = {2 + k: 1 + k for k in range(self.n_moments)}
        if not self.applying:
            outs = run_many(rule.program("update"), inputs, moments, after, sharded)
            return [Result(u, None, list(m)) for u, *m in outs]
        stepped = run_many(
            rule.program("step"), inputs, {1: 0, **moments}, after, sharded
        )
        return [Result(None, new_p, list(m)) for new_p, *m in stepped]


def locator(placement: Any, inputs: Any) -> _shard.Locator:
    """Where the leaves of a trace live, for `Kernels`: `placement` is what the entry
    passed through the seam (`_shard.placement`), `inputs` its input tracers."""
    return _shard.Locator.of(placement, inputs)
