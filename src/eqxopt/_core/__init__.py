"""The core: `AbstractTransform` (the contract every transform keeps), the
validating field declarations, schedules as hyperparameters, masks, tree helpers,
the per-leaf engine (`map_leaves`) and the compiled dispatch of `update`/`step`.
"""

from ._base import (
    AbstractTransform as AbstractTransform,
)
from ._compile import (
    set_split_compilation as set_split_compilation,
)
from ._leafwise import (
    map_leaves as map_leaves,
)
from ._packed import (
    Packed as Packed,
    pack as pack,
)
from ._storage import (
    Blockwise4bit as Blockwise4bit,
    Blockwise8bit as Blockwise8bit,
    BlockwiseFp8 as BlockwiseFp8,
    Companded8bit as Companded8bit,
    ErrorCorrectedArray as ErrorCorrectedArray,
    ErrorCorrectedBf16 as ErrorCorrectedBf16,
    QuantizedArray as QuantizedArray,
)
from ._tree import (
    apply_updates as apply_updates,
)
from ._tree_utils import (
    tree_cast as tree_cast,
    tree_get as tree_get,
    tree_norm as tree_norm,
    tree_set as tree_set,
)
