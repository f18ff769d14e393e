"""README's Python snippets run, in order, in one namespace (README stays true)."""

import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp

README = pathlib.Path(__file__).parent.parent / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the schedule snippet writes a PNG
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    # README is the front page; the longer examples are in docs/ (tests/test_docs.py)
    assert len(blocks) >= 4
    # The first snippet shows the API on a model and gradients the reader already has.
    model = eqx.nn.MLP(4, 1, 8, 1, key=jax.random.key(0))
    grads = jax.tree.map(lambda x: jnp.ones_like(x) if eqx.is_array(x) else None, model)
    namespace = {"model": model, "grads": grads}
    for index, block in enumerate(blocks):
        try:
            exec(compile(block, f"README block {index}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"README block {index} failed:\n{block}") from error
