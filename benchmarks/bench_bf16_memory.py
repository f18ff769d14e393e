"""Bytes per parameter of bf16 training without float32 master weights (issue 11,
item 2) or with them in an int8 residual (issue 41, `ErrorCorrection`): the
parameters plus the optimizer state `init` makes (XLA's memory analysis of the
compiled `init`: its output bytes), for AdamW on one 1M-element leaf.
Run: `PYTHONPATH=src .venv/bin/python benchmarks/bench_bf16_memory.py`."""

import jax
import jax.numpy as jnp

import eqxopt

N = 1 << 20
BF16, F32 = jnp.bfloat16, jnp.float32


def per_param(opt, params, extra_bytes=0):
    compiled = jax.jit(lambda o, p: o.init(p)).lower(opt, params).compile()
    state = compiled.memory_analysis().output_size_in_bytes
    return (params.size * params.dtype.itemsize + state + extra_bytes) / N


def main():
    p32, p16 = jnp.zeros(N, F32), jnp.zeros(N, BF16)
    f32_moments = {"mu_dtype": F32, "nu_dtype": F32}
    rows = [
        ("float32 params, AdamW", per_param(eqxopt.AdamW(1e-3), p32)),
        (
            "bf16 params + float32 master copy, AdamW float32 moments",
            per_param(eqxopt.AdamW(1e-3), p32, extra_bytes=2 * N),
        ),
        (
            "bf16 params, KahanSummation(AdamW float32 moments)",
            per_param(eqxopt.KahanSummation(eqxopt.AdamW(1e-3, **f32_moments)), p16),
        ),
        (
            "bf16 params, StochasticRounding(AdamW float32 moments)",
            per_param(
                eqxopt.StochasticRounding(eqxopt.AdamW(1e-3, **f32_moments), key=0),
                p16,
            ),
        ),
        (
            "bf16 params, KahanSummation(AdamW bf16 moments)",
            per_param(eqxopt.KahanSummation(eqxopt.AdamW(1e-3)), p16),
        ),
        (
            "bf16 params, StochasticRounding(AdamW bf16 moments)",
            per_param(eqxopt.StochasticRounding(eqxopt.AdamW(1e-3), key=0), p16),
        ),
        (
            "bf16 params, ErrorCorrection(AdamW float32 moments): int8 residual",
            per_param(eqxopt.ErrorCorrection(eqxopt.AdamW(1e-3), key=0), p16),
        ),
        (
            "bf16 params, ErrorCorrection(AdamW bf16 moments): int8 residual",
            per_param(
                eqxopt.ErrorCorrection(
                    eqxopt.AdamW(1e-3, mu_dtype=BF16, nu_dtype=BF16), key=0
                ),
                p16,
            ),
        ),
        (
            "bf16 params, ErrorCorrection(AdamW ErrorCorrectedBf16 moments)",
            per_param(
                eqxopt.ErrorCorrection(
                    eqxopt.AdamW(
                        1e-3,
                        mu_dtype=eqxopt.ErrorCorrectedBf16(),
                        nu_dtype=eqxopt.ErrorCorrectedBf16(),
                    ),
                    key=0,
                ),
                p16,
            ),
        ),
        (
            "bf16 params, ErrorCorrection(AdamW Blockwise8bit moments)",
            per_param(
                eqxopt.ErrorCorrection(
                    eqxopt.AdamW(
                        1e-3,
                        mu_dtype=eqxopt.Blockwise8bit(),
                        nu_dtype=eqxopt.Blockwise8bit(),
                    ),
                    key=0,
                ),
                p16,
            ),
        ),
        (
            "bf16 params, ErrorCorrection(AdamW Companded8bit moments): FlashOptim's",
            per_param(
                eqxopt.ErrorCorrection(
                    eqxopt.AdamW(
                        1e-3,
                        mu_dtype=eqxopt.Companded8bit(),
                        nu_dtype=eqxopt.Companded8bit(),
                    ),
                    key=0,
                ),
                p16,
            ),
        ),
    ]
    print("| setup | bytes per parameter |\n|---|---|")
    for name, b in rows:
        print(f"| {name} | {b:.2f} |")


if __name__ == "__main__":
    main()
