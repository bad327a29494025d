"""Vision ops (norms, pooling, resampling, padding, unfold) compiled by ember against eager:
the errors eager raises for arguments its kernels refuse, and the values where ember computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import check


def _eager_error(fn, *args) -> type[BaseException] | None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 -- the type is what is compared
        return type(e)
    return None


def test_batch_norm_of_a_vector_raises_eagers_index_error():
    # eager's kernel reads the channel dim (1) of a 1-d input: IndexError. The decomposition
    # normalized the vector as if it were one channel, and returned it.
    fn = lambda x: F.batch_norm(x, None, None, training=True)  # noqa: E731
    x = torch.randn(4)
    assert _eager_error(fn, x) is IndexError
    with pytest.raises(IndexError):
        ember.compile(fn)(x)


def test_batch_norm_of_a_matrix_still_compiles():
    x = torch.randn(3, 4, dtype=torch.float64)
    fn = lambda x: F.batch_norm(x, None, None, training=True)  # noqa: E731
    torch.testing.assert_close(ember.compile(fn)(x), fn(x))


# (torch 2.11, on the GPU machines, re-raises the meta function's IndexError without its frames,
# so the meta function that raised it is not found there: ember raises IndexError, as before)
@pytest.mark.skipif(torch.__version__ < "2.13", reason="needs the meta function's frames (torch 2.13)")
@pytest.mark.parametrize("shape", [(6,), (4, 6)])
def test_max_pool2d_of_too_few_dims_raises_eagers_runtime_error(shape):
    # eager: "non-empty 3D or 4D (batch mode) tensor expected" (RuntimeError); the meta
    # function read size(-3) first, and Dynamo let its IndexError through
    fn = lambda x: F.max_pool2d(x, 2)  # noqa: E731
    x = torch.randn(shape)
    assert _eager_error(fn, x) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(x)


def test_pixel_shuffle_by_zero_raises_eagers_runtime_error():
    # eager: "pixel_shuffle expects a positive upscale_factor" (RuntimeError); the meta
    # function took a remainder by 0 first: ZeroDivisionError
    fn = lambda x: F.pixel_shuffle(x, 0)  # noqa: E731
    x = torch.randn(1, 4, 2, 2)
    assert _eager_error(fn, x) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(x)


def test_interpolation_to_no_pixels_with_symbolic_sizes_raises_eagers_runtime_error():
    # eager checks the output size (RuntimeError); the decomposition divided a SymInt by 0, whose
    # ZeroDivisionError came out of torch's symbolic sizes, not the decomposition's own frame
    fn = lambda x: F.interpolate(x, size=(0, 2))  # noqa: E731
    x = torch.randn(1, 2, 3, 3)
    assert _eager_error(fn, x) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn, dynamic=True)(x)


def test_unfold_of_a_matrix_raises_eagers_index_error():
    # eager's im2col reads a dim a 2-d input lacks before checking its rank: IndexError; the
    # decomposition checks the rank first (RuntimeError)
    fn = lambda x: F.unfold(x, 2)  # noqa: E731
    x = torch.randn(4, 5)
    assert _eager_error(fn, x) is IndexError
    with pytest.raises(IndexError):
        ember.compile(fn)(x)


@pytest.mark.parametrize("bad", [20, -1])
def test_max_unpool_index_out_of_its_plane_raises_eagers_runtime_error(bad):
    # eager: "Found an invalid max index" (RuntimeError). The decomposition scattered at
    # index + plane * 16 unchecked: 20 in plane 0 (or -1 in plane 1) landed in the other plane.
    x = torch.arange(1.0, 9.0).reshape(1, 2, 2, 2)
    indices = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]).reshape(1, 2, 2, 2)
    indices[0, 0 if bad > 0 else 1, 1, 1] = bad
    fn = lambda x, i: F.max_unpool2d(x, i, 2, output_size=(4, 4))  # noqa: E731
    assert _eager_error(fn, x, indices) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(x, indices)


def test_max_unpool_of_max_pool_indices():
    x = torch.randn(2, 3, 8, 6, dtype=torch.float64, requires_grad=True)
    fn = lambda x: F.max_unpool2d(*F.max_pool2d(x, 3, 2, return_indices=True), 3, 2, output_size=(8, 6))  # noqa: E731
    out, ref = ember.compile(fn)(x), fn(x)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(ref, x, g)[0])


_LINEAR_MODES = ["linear", "bilinear", "trilinear"]


@pytest.mark.parametrize("mode", _LINEAR_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_linear_interpolation_matches_eagers_opinfo_samples(mode, dtype):
    # a quarter of the mode's OpInfo samples (sizes, scale factors, align_corners); float64 with
    # its gradient. eager's bfloat16 kernels round between the dims: ember's is no further from
    # float64 than eager's
    from torch.testing._internal.common_methods_invocations import op_db
    info = next(o for o in op_db if o.name == "nn.functional.interpolate" and o.variant_test_name == mode)
    for sample in list(info.sample_inputs("cpu", dtype))[::4]:
        def fn(x, sample=sample):
            return F.interpolate(x, *sample.args, **sample.kwargs)
        x = sample.input.detach()
        if dtype == torch.bfloat16:
            out, ref, exact = ember.compile(fn)(x).double(), fn(x).double(), fn(x.double())
            assert (out - exact).abs().max() <= (ref - exact).abs().max() + 2 ** -8, sample.kwargs
            continue
        check(fn, x)
        if dtype == torch.float64:
            mine, ref = (x.clone().requires_grad_() for _ in range(2))
            up = torch.randn_like(fn(x))
            ember.compile(fn)(mine).backward(up)
            fn(ref).backward(up)
            torch.testing.assert_close(mine.grad, ref.grad)


@pytest.mark.parametrize("mode, rank", [("linear", 3), ("bilinear", 4), ("trilinear", 5)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_linear_interpolation_next_to_infinities_is_eagers(mode, rank, align_corners):
    # (CPU fuzz seed 341522607868) eager weighs the neighbours, x0 * (1 - w) + x1 * w; torch's
    # decomposition computed x0 + (x1 - x0) * w, NaN between -inf and a number where eager's is
    # -inf. NaN stays where eager's has it too (an infinity times a weight of 0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn([2, 3, 3, 4, 5][:rank], generator=g)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=g)[:flat.numel() // 6]
    flat[picks] = torch.where(torch.arange(len(picks)) % 2 == 0, float("inf"), -float("inf"))
    fn = lambda x: F.interpolate(x, scale_factor=2, mode=mode, align_corners=align_corners)  # noqa: E731
    out, ref = ember.compile(fn)(x), fn(x)
    assert torch.equal(out.isnan(), ref.isnan())
    torch.testing.assert_close(out, ref, equal_nan=True)
    channels_last = x.contiguous(memory_format=torch.channels_last) if rank == 4 else x
    assert ember.compile(fn)(channels_last).stride() == fn(channels_last).stride()
