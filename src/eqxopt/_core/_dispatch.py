"""A cheaper way into compiled code than `eqx.filter_jit`, for `update` and `step`.

Two paths, both keyed so that new hyperparameter *values* (array leaves) reuse the
compiled function, and neither waits for the result:

- The direct path, for the common case where every leaf is an array: the first
  argument (the optimizer, usually the same object call after call) is flattened
  once and remembered by identity, its scalar leaves stacked into one array per
  dtype (fewer arrays to cross into the compiled code); the other arguments go to a
  cached `jax.jit` as they are, so JAX's C++ code flattens them and unflattens the
  outputs. A leaf that
  is not an array (a function, a string) or may be a Python number makes the direct
  path step aside, and those argument types then always take the general path.
- The general path, as `eqx.filter_jit` treats arguments: the arguments are
  flattened in Python; array leaves become the traced inputs and every other leaf
  (activation functions, Python scalars, ...) becomes part of the cache key.

Steps with many leaves (768+ array leaves, nothing donated) can go through the split
path below (opt-in: `use_split_path(True)`): the traced step is cut into per-leaf
pieces run in chunks by reused executables, because XLA's compile time grows faster
than the program size.

Inside someone else's trace the direct path simply nests in the outer `jit` (the
general path calls the function), and the enclosing `jit` compiles it.
"""

import itertools
import struct
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.core
import jax.extend.core as _jc
import numpy as np

_DYNAMIC = object()  # marks the position of an array leaf in a cache key
_ARRAY_TYPE = type(jax.numpy.zeros(()))  # jaxlib's concrete array class
_ALL_ARRAYS = frozenset({_ARRAY_TYPE})


class _Static:
    """A non-array leaf in a cache key: equal only to a leaf of the same type and
    the same value, bit for bit (`True`, `1`, `1.0` and an `IntEnum` member with
    value 1 compare equal in Python, as do `0.0` and `-0.0`, and NaN equals
    nothing); an unhashable leaf is equal only to itself. `obj` is the leaf."""

    __slots__ = ("key", "obj")

    def __init__(self, obj: Any):
        self.obj = obj
        try:
            hash(obj)
        except TypeError:
            self.key: Hashable = ("id", id(obj))  # `obj` is kept alive by `self`
            return
        if isinstance(obj, float):
            self.key = (type(obj), struct.pack("<d", obj))
        elif isinstance(obj, complex):
            self.key = (type(obj), struct.pack("<dd", obj.real, obj.imag))
        else:
            self.key = (type(obj), obj)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and other.key == self.key


def _is_dynamic(leaf: Any) -> bool:
    # NumPy scalars are arrays, as for `eqx.is_array` (and the direct path).
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


class _Compiled:
    """One jitted program for one tree structure and one set of static leaves.

    Static leaves stay out of the program: where an output is one of the input
    leaves (a parameter passed through), each call returns the caller's own object
    at that place, never the one seen when tracing, which is only equal to it."""

    def __init__(
        self,
        fn: Callable,
        treedef: Any,
        statics: list[Any] | None,
        donate: tuple[int, ...],
    ):
        self.out_def: Any = None
        # Per output leaf: `_DYNAMIC`, the index of the input leaf it is, or
        # `(obj,)` for an object made by `fn`. `None`: every output is an array.
        self.out_statics: list[Any] | None = None

        def flat_fn(*groups):
            dynamic = [x for group in groups for x in group]
            if statics is None:
                leaves = dynamic
            else:
                it = iter(dynamic)
                leaves = [next(it) if s is _DYNAMIC else s for s in statics]
            out = fn(*jax.tree.unflatten(treedef, leaves))
            out_leaves, self.out_def = jax.tree.flatten(out)
            if all(isinstance(x, jax.Array) for x in out_leaves):
                self.out_statics = None
                return out_leaves
            position: dict[int, int] = {}
            for i, s in enumerate(statics or ()):
                if s is not _DYNAMIC:
                    position.setdefault(id(s), i)
            self.out_statics = [
                _DYNAMIC if isinstance(x, jax.Array) else position.get(id(x), (x,))
                for x in out_leaves
            ]
            return [x for x in out_leaves if isinstance(x, jax.Array)]

        self.jitted = jax.jit(flat_fn, donate_argnums=donate)

    def __call__(self, groups: list[list[Any]], leaves: list[Any]) -> Any:
        out = self.jitted(*groups)
        if self.out_statics is None:
            return self.out_def.unflatten(out)
        it = iter(out)
        return self.out_def.unflatten(
            [
                next(it) if s is _DYNAMIC else leaves[s] if type(s) is int else s[0]
                for s in self.out_statics
            ]
        )


class _Entry:
    """Everything cached for one tree structure of the arguments."""

    __slots__ = ("all_arrays", "bounds", "by_statics", "treedef")

    def __init__(self, first_def: Any, rest_def: Any):
        sizes = [first_def.num_leaves]
        sizes += [child.num_leaves for child in rest_def.children()]
        starts = np.cumsum([0, *sizes]).tolist()
        self.bounds = [slice(a, b) for a, b in itertools.pairwise(starts)]
        self.treedef = jax.tree.structure(
            (
                first_def.unflatten([0] * first_def.num_leaves),
                *rest_def.unflatten([0] * rest_def.num_leaves),
            )
        )
        self.all_arrays: _Compiled | None = None
        self.by_statics: dict[Hashable, _Compiled] = {}


_cache: "weakref.WeakKeyDictionary[Callable, dict[Hashable, _Entry]]" = (
    weakref.WeakKeyDictionary()
)


class _First:
    """What is remembered of the first argument (the optimizer, usually the very
    same immutable object call after call), by identity: its leaves and treedef;
    for the direct path, which of its leaves are packed and how (`layout`), the
    packed leaves themselves once made, and the `_Direct` (or `None`: the general
    path) for each kind of call made with it."""

    __slots__ = ("direct", "layout", "leaves", "obj", "pack", "packed", "treedef")

    def __init__(self, obj: Any, pack: bool = True):
        self.obj, self.pack = obj, pack
        self.leaves, self.treedef = jax.tree.flatten(obj)
        self.layout = _layout(self.leaves, pack)
        self.packed: Any = None
        self.direct: dict[Hashable, _Direct | None] = {}


# --- Packed hyperparameters -------------------------------------------------------
#
# Every array crossing the `jax.jit` boundary costs the direct call about half a
# microsecond (AdamW has six scalar hyperparameters, more with a schedule). So the
# optimizer's scalar leaves are stacked into one array per dtype, once per
# optimizer object, and indexed back inside the compiled function: the same values,
# dtypes and shapes, and a new optimizer object with other values reuses the
# compiled step (the stacked arrays have the same shapes). Only leaves whose
# stacking changes nothing are packed: 0-d, not weak-typed (a stacked array would
# not be weak), not committed to a device or sharding, and two or more of a dtype.


def _layout(leaves: list[Any], pack: bool) -> tuple[Any, ...] | None:
    """Per leaf of the first argument, the dtype it is packed with (`None`: passed
    as it is); `None` when some leaf is not a concrete array (no direct path)."""
    if not set(map(type, leaves)) <= _ALL_ARRAYS:
        return None
    if not pack:
        return (None,) * len(leaves)
    codes = [
        None if a.shape or a.weak_type or x.committed else a.dtype
        for x in leaves
        for a in (x.aval,)
    ]
    if len(set(codes)) == len(codes):  # no dtype twice: nothing to pack
        return (None,) * len(codes)
    lone = {c for c in codes if codes.count(c) == 1}
    return tuple(None if c in lone else c for c in codes)


@jax.jit
def _stack(groups: list[list[Any]]) -> list[Any]:
    return [jax.numpy.stack(group) for group in groups]


def _pack(record: _First) -> tuple[list[Any], list[Any]]:
    """The first argument's leaves as the direct path passes them: the packed
    arrays (one per dtype, in order of first appearance) and the other leaves."""
    if record.packed is not None:
        return record.packed
    assert record.layout is not None
    groups: dict[Any, list[Any]] = {}
    others = []
    for x, code in zip(record.leaves, record.layout):
        if code is None:
            others.append(x)
        else:
            groups.setdefault(code, []).append(x)
    packed = (_stack(list(groups.values())) if groups else [], others)
    if not any(isinstance(x, jax.core.Tracer) for x in packed[0]):
        record.packed = packed  # (inside someone's trace it is made per call)
    return packed


def _unpacker(layout: tuple[Any, ...]) -> Callable[[Any], list[Any]]:
    """The inverse of `_pack` for one layout, for use inside the trace."""
    groups = list(dict.fromkeys(c for c in layout if c is not None))
    counters = dict.fromkeys(groups, 0)
    where: list[tuple[int, int] | None] = []
    for code in layout:
        if code is None:
            where.append(None)
        else:
            where.append((groups.index(code), counters[code]))
            counters[code] += 1

    def unpack(first: Any) -> list[Any]:
        packs, others = first
        it = iter(others)
        return [next(it) if w is None else packs[w[0]][w[1]] for w in where]

    return unpack


_last_first: list[_First] = [_First(None)]


def _first(first: Any, pack: bool = True) -> _First:
    record = _last_first[0]
    if record.obj is not first or record.pack is not pack:
        record = _last_first[0] = _First(first, pack)
    return record


class _NotPlain(Exception):
    """Raised while tracing the direct path: a leaf may have been a Python number
    (a weak-typed scalar; a weak-typed 0-d array lands here too, harmlessly) or,
    where the caller says Python bools may be (`bools`), a Python bool (traced as
    a 0-d bool array, which lands here too)."""


class _Direct:
    """`jax.jit` over `(first, *rest)`, the rest passed as pytrees.

    JAX flattens the pytrees in C++ and unflattens the outputs, so nothing is done
    per leaf in Python. This is only right when every leaf of the rest is an array:
    a Python number would be traced (as a weak-typed scalar) where `eqx.filter_jit`
    keeps it static, and a function or string is rejected by `jax.jit` with a
    `TypeError`; a Python bool would come back as an array. These send the call to
    the general path, which is then remembered for those argument types. `first` is
    the first argument's leaves as `_pack` makes them; `run` takes them unpacked
    (for the split path).
    """

    def __init__(
        self,
        fn: Callable,
        first_def: Any,
        layout: tuple[Any, ...],
        donate: tuple[int, ...],
        bools: tuple[int, ...] = (),
        kinds: tuple[Any, ...] = (),
    ):
        self.kinds = kinds  # its key in `_direct`

        def run(first_leaves, *rest):
            for i, arg in enumerate(rest, 1):
                for leaf in jax.tree.leaves(arg):
                    if jax.numpy.ndim(leaf) == 0 and (
                        getattr(leaf, "weak_type", False)
                        or (i in bools and leaf.dtype == bool)
                    ):
                        raise _NotPlain
            return fn(first_def.unflatten(first_leaves), *rest)

        unpack = _unpacker(layout)

        def run_packed(first, *rest):
            return run(unpack(first), *rest)

        self.run = run
        self.jitted = jax.jit(run_packed, donate_argnums=donate)


# How `jax.jit` words its refusal of a leaf that is not an array (new and old JAX).
_NOT_AN_ARRAY = ("as an abstract array", "is not a valid JAX type")
_direct: dict[tuple[Any, ...], _Direct] = {}
_general: set[tuple[Any, ...]] = set()  # argument kinds the direct path cannot take


# --- The split path: many leaves -------------------------------------------------
#
# XLA's CPU compiler takes time superlinear in the number of separate buffers (AdamW
# on 2000 leaves of 1000 floats: 11-30 s), while it compiles identical per-leaf
# kernels only once. So when a step has at least `_SPLIT_MIN_LEAVES` leaves (and
# nothing is donated: the pieces would not reuse the buffers), its traced program
# is cut into independent pieces: a piece is everything that flows into and out of
# one group of array inputs (typically one parameter with its gradient and
# moments); computations on scalar inputs only (learning rate, bias corrections,
# the step count) are repeated inside each piece that needs them. Pieces
# whose programs are the same are run `_SPLIT_CHUNK` at a time by one compiled
# executable, reused for every chunk. Nothing is rewritten: the pieces run the
# traced operations themselves, so the numbers are the same. A step whose maths mixes
# leaves (a global norm) forms one piece and takes the direct path instead.

_SPLIT_MIN_LEAVES = 768  # array leaves in grads + params + state (~256 parameters)
_SPLIT_CHUNK = 200


class _Split:
    """A traced step cut into a scalar program and chunks of identical pieces."""

    def __init__(self, closed: Any, out_tree: Any, chunk: int):
        jaxpr = closed.jaxpr
        if jaxpr.effects:
            raise _CannotSplit
        scalar = set(jaxpr.constvars)
        scalar.update(v for v in jaxpr.invars if v.aval.shape == ())
        parent: dict[Any, Any] = {}

        def find(x: Any) -> Any:
            root = x
            while parent.get(root, root) is not root:
                root = parent[root]
            while parent.get(x, x) is not root:
                parent[x], x = root, parent[x]
            return root

        piece_of: list[Any] = []
        producer: dict[Any, int] = {}
        for i, eqn in enumerate(jaxpr.eqns):
            ins = [v for v in eqn.invars if isinstance(v, _jc.Var)]
            outs = [v for v in eqn.outvars if not isinstance(v, _jc.DropVar)]
            if all(v in scalar for v in ins):
                scalar.update(outs)
                producer.update((v, i) for v in outs)
                piece_of.append(None)
                continue
            nodes = [v for v in ins if v not in scalar] + outs
            root = find(nodes[0])
            for v in nodes[1:]:
                other = find(v)
                if other is not root:
                    parent[other] = root
            piece_of.append(root)
        pieces: dict[Any, list[int]] = {}
        for i, root in enumerate(piece_of):
            if root is not None:
                pieces.setdefault(find(root), []).append(i)
        if len(pieces) < 2:
            raise _CannotSplit

        def closure(needed: list[Any]) -> set[int]:
            found: set[int] = set()
            stack = [v for v in needed if v in producer]
            while stack:
                i = producer[stack.pop()]
                if i not in found:
                    found.add(i)
                    stack.extend(
                        v
                        for v in jaxpr.eqns[i].invars
                        if isinstance(v, _jc.Var) and v in producer
                    )
            return found

        sources = set(jaxpr.constvars) | set(jaxpr.invars)
        wanted = {v for v in jaxpr.outvars if isinstance(v, _jc.Var)}
        groups: dict[str, list[tuple[Any, list[Any], list[Any]]]] = {}
        for idx in pieces.values():
            used = [
                v for i in idx for v in jaxpr.eqns[i].invars if isinstance(v, _jc.Var)
            ]
            idx = sorted(set(idx) | closure([v for v in used if v in scalar]))
            eqns = [jaxpr.eqns[i] for i in idx]
            ins: list[Any] = []
            produced: set[Any] = set()
            for eqn in eqns:
                for v in eqn.invars:
                    if isinstance(v, _jc.Var) and v not in produced and v not in ins:
                        ins.append(v)
                produced.update(eqn.outvars)
            if not all(v in sources for v in ins):
                raise _CannotSplit
            outs = list(
                dict.fromkeys(
                    v
                    for eqn in eqns
                    for v in eqn.outvars
                    if v in wanted and v not in scalar
                )
            )
            sub = _jaxpr(ins, outs, eqns)
            groups.setdefault(str(sub), []).append((sub, ins, outs))
        # Each chunk passes the scalar inputs its pieces share once (so XLA computes
        # the bias corrections once per chunk), the array inputs piece by piece.
        self.chunks: list[tuple[Callable, list[Any], list[list[Any]], list[list[Any]]]]
        self.chunks = []
        for signature, members in groups.items():
            fn = _jc.jaxpr_as_fun(_jc.ClosedJaxpr(members[0][0], []))
            for start in range(0, len(members), chunk):
                part = members[start : start + chunk]
                shared = list(
                    dict.fromkeys(v for _, ins, _ in part for v in ins if v in scalar)
                )
                position = {v: j for j, v in enumerate(shared)}
                pattern = tuple(
                    tuple(position.get(v, -1) for v in ins) for _, ins, _ in part
                )
                own = [[v for v in ins if v not in position] for _, ins, _ in part]
                key = (signature, pattern)  # the maths, and what is shared
                self.chunks.append(
                    (_chunk_runner(key, fn, pattern), shared, own, [m[2] for m in part])
                )
        scalar_outs = list(dict.fromkeys(v for v in wanted if v in producer))
        eqns = [jaxpr.eqns[i] for i in sorted(closure(scalar_outs))]
        scalar_ins: list[Any] = []
        for eqn in eqns:
            for v in eqn.invars:
                if isinstance(v, _jc.Var) and v in sources and v not in scalar_ins:
                    scalar_ins.append(v)
        self.scalar_ins, self.scalar_outs = scalar_ins, scalar_outs
        self.scalar_fn = jax.jit(
            _jc.jaxpr_as_fun(_jc.ClosedJaxpr(_jaxpr(scalar_ins, scalar_outs, eqns), []))
        )
        self.invars, self.outvars = jaxpr.invars, jaxpr.outvars
        self.consts = list(zip(jaxpr.constvars, closed.consts))
        self.out_tree = out_tree

    def __call__(self, leaves: list[Any]) -> Any:
        env = dict(zip(self.invars, leaves))
        env.update(self.consts)
        for run, shared, own, outs in self.chunks:
            results = run(
                [env[v] for v in shared], [[env[v] for v in piece] for piece in own]
            )
            for names, values in zip(outs, results):
                env.update(zip(names, values))
        if self.scalar_outs:
            env.update(
                zip(
                    self.scalar_outs, self.scalar_fn(*[env[v] for v in self.scalar_ins])
                )
            )
        out = [v.val if isinstance(v, _jc.Literal) else env[v] for v in self.outvars]
        return self.out_tree.unflatten(out)


class _CannotSplit(Exception):
    pass


def _jaxpr(ins: list[Any], outs: list[Any], eqns: list[Any]) -> Any:
    with warnings.catch_warnings():  # no DebugInfo for these internal pieces
        warnings.simplefilter("ignore", DeprecationWarning)
        return _jc.Jaxpr([], ins, outs, eqns)


_runners: dict[Hashable, Callable] = {}


def _chunk_runner(key: Hashable, fn: Callable, pattern: tuple) -> Callable:
    """One compiled program running pieces with the same maths; `pattern` says, per
    piece and input, which shared scalar it is (or -1: the piece's own array)."""
    runner = _runners.get(key)
    if runner is None:

        def run(shared, own):
            results = []
            for where, arrays in zip(pattern, own):
                it = iter(arrays)
                args = [shared[j] if j >= 0 else next(it) for j in where]
                results.append(fn(*args))
            return results

        runner = _runners[key] = jax.jit(run)
    return runner


_splits: dict[Hashable, _Split | None] = {}
_small: set[tuple[Any, ...]] = set()  # argument kinds seen with few leaves


def _try_split(
    kinds: tuple[Any, ...], direct: "_Direct", first_leaves: list[Any], args: tuple
) -> Any:
    """The result through the split path, or `None` where it does not apply."""
    rest_leaves, rest_def = jax.tree.flatten(args[1:])
    if len(rest_leaves) < _SPLIT_MIN_LEAVES:
        _small.add(kinds)
        return None
    if not set(map(type, rest_leaves)) <= _ALL_ARRAYS:
        return None
    key = (kinds, rest_def)
    if key in _splits:
        split = _splits[key]
    else:
        try:
            closed, shapes = jax.make_jaxpr(direct.run, return_shape=True)(
                first_leaves, *args[1:]
            )
            split = _Split(closed, jax.tree.structure(shapes), _SPLIT_CHUNK)
        except _CannotSplit:
            split = None
        _splits[key] = split
    if split is None:
        return None
    return split(first_leaves + rest_leaves)


_use_direct = [True]
_use_split = [False]


def use_split_path(enabled: bool) -> None:
    """Turns the split path for many-leaf steps on or off (the default).

    It is off by default because it trades step time for compile time: on AdamW
    with 2000 leaves of 1000 floats it cut XLA's backend compile from 11.8 s to
    0.9 s but made each step about 20% slower (the chunks are dispatched from
    Python), which a run of more than a few hundred steps pays back. Exported as
    `eqxopt.set_split_compilation`.

    **Arguments:**

    - `enabled`: whether to split (truthy or falsy).
    """
    _use_split[0] = bool(enabled)


set_split_compilation = use_split_path  # the public name


def clear_caches() -> None:
    """Forgets every compiled step (the next call of each traces again): for
    switches that change what a trace produces, such as the native kernels."""
    _cache.clear()
    _direct.clear()
    _general.clear()
    _runners.clear()
    _splits.clear()
    _small.clear()
    _last_first[0] = _First(None)


def use_direct_path(enabled: bool) -> None:
    """Turns the direct path on (the default) or off, so that every call takes the
    general path (for tests comparing the two, and for debugging)."""
    _use_direct[0] = bool(enabled)


def call(
    fn: Callable,
    args: tuple[Any, ...],
    donate: tuple[int, ...] = (),
    pack: bool = True,
    bools: tuple[int, ...] = (),
) -> Any:
    """`fn(*args)`, compiled. `donate` lists positions of `args` whose array buffers
    XLA may reuse for the outputs (the caller must not use them afterwards). `pack`
    (for a first argument that is usually the same object call after call, such as
    the optimizer) passes its scalar leaves packed; a first argument that is new
    each call (a state) would pay for the packing every time. `bools` lists
    positions of `args` that may hold Python bools (params, keyword arguments: not
    a state): `jax.jit` would make them arrays, so a 0-d bool leaf there takes the
    general path, which keeps every non-array leaf as the caller's very object."""
    record = _first(args[0], pack)
    if record.layout is not None and _use_direct[0]:
        key = (fn, donate, *map(type, args))
        try:
            direct = record.direct[key]
        except KeyError:
            direct = record.direct[key] = _find_direct(fn, record, donate, bools, args)
        if direct is not None:
            try:
                if _use_split[0] and not donate and direct.kinds not in _small:
                    out = _try_split(direct.kinds, direct, record.leaves, args)
                    if out is not None:
                        return out
                return direct.jitted(_pack(record), *args[1:])
            except _NotPlain:
                pass
            except TypeError as error:
                if not any(m in str(error) for m in _NOT_AN_ARRAY):
                    raise
            _general.add(direct.kinds)
            record.direct[key] = None
    return _general_call(fn, args, donate, record)


def _find_direct(
    fn: Callable,
    record: _First,
    donate: tuple[int, ...],
    bools: tuple[int, ...],
    args: tuple[Any, ...],
) -> "_Direct | None":
    assert record.layout is not None
    types = tuple(map(type, args))
    kinds = (fn, record.treedef, record.layout, donate, bools, types)
    if kinds in _general:
        return None
    direct = _direct.get(kinds)
    if direct is None:
        direct = _Direct(fn, record.treedef, record.layout, donate, bools, kinds)
        _direct[kinds] = direct
    return direct


def _general_call(
    fn: Callable, args: tuple[Any, ...], donate: tuple[int, ...], record: _First
) -> Any:
    first_leaves, first_def = record.leaves, record.treedef
    rest_leaves, rest_def = jax.tree.flatten(args[1:])
    leaves = first_leaves + rest_leaves
    per_fn = _cache.get(fn)
    if per_fn is None:
        per_fn = _cache.setdefault(fn, {})
    entry = per_fn.get((first_def, rest_def, donate))
    if entry is None:
        entry = per_fn[(first_def, rest_def, donate)] = _Entry(first_def, rest_def)
    if set(map(type, leaves)) <= _ALL_ARRAYS:
        compiled = entry.all_arrays
        if compiled is None:
            compiled = entry.all_arrays = _Compiled(fn, entry.treedef, None, donate)
        return compiled([leaves[b] for b in entry.bounds], leaves)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return fn(*args)  # inside a trace: the outer jit compiles this
    statics = [_DYNAMIC if _is_dynamic(x) else x for x in leaves]
    # Each static leaf by type and value, and which earlier leaf it is the very
    # object of, so that an output leaf maps back to one input place.
    first_place: dict[int, int] = {}
    key = tuple(
        _DYNAMIC if s is _DYNAMIC else (_Static(s), first_place.setdefault(id(s), i))
        for i, s in enumerate(statics)
    )
    compiled = entry.by_statics.get(key)
    if compiled is None:
        compiled = entry.by_statics[key] = _Compiled(fn, entry.treedef, statics, donate)
    groups = [[x for x in leaves[b] if _is_dynamic(x)] for b in entry.bounds]
    return compiled(groups, leaves)


def lower(
    fn: Callable,
    args: tuple[Any, ...],
    donate: tuple[int, ...] = (),
    pack: bool = True,
) -> Any:
    """The `jax.stages.Lowered` program that `call(fn, args, donate, pack)` runs when
    every leaf is an array (for benchmarks: `.compile()` it, read
    `memory_analysis()`)."""
    record = _First(args[0], pack)
    assert record.layout is not None, "some leaf of the first argument is no array"
    direct = _Direct(fn, record.treedef, record.layout, donate)
    return direct.jitted.lower(_pack(record), *args[1:])


def cache_size(fn: Callable) -> int:
    """How many compiled programs `call` holds for `fn` (for tests and benchmarks)."""
    total = sum(
        d.jitted._cache_size()  # pyright: ignore[reportAttributeAccessIssue]
        for k, d in _direct.items()
        if k[0] is fn
    )
    for entry in _cache.get(fn, {}).values():
        compiled = [entry.all_arrays, *entry.by_statics.values()]
        total += sum(
            c.jitted._cache_size()  # pyright: ignore[reportAttributeAccessIssue]
            for c in compiled
            if c is not None
        )
    return total
