"""Norm-constrained optimizers: HyperBallAdamW (each weight kept on a sphere of its
initial norm) and Scion (a linear minimisation oracle per layer)."""
