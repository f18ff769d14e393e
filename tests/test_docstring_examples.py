"""Docstring examples run: the `**Example:**` block of every public name that has one
(and each of the most used names must have one), each in a fresh namespace, as a
reader would paste it."""

import contextlib
import inspect
import re

import jax
import pytest

import eqxopt

# The names a new user meets first: each shows a runnable example.
MOST_USED = [
    "AdamW", "Adam", "SGD", "Lion", "Muon", "Adafactor", "LAMB", "Chain", "Partition",
    "ClipByGlobalNorm", "MultiSteps", "WarmupCosine", "CosineDecay",
    "WarmupStableDecay", "pack", "make_train_step", "microbatch", "from_optax",
    "shard_state", "Blockwise8bit",
]  # fmt: skip
EXAMPLE = "**Example:**"


def example_blocks(name: str) -> list[str]:
    doc = inspect.getdoc(getattr(eqxopt, name)) or ""
    _, found, after = doc.partition(EXAMPLE)
    if not found:
        return []
    return re.findall(r"^```python\n(.*?)^```", after, re.S | re.M)


WITH_EXAMPLES = sorted(
    set(MOST_USED) | {name for name in eqxopt.__all__ if example_blocks(name)}
)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_example_runs(name, tmp_path, monkeypatch):
    blocks = example_blocks(name)
    assert blocks, f"eqxopt.{name} has no {EXAMPLE} block"
    monkeypatch.chdir(tmp_path)
    for index, block in enumerate(blocks):
        # optax promotes dtypes implicitly (as in tests/test_docs.py)
        promotion = (
            jax.numpy_dtype_promotion("standard")
            if "optax" in block
            else contextlib.nullcontext()
        )
        namespace: dict = {"__name__": f"example_{name}"}
        try:
            with promotion:
                exec(
                    compile(block, f"eqxopt.{name} example {index}", "exec"), namespace
                )
        except Exception as error:
            raise AssertionError(f"eqxopt.{name}'s example failed:\n{block}") from error
