"""Optimizers from `optax.contrib` and their papers that no other family holds:
Sophia (a clipped, diagonal-Hessian preconditioner) and GaLore (Adam on a low-rank
projection of each matrix's gradient); beside GaLore, APOLLO and APOLLO-Mini (a
gradient scaled per channel from Adam's moments of a random projection). The
contrib wrappers (Mechanic, SAM, ScheduleFree) are in `_wrappers`.
"""
