"""The GIoU loss study of the seed article, with torchvision's loss formula.

``generalized_box_iou_loss`` is torchvision's formula (clamped intersection, ``eps=1e-7`` in the
denominators, loss = 1 - GIoU) written with ``torch.where`` instead of boolean-mask indexing, so
the whole loss is one traceable graph. Batches follow the article: boxes per image
floor(|N(0, 3)|) clipped to [0, 255], predictions (B, 256, 4).
"""

from __future__ import annotations

import torch

from ..ragged import Ragged

MAX_BOXES = 256


def generalized_box_iou_loss(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Per-box GIoU loss of (x1, y1, x2, y2) boxes, torchvision's formula."""
    x1, y1, x2, y2 = boxes1.unbind(-1)
    x1g, y1g, x2g, y2g = boxes2.unbind(-1)
    xkis1, ykis1 = torch.max(x1, x1g), torch.max(y1, y1g)
    xkis2, ykis2 = torch.min(x2, x2g), torch.min(y2, y2g)
    overlap = (ykis2 > ykis1) & (xkis2 > xkis1)
    intsctk = torch.where(overlap, (xkis2 - xkis1) * (ykis2 - ykis1), torch.zeros_like(x1))
    unionk = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - intsctk
    iouk = intsctk / (unionk + eps)
    xc1, yc1 = torch.min(x1, x1g), torch.min(y1, y1g)
    xc2, yc2 = torch.max(x2, x2g), torch.max(y2, y2g)
    area_c = (xc2 - xc1) * (yc2 - yc1)
    miouk = iouk - ((area_c - unionk) / (area_c + eps))
    return 1 - miouk


def padded_giou_loss(pred: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean GIoU loss over the real boxes of a zero-padded (B, 256, 4) target batch."""
    mask = (targets[..., 3] > 0).to(pred.dtype)
    loss = generalized_box_iou_loss(pred, targets) * mask
    return loss.sum() / torch.clamp(mask.sum(), min=1)


def ragged_giou_loss(pred: torch.Tensor, targets: Ragged) -> torch.Tensor:
    """Mean GIoU loss over the real boxes only: target box ``t`` of image ``b`` at position ``p``
    is matched with ``pred[b, p]``. No padding, no mask: the work is proportional to the boxes.
    A batch without boxes has a loss of 0, as the padded loss (a mean over no boxes is NaN)."""
    matched = pred[targets.row_ids(), targets.positions()]
    losses = generalized_box_iou_loss(matched, targets.values)
    # (Dynamo specializes a T of 0, so the test costs no guard in the graph of other batches)
    return losses.sum() if targets.total_length == 0 else losses.mean()


def random_boxes(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` valid boxes in a 256x256 image (x1 < x2, y1 < y2, all > 0)."""
    top_left = torch.randint(1, 255, (n, 2), generator=generator).float()
    size = torch.randint(1, 256, (n, 2), generator=generator).float()
    bottom_right = torch.clamp(top_left + size, max=255.0)
    return torch.cat([top_left, bottom_right], dim=1)


def box_counts(batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Boxes per image: floor(|N(0, 3)|) clipped to [0, 255], as in the article."""
    return torch.clamp((torch.randn(batch, generator=generator) * 3).abs().floor(), 0, MAX_BOXES - 1).long()


def make_batch(batch: int = 1024, dtype: torch.dtype = torch.float32, seed: int = 0
               ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """(predictions (B, 256, 4), list of per-image targets, the targets zero-padded to 256)."""
    g = torch.Generator().manual_seed(seed)
    counts = box_counts(batch, g)
    targets = [random_boxes(int(c), g).to(dtype) for c in counts]
    pred = random_boxes(batch * MAX_BOXES, g).view(batch, MAX_BOXES, 4).to(dtype)
    padded = torch.zeros(batch, MAX_BOXES, 4, dtype=dtype)
    for i, t in enumerate(targets):
        padded[i, : t.shape[0]] = t
    return pred, targets, padded
