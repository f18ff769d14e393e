"""`make_train_step`: a whole compiled train step (loss, gradients, optimizer step)
written the fast way: model and state donated, `step(..., donate=True)` inside."""

import contextlib
import functools
import logging
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np

from ._core import _jax_api, _placement
from ._core._base import AbstractTransform, checked_transform
from ._core._checks import check_bool
from ._core._dispatch import Carried, raise_equinox_error
from ._core._packed import Packed
from ._native import _ffi, _fused


class TrainStep(eqx.Module):
    """A compiled train step made by `eqxopt.make_train_step`; call it as
    `step(model, state, *batch)`.

    **Fields:**

    - `loss_fn`: static: `loss_fn(model, *batch) -> loss` (or `(loss, aux)`).
    - `opt`: the optimizer it steps with when called without `opt=`.
    - `has_aux`: static: whether `loss_fn` returns `(loss, aux)`.
    """

    loss_fn: Callable[..., Any] = eqx.field(static=True)
    opt: AbstractTransform
    has_aux: bool = eqx.field(static=True)

    def __call__(
        self,
        model: Any,
        state: Any,
        *batch: Any,
        opt: AbstractTransform | None = None,
    ) -> tuple[Any, ...]:
        """One train step.

        **Arguments:**

        - `model`: the model (any pytree, or an `eqxopt.Packed`); donated: its arrays
          are overwritten, use the returned model instead.
        - `state`: the optimizer state; donated likewise.
        - `*batch`: the rest of `loss_fn`'s arguments (not donated). Arrays are
          traced; other values (Python numbers, strings) are static, as with
          `eqx.filter_jit`: a new value compiles again.
        - `opt`: an optimizer to use instead of `self.opt` for this call, such as
          the same optimizer with a new learning rate. One with the same structure
          (same class and fields, other values) reuses the compiled step.

        **Returns:** `(model, state, loss)`, or `(model, state, loss, aux)` with
        `has_aux=True`.
        """
        key, front, model, state = _split(self._front(opt, batch), model, state)
        with _quiet_callback_failures():
            try:
                out, carried = _program(front, model)(key, front, model, state)
            except Exception as error:
                raise_equinox_error(error)
                raise
        return _join(carried.value, out)

    def lower(
        self,
        model: Any,
        state: Any,
        *batch: Any,
        opt: AbstractTransform | None = None,
    ) -> Any:
        """The program `__call__` runs, lowered (`jax.jit`'s `lower`): `.compile()`
        it to read XLA's memory analysis (`.memory_analysis()`) or optimized HLO
        (`.as_text()`).

        **Arguments:** as `__call__`.
        """
        key, front, model, state = _split(self._front(opt, batch), model, state)
        return _program(front, model).lower(key, front, model, state)

    def _front(self, opt: AbstractTransform | None, batch: tuple) -> tuple:
        # The compiled program's first, undonated argument.
        opt = self.opt if opt is None else checked_transform("opt", opt)
        return (opt, self.loss_fn, self.has_aux, batch)


def make_train_step(
    loss_fn: Callable[..., Any], opt: AbstractTransform, *, has_aux: bool = False
) -> TrainStep:
    """A compiled train step, `step(model, state, *batch) -> (model, state, loss)`:
    the loss and its gradients with respect to the model's float arrays
    (`eqx.filter_value_and_grad`), then `opt.step(grads, state, model,
    donate=True)`, in one `jit` that donates the model and the state, so the
    optimizer writes them in place.

    The optimizer's arrays (learning rate, schedule values, ...) are arguments of
    the compiled program, never constants: `train_step(model, state, x, y,
    opt=new_opt)` with an optimizer of the same structure and other values, or a
    new `make_train_step(loss_fn, new_opt)`, reuses the compiled step. It compiles
    again for a new `loss_fn` object, another tree structure or other shapes.

    With the native CPU kernels, a model that is large against its batch (such as a
    transformer stepped on a few tokens) is compiled with XLA:CPU's scheduler for
    the least memory, which makes each large gradient just before its in-place
    update (the default schedule makes every gradient as early as it can, and
    holds several large ones at once); the results are the same.

    **Arguments:**

    - `loss_fn`: `loss_fn(model, *batch)` returning a scalar loss, or `(loss, aux)`
      with `has_aux=True`. Only the model is differentiated. With an
      `eqxopt.Packed` model, `loss_fn` gets the unpacked tree (`model.unpack()`),
      the gradients come back packed and the step runs on the packed buffers.
    - `opt`: the optimizer (any eqxopt transform; an optax one goes in as
      `eqxopt.from_optax(tx)`). Transforms that need more than the gradients get
      it from the step: the loss as `value=` (`PolyakSGD`, `Momo`, `MomoAdam`,
      `ReduceOnPlateau` in a `Chain`, ...) and the loss (or its gradient) on the
      batch as a function of the parameters for `LBFGS`'s `value_fn=`,
      `Sophia`'s `obj_fn=` and `SAM`'s `grad_fn=`.
    - `has_aux`: whether `loss_fn` returns `(loss, aux)`; `aux` is then returned
      as the step's last output.

    **Returns:** a `TrainStep`: call it as `step(model, state, *batch, opt=None)`.
    The model and state passed in are donated (their buffers are reused for the
    results): use the ones it returns. Each comes back placed as it went in (a
    ZeRO-1 state split over a mesh axis, the parameters replicated), and an
    `eqx.error_if` in `loss_fn` raises `eqx.EquinoxRuntimeError`, as from
    `eqx.filter_jit`.

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxopt

    model = eqx.nn.MLP(2, 1, width_size=16, depth=1, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (32, 2))
    y = x.sum(axis=1, keepdims=True)


    def loss_fn(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)


    opt = eqxopt.AdamW(1e-2)
    train_step = eqxopt.make_train_step(loss_fn, opt)
    state = opt.init(model)
    first = loss_fn(model, x, y)
    for _ in range(50):
        model, state, loss = train_step(model, state, x, y)  # use the returned ones
    assert loss < first
    # another learning rate, the same compiled step
    model, state, loss = train_step(model, state, x, y, opt=eqxopt.AdamW(1e-3))
    ```
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    checked_transform("opt", opt)
    return TrainStep(loss_fn, opt, check_bool("has_aux", has_aux))


# The dispatch, written out rather than `eqx.filter_jit`: a call flattens its
# arguments once and splits arrays (traced) from other leaves (static, part of the
# key); `eqx.filter_jit` also partitions, combines and re-flattens every tree, which
# for a model of many small leaves costs more host time than the compiled step.
_ARRAY = object()  # marks where an array leaf was, in a key

# What `eqx.is_array` takes for an array (checked inline: it runs for every leaf of
# every call).
_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)


class _Key(NamedTuple):
    """What selects a compiled program, besides the arrays' shapes and dtypes: the
    tree structures of (optimizer, loss_fn, has_aux, batch), model and state, their
    leaves that are not arrays, and where the model's and the state's leaves lie
    across devices (`_placement.signature`: `None` on one device)."""

    treedefs: tuple
    static: tuple
    placement: Any


def _split(front: tuple, model: Any, state: Any) -> tuple:
    treedefs, static, arrays = [], [], []
    for tree in (front, model, state):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        treedefs.append(treedef)
        static.append(_statics(leaves))
        arrays.append([x for x in leaves if isinstance(x, _ARRAY_TYPES)])
    # Read as `update`/`step` read it: the program places its outputs like these
    # inputs, which a trace cannot see on an Auto mesh.
    placement = _placement.signature(_placement.read(None, model, state, donated=False))
    return (_Key(tuple(treedefs), tuple(static), placement), *arrays)


def _statics(leaves: list) -> tuple:
    return tuple(_ARRAY if isinstance(x, _ARRAY_TYPES) else x for x in leaves)


def _merge(treedef: Any, static: tuple, arrays: Any) -> Any:
    arrays = iter(arrays)
    return jax.tree_util.tree_unflatten(
        treedef, [next(arrays) if x is _ARRAY else x for x in static]
    )


def _join(outputs: tuple, arrays: list) -> tuple:
    treedef, static = outputs
    return tuple(_merge(treedef, static, arrays))


def _loss_of(loss_fn: Callable[..., Any], model: Any) -> Callable[..., Any]:
    if isinstance(model, Packed):
        return lambda packed, *batch: loss_fn(packed.unpack(), *batch)
    return loss_fn


def _keywords(
    opt: AbstractTransform, loss: Any, loss_at: Callable[[Any], Any]
) -> dict[str, Any]:
    """What the step passes to `opt.step` besides the gradients: each keyword that
    some transform in `opt` takes (`takes_keyword`) and that the step has in hand,
    the loss (`value=`) or the loss on this batch as a function of the parameters
    (`loss_at`, for a linesearch or a second gradient). The functions take and
    ignore further arguments: a transform that takes every keyword (`LBFGS`
    passes its data keywords on to `value_fn`) may hand them the others."""

    def loss_fn(params: Any, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        return loss_at(params)

    def grad_fn(params: Any, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        return eqx.filter_grad(loss_at)(params)

    supplied = {
        "value": lambda: loss,  # Momo, PolyakSGD, ReduceOnPlateau, LBFGS, ...
        "value_fn": lambda: loss_fn,  # LBFGS's linesearch
        "obj_fn": lambda: loss_fn,  # Sophia's Hessian estimate
        "grad_fn": lambda: grad_fn,  # SAM's gradient at the perturbed parameters
    }
    return {k: make() for k, make in supplied.items() if opt.takes_keyword(k)}


def _step(
    key: _Key, front: list, model: list, state: list, *, low_memory: bool
) -> tuple[list, Carried]:
    (front_def, model_def, state_def), (front_static, model_static, state_static) = (
        key.treedefs,
        key.static,
    )
    opt, loss_fn, has_aux, batch = _merge(front_def, front_static, front)
    model = _merge(model_def, model_static, model)
    state = _merge(state_def, state_static, state)
    loss_of = _loss_of(loss_fn, model)
    value, grads = eqx.filter_value_and_grad(loss_of, has_aux=has_aux)(model, *batch)
    loss = value[0] if has_aux else value

    def loss_at(params: Any) -> Any:
        out = loss_of(params, *batch)
        return out[0] if has_aux else out

    extra = _keywords(opt, loss, loss_at)
    with _fused.small_waits() if low_memory else contextlib.nullcontext():
        new_model, new_state = opt.step(grads, state, model, donate=True, **extra)
    # Each output where its input was (ZeRO-1 on an Auto mesh: the parameters stay
    # replicated), as `update`/`step` place theirs.
    on_model, on_state = key.placement or (None, None)
    new_model = _placement.keep(new_model, model, on_model)
    new_state = _placement.keep(new_state, state, on_state)
    outputs = (
        (new_model, new_state, *value) if has_aux else (new_model, new_state, value)
    )
    leaves, treedef = jax.tree_util.tree_flatten(outputs)
    arrays = [x for x in leaves if isinstance(x, _ARRAY_TYPES)]
    # The rest leave with this trace's program, not in a table by key: a program
    # traced again for another batch shape has its own (`Carried`).
    return arrays, Carried((treedef, _statics(leaves)))


@contextlib.contextmanager
def _quiet_callback_failures() -> Any:
    # JAX logs a failed host callback with its traceback before the call raises;
    # for an `eqx.error_if` the call raises `eqx.EquinoxRuntimeError` with the
    # message instead (`raise_equinox_error`), so the log is dropped, as
    # `eqx.filter_jit` drops it.
    _callback_logger.addFilter(_drop_callback_failure)
    try:
        yield
    finally:
        _callback_logger.removeFilter(_drop_callback_failure)


_callback_logger = logging.getLogger("jax._src.callback")


def _drop_callback_failure(record: logging.LogRecord) -> bool:
    return record.getMessage() != "jax.pure_callback failed"


# One compiled program per key and shapes; the model's and the state's arrays are
# donated, the optimizer's and the batch's are not.
_compiled = jax.jit(
    functools.partial(_step, low_memory=False), static_argnums=0, donate_argnums=(2, 3)
)


@functools.cache
def _compiled_low_memory() -> Any:
    # The same program, scheduled by XLA:CPU for the least memory (and its calls
    # waiting for small gradients: `_fused.waits`).
    return jax.jit(
        functools.partial(_step, low_memory=True),
        static_argnums=0,
        donate_argnums=(2, 3),
        compiler_options=_jax_api.low_memory_schedule(),
    )


# Model elements per element of the other inputs (the batch, mostly) from which the
# large gradients, not the activations, set a step's peak memory.
_GRADIENTS_DOMINATE = 10_000


def _program(front: list, model: list) -> Any:
    """The compiled step for these arrays: scheduled for the least memory where the
    native kernels run, some leaf gets a kernel call of its own, and the model is
    large against the batch (`_GRADIENTS_DOMINATE`).

    Each such call writes its weight in place, so the weight's buffer stays taken
    until the call, and the default schedule (the most concurrency: every gradient
    as soon as it can be made) holds two of the largest gradients at once, where
    optax's update reuses a weight's buffer for its gradient. The low-memory
    schedule makes each large gradient next to its call. It also costs some of the
    concurrency, which a step of much activation work (a CNN on a batch of images,
    a transformer on many tokens) loses more of than it gains in memory; a model
    of small leaves gains nothing (its calls take many leaves each)."""
    sizes = list(map(_SIZE, model))  # per call: the cheapest spelling
    if (
        sizes
        and _fused.runs_alone(max(sizes))
        and sum(sizes) >= _GRADIENTS_DOMINATE * sum(map(_SIZE, front))
        and _ffi.usable()
    ):
        return _compiled_low_memory()
    return _compiled


_SIZE = operator.attrgetter("size")
