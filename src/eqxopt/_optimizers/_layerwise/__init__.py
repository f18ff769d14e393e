"""Optimizers that scale each layer's step by a norm of the layer: LAMB, LARS,
Fromage, NovoGrad.
"""
