"""Catalog cases for the optimizers no other JAX library ships: LaProp, AdamMini,
NorMuon, MARS."""

import eqxopt
from cases_newer_family import second_moment_muon_case
from catalog import CatalogCase

CASES = [
    CatalogCase(
        "LaProp",
        lambda **kw: eqxopt.LaProp(
            **{"learning_rate": 0.05, "weight_decay": 1e-3, **kw}
        ),
        vary=("b2", 0.9),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("b2", 0.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
        ),
    ),
    CatalogCase(
        "LaProp-centered-amsgrad",
        lambda **kw: eqxopt.LaProp(
            **{"learning_rate": 0.05, "centered": True, "amsgrad": True, **kw}
        ),
        vary=("b2", 0.9),
        invalid=(("b1", 1.0), ("eps", 0.0)),
    ),
    CatalogCase(
        "AdamMini",
        lambda **kw: eqxopt.AdamMini(
            **{"learning_rate": 0.05, "weight_decay": 1e-3, "partition": "rows", **kw}
        ),
        vary=("b1", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("b2", 0.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
            ("partition", "heads"),
        ),
    ),
    second_moment_muon_case("NorMuon", eqxopt.NorMuon, ("beta2", 0.5)),
    CatalogCase(
        "MARS",
        lambda **kw: eqxopt.MARS(**{"learning_rate": 0.05, "weight_decay": 1e-3, **kw}),
        vary=("gamma", 0.1),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("b2", 0.0),
            ("eps", 0.0),
            ("gamma", -0.1),
            ("clip_norm", 0.0),
            ("weight_decay", -1.0),
        ),
    ),
]
