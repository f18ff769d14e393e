"""QK-clip: rescaling the query and key projections of the attention heads whose
largest logit passed a threshold (`QKClip`), and Kimi K2's `MuonClip`, Muon with
the clip."""

import math
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._core._base import (
    AbstractTransform,
    Grads,
    Params,
    State,
    Supplied,
    Updates,
    supplies,
)
from .._core._fields import ScalarOrSchedule, hyper
from .._optimizers._preconditioned._muon import Muon
from ._wrapper import AbstractSingleWrapper, inner_field

_MHA = eqx.nn.MultiheadAttention


def max_attention_logits(
    attention: eqx.nn.MultiheadAttention,
    query: Float[Array, "q_seq q_size"],
    key_: Float[Array, "kv_seq k_size"],
    mask: Bool[Array, "q_seq kv_seq"] | Bool[Array, "heads q_seq kv_seq"] | None = None,
) -> Float[Array, " heads"]:
    r"""The largest attention logit of each head of an `eqx.nn.MultiheadAttention`
    for one sequence, as the layer computes its logits (before the softmax):

    $$
    S^h_{\max} = \max_{i, j} \frac{(W_q^h x_i + b_q^h) \cdot (W_k^h y_j + b_k^h)}
    {\sqrt{d_{qk}}}
    $$

    over the pairs `(i, j)` that `mask` keeps. Return it (its maximum over a batch)
    from the loss function for `QKClip` and `MuonClip`.

    **Arguments:**

    - `attention`: the attention layer.
    - `query`, `key_`: its inputs for one sequence, as passed to the layer.
    - `mask`: the layer's mask, if it is called with one.

    **Returns:** shape `(num_heads,)`.
    """
    if not isinstance(attention, _MHA):
        raise TypeError(
            "attention must be an eqx.nn.MultiheadAttention, got "
            f"{type(attention).__name__}"
        )
    heads, size = attention.num_heads, attention.qk_size
    q = jax.vmap(attention.query_proj)(query).reshape(query.shape[0], heads, size)
    k = jax.vmap(attention.key_proj)(key_).reshape(key_.shape[0], heads, size)
    # As `eqx.nn.attention`: the query divided by sqrt(d) before the product.
    logits = jnp.einsum("shd,Shd->hsS", q / math.sqrt(size), k)
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    return jnp.max(logits, axis=(1, 2))


def _attention_layers(
    find: Callable[[Any], Sequence[Any]] | None, tree: Any
) -> list[Any]:
    if find is None:
        is_mha = lambda x: isinstance(x, _MHA)  # noqa: E731
        return [x for x in jax.tree.leaves(tree, is_leaf=is_mha) if is_mha(x)]
    return list(find(tree))


def _projections(layer: Any) -> list[Any]:
    """The query and key projections' weights and biases (those it has)."""
    arrays = [layer.query_proj.weight, layer.key_proj.weight]
    for proj in (layer.query_proj, layer.key_proj):
        if getattr(proj, "bias", None) is not None:
            arrays.append(proj.bias)
    return arrays


class AbstractQKClip(AbstractSingleWrapper):
    """QK-clip after an inner optimizer's step; `QKClip` and `MuonClip` declare
    `inner`, `threshold` and `attention`."""

    threshold: eqx.AbstractVar[Float[Array, ""]]
    attention: eqx.AbstractVar[Callable[[Any], Sequence[Any]] | None]

    reads_params = "QK-clip (it rescales the query and key weights)"
    # It reads each projection's rows by head.
    reduces_over = "leaf"
    keywords = supplies(max_logits=Supplied.AUX)

    def takes_keyword(self, key: str) -> bool:
        return key in self.keywords or super().takes_keyword(key)

    def init(self, params: Params) -> State:
        return self.inner.init(params)

    def transform(
        self,
        grads: Grads,
        state: State,
        params: Params,
        *,
        max_logits: Any = None,
        **extra: Any,
    ) -> tuple[Updates, State]:
        name = type(self).__name__
        if max_logits is None:
            raise TypeError(
                f"{name} needs the largest attention logit of each head: pass "
                "max_logits= to update/step (eqxopt.max_attention_logits computes "
                "it), or return it as the loss function's aux in "
                "make_train_step(..., has_aux=True)"
            )
        self.check_keywords(extra)
        layers = _attention_layers(self.attention, params)
        # Found by type, none is a mistake; named by a function, none is a choice.
        if not layers and self.attention is None:
            raise ValueError(
                f"{name} found no attention layer in the parameters (no "
                "eqx.nn.MultiheadAttention; name the layers with attention=)"
            )
        logits = list(max_logits)
        if len(logits) != len(layers):
            raise ValueError(
                f"max_logits has {len(logits)} entries for {len(layers)} attention "
                "layers (one array of shape (num_heads,) per layer, in the order of "
                "the model's leaves)"
            )
        updates, state = self.inner.transform(grads, state, params, **extra)
        if not layers:
            return updates, state
        # The layers are found once, in the parameters: each projection's update
        # is read and written at the position of its parameter leaf.
        param_leaves, treedef = jax.tree.flatten(params)
        position = {id(x): i for i, x in enumerate(param_leaves)}
        update_leaves = treedef.flatten_up_to(updates)
        threshold = jnp.asarray(self.threshold, jnp.float32)
        for i, (layer, s) in enumerate(zip(layers, logits)):
            heads = layer.num_heads
            if jnp.shape(s) != (heads,):
                raise ValueError(
                    f"max_logits[{i}] must have shape ({heads},) (one per head), "
                    f"got {jnp.shape(s)}"
                )
            # gamma = min(1, tau / S) per head; each projection's rows of a head
            # scaled by sqrt(gamma), so that head's logits scale by gamma.
            s = jnp.asarray(s, jnp.float32)
            gamma = jnp.where(s > threshold, threshold / s, 1.0)
            for p in _projections(layer):
                at = position.get(id(p))
                if at is None:
                    raise ValueError(
                        f"{name}: attention layer {i} is not part of the parameters "
                        "(attention= must return the layers as they are in them)"
                    )
                u = update_leaves[at]
                if u is None:
                    raise ValueError(
                        f"{name}: attention layer {i}'s query or key projection has "
                        "no update (it is frozen or masked out)"
                    )
                if p.shape[0] % heads:
                    raise ValueError(
                        f"{name}: attention layer {i}'s projection of shape "
                        f"{p.shape} does not split into {heads} heads along its "
                        "first axis"
                    )
                rows = jnp.repeat(jnp.sqrt(gamma), p.shape[0] // heads)
                scale = rows.reshape(rows.shape + (1,) * (p.ndim - 1))
                # The new parameter is (p + u) * scale, so its update from p is
                # u * scale + p * (scale - 1): exactly u where a head is not
                # clipped (scale 1).
                wide = jnp.promote_types(p.dtype, jnp.float32)
                clipped = u.astype(wide) * scale + p.astype(wide) * (scale - 1)
                update_leaves[at] = clipped.astype(u.dtype)
        return treedef.unflatten(update_leaves), state


class QKClip(AbstractQKClip):
    r"""QK-clip (Kimi Team, 2025, "Kimi K2: Open Agentic Intelligence") after any
    optimizer: after `inner`'s step, the query and key projections of each
    attention head whose largest logit `S^h_max` passed `threshold` are rescaled so
    that head's logits shrink back to it. Per head `h`:

    $$
    \gamma_h = \min\left(1, \frac{\tau}{S^h_{\max}}\right), \qquad
    W_q^h \leftarrow \sqrt{\gamma_h}\, W_q^h, \qquad
    W_k^h \leftarrow \sqrt{\gamma_h}\, W_k^h
    $$

    applied to the parameters `inner` has just stepped (the rows of head `h` in
    each projection; a projection's bias, where it has one, too, so the logits
    scale by exactly `gamma_h`). `S^h_max` comes from the forward pass: pass
    `max_logits=` to `update`/`step`, one array of shape `(num_heads,)` per
    attention layer (`eqxopt.max_attention_logits`), or return it as the loss
    function's aux with `make_train_step(..., has_aux=True)`, which hands the aux
    to the optimizer. The state is `inner`'s.

    **Arguments:**

    - `inner`: the optimizer (Kimi K2 uses Muon: see `MuonClip`).
    - `threshold`: `tau`, the largest logit allowed, `> 0` (Kimi K2: 100).
    - `attention`: `None` to clip every `eqx.nn.MultiheadAttention` in the model
      (in the order of its leaves), or a function from the model to its attention
      layers, each with `query_proj` and `key_proj` linear layers (output rows
      grouped by head) and `num_heads`.

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxopt

    attn = eqx.nn.MultiheadAttention(2, 8, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (5, 8))


    def loss_fn(attn, x):
        out = attn(x, x, x)
        return jnp.mean(out**2), [eqxopt.max_attention_logits(attn, x, x)]


    opt = eqxopt.QKClip(eqxopt.AdamW(1e-2), threshold=0.1)
    train_step = eqxopt.make_train_step(loss_fn, opt, has_aux=True)
    attn, state, loss, logits = train_step(attn, opt.init(attn), x)
    ```
    """

    inner: AbstractTransform = inner_field()
    threshold: Float[Array, ""] = hyper(100.0, low=0.0, low_open=True, schedule=False)
    attention: Callable[[Any], Sequence[Any]] | None = eqx.field(
        default=None, static=True
    )


class MuonClip(AbstractQKClip):
    r"""MuonClip (Kimi Team, 2025, "Kimi K2: Open Agentic Intelligence"): `Muon`
    with its update's RMS matched to AdamW's (`consistent_rms=0.2`), followed by
    QK-clip (`QKClip`): each attention head whose largest logit `S^h_max` passed
    `threshold` has its query and key rows scaled by `sqrt(min(1, tau / S^h_max))`
    after the step.

    **Arguments:**

    - `learning_rate`: Muon's learning rate (a float, scalar array or schedule).
    - `threshold`: `tau`, the largest logit allowed, `> 0` (Kimi K2: 100).
    - `attention`: as `QKClip`'s.
    - `consistent_rms`, `**muon_options`: `Muon`'s options (`weight_decay`,
      `beta`, `adam_learning_rate`, ...).

    The state is `Muon`'s; `max_logits=` as for `QKClip`.
    """

    inner: AbstractTransform
    threshold: Float[Array, ""] = hyper(100.0, low=0.0, low_open=True, schedule=False)
    attention: Callable[[Any], Sequence[Any]] | None = eqx.field(
        default=None, static=True
    )

    def __init__(
        self,
        learning_rate: ScalarOrSchedule,
        *,
        threshold: float | ArrayLike = 100.0,
        attention: Callable[[Any], Sequence[Any]] | None = None,
        consistent_rms: float | None = 0.2,
        **muon_options: object,
    ):
        self.inner = Muon(
            learning_rate,
            consistent_rms=consistent_rms,
            **muon_options,  # pyright: ignore[reportArgumentType]
        )
        # The field's converter makes it a checked scalar array.
        self.threshold = threshold  # pyright: ignore[reportAttributeAccessIssue]
        self.attention = attention
