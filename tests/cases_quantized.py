"""Catalog cases with block-wise quantized moments (`Blockwise8bit`, and
`Companded8bit`; the 4-bit and fp8 storages share Blockwise8bit's code path and are
tested in test_quantized_state.py). The
catalog's trees are tiny, so these use small blocks and `min_size=2`: their larger
leaves are then actually quantized (0-d and 1-element leaves stay float32)."""

import eqxopt
from catalog import CatalogCase

Q8 = eqxopt.Blockwise8bit(block_size=4, min_size=2)


# Complex leaves stay in full precision (not phase covariant: test_catalog_dtypes).
TAGS = frozenset({"quantized"})


def _make(cls, **defaults):
    return lambda **kw: cls(**{"learning_rate": 0.05, **defaults, **kw})


CASES = [
    CatalogCase(
        "AdamW-8bit",
        _make(eqxopt.AdamW, weight_decay=0.01, mu_dtype=Q8, nu_dtype=Q8),
        vary=("b2", 0.9),
        invalid=(("b1", 1.0), ("eps", 0.0)),
        tags=TAGS,
    ),
    CatalogCase(
        "Lion-8bit",
        _make(eqxopt.Lion, learning_rate=0.01, weight_decay=0.1, mu_dtype=Q8),
        vary=("weight_decay", 1.0),
        invalid=(("b2", 1.5),),
        tags=TAGS,
    ),
]

# FlashOptim's companded 8-bit moments: groups of 4 here (32 by default), float16
# scales; the native kernels leave them to XLA's code.
C8 = eqxopt.Companded8bit(block_size=4, min_size=2)
CASES.append(
    CatalogCase(
        "AdamW-Companded8bit",
        _make(eqxopt.AdamW, weight_decay=0.01, mu_dtype=C8, nu_dtype=C8),
        vary=("b2", 0.9),
        invalid=(("b1", 1.0), ("eps", 0.0)),
        tags=TAGS,
    )
)

# bf16 moments with an int8 residual (heavyball's ecc="bf16+8"): element-wise, no
# blocks, every real float leaf stored so (min_size=0).
CASES.append(
    CatalogCase(
        "AdamW-ErrorCorrectedBf16",
        _make(
            eqxopt.AdamW,
            weight_decay=0.01,
            mu_dtype=eqxopt.ErrorCorrectedBf16(),
            nu_dtype=eqxopt.ErrorCorrectedBf16(),
        ),
        vary=("b2", 0.9),
        invalid=(("b1", 1.0), ("eps", 0.0)),
        tags=TAGS,
    )
)
