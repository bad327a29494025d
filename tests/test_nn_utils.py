"""torch.nn.utils inside compiled code: gradient clipping over grads that are views of one buffer."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import clip_grad_norm_

import ember


def _params_over_one_buffer() -> tuple[torch.Tensor, list[torch.nn.Parameter]]:
    """Parameters whose grads are views of one flat buffer; the last one shares elements with
    the others (a strided view), the rest sit side by side."""
    torch.manual_seed(0)
    flat = torch.randn(20) * 3
    params = []
    for grad in (flat[:12].view(3, 4), flat[12:17], flat[17:], flat[::5]):
        p = torch.nn.Parameter(torch.zeros(grad.shape))
        p.grad = grad
        params.append(p)
    return flat, params


def test_foreach_clip_over_grads_sharing_elements_scales_them_as_eager() -> None:
    # eager's _foreach_mul_ scales a shared element once per view holding it; functionalization
    # (aot_eager too) scaled it once
    clip = lambda ps: clip_grad_norm_(ps, 1.0, foreach=True)
    ref_flat, ref_params = _params_over_one_buffer()
    ref_norm = clip(ref_params)
    flat, params = _params_over_one_buffer()
    with pytest.warns(RuntimeWarning, match="share memory"):  # (the graph runs eagerly)
        norm = ember.compile(clip)(params)
    torch.testing.assert_close(norm, ref_norm)
    torch.testing.assert_close(flat, ref_flat)


def test_foreach_clip_over_side_by_side_grads_compiles() -> None:
    # views of one buffer that share no element are not sent eagerly
    clip = lambda ps: clip_grad_norm_(ps, 1.0, foreach=True)
    ref_flat, ref_params = _params_over_one_buffer()
    ref_norm = clip(ref_params[:3])
    flat, params = _params_over_one_buffer()
    before = ember.stats()["graph_fallbacks"]
    norm = ember.compile(clip)(params[:3])
    torch.testing.assert_close(norm, ref_norm)
    torch.testing.assert_close(flat, ref_flat)
    assert ember.stats()["graph_fallbacks"] == before
