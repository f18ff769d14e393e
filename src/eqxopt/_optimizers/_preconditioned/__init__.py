"""Optimizers with structured preconditioners: Adafactor, SM3, SOAP, Shampoo,
KL-Shampoo, PSGD-Kron, Muon, Dion, L-BFGS."""
