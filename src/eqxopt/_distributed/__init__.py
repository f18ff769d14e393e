"""Training across devices and processes: placing the optimizer state on a mesh
independently of the parameters (ZeRO-1, `_state_sharding.py`), and restoring sharded
checkpoints into their shardings (`_checkpoint.py`)."""

from ._checkpoint import (
    sharded_deserialise_filter_spec as sharded_deserialise_filter_spec,
)
from ._state_sharding import (
    shard_state as shard_state,
    state_shardings as state_shardings,
)
