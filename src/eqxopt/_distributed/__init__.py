"""Training across devices and processes: helpers for sharded parameters and state."""

from ._checkpoint import (
    sharded_deserialise_filter_spec as sharded_deserialise_filter_spec,
)
