"""The optimizers, one subpackage per family: `_adam`, `_adaptive`,
`_constrained`, `_contrib`, `_layerwise`, `_parameter_free`, `_preconditioned`,
`_sgd` (each one's docstring says what it holds). Nothing is re-exported here:
`eqxopt/__init__.py` imports each public name from the module that defines it, so
the names are listed once.
"""
