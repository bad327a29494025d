"""Ragged tensors: batches of variable-length sequences, packed without padding.

    r = ragged.from_list([torch.randn(3, 4), torch.randn(5, 4)])   # Ragged(B=2, T=8, ...)
    r = ragged.from_padded(padded, lengths)                         # keep the real rows only
    dense = r.to_padded()                                           # (B, r.max_length, 4)
    dense[r.row_ids(), r.positions()]                               # the rows of r, gathered
    loader = DataLoader(ds, collate_fn=ragged.collate)              # ragged fields in one buffer
    batch = ragged.to_device(batch, "cuda")                         # one copy per buffer
    ragged.segment_mean(r)                                          # (B, 4): per-row reductions
    ragged.jagged_softmax(r)                                        # softmax within each row

The segment functions (``segment_sum``, ``segment_mean``, ``segment_max``, ``jagged_softmax``)
are plain torch ops without host syncs (see ``segment.py``).

The layout (values + offsets + host-side max_length) is torch.nested's jagged layout, so
``Ragged.from_nested`` and ``Ragged.to_nested`` convert without copying.
"""

from .collate import collate, to_device
from .construct import from_list, from_padded
from .segment import jagged_softmax, segment_max, segment_mean, segment_sum
from .tensor import Ragged

__all__ = ["Ragged", "collate", "from_list", "from_padded", "jagged_softmax", "segment_max", "segment_mean",
           "segment_sum", "to_device"]
