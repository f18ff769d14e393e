"""Optimizer state across devices: placing the state on a mesh independently of the
parameters (ZeRO-1)."""

from ._state_sharding import (
    shard_state as shard_state,
    state_shardings as state_shardings,
)
