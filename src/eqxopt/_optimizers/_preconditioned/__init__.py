"""Optimizers with structured preconditioners: Adafactor, SM3, SOAP, Shampoo,
PSGD-Kron, Muon, L-BFGS."""
