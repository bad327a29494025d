"""Bad input to ember's own API (ragged constructors, collate, wait_for_kernels, the CLI): a clear
TypeError or ValueError naming the function, not torch's error from deep inside, a misleading
message, or a silent wrong result."""

import math
import time

import pytest
import torch

import ember
from ember import cli, ragged
from ember.runtime import triton_matmul


def test_from_list_checks_dtype_type():
    """dtype="float32" was reported as "dtype=float32 but the tensors are torch.float32"."""
    with pytest.raises(TypeError, match=r"from_list: dtype= must be a torch.dtype"):
        ragged.from_list([torch.randn(2, 3)], dtype="float32")
    with pytest.raises(TypeError, match=r"from_list: dtype= must be a torch.dtype"):
        ragged.from_list([], feature_shape=(3,), dtype="float32")


def test_from_list_checks_offsets_dtype_type():
    """offsets_dtype="int64" was a ValueError whose message read "got int64"."""
    with pytest.raises(TypeError, match=r"from_list: offsets_dtype= must be torch.int32 or torch.int64"):
        ragged.from_list([torch.randn(2, 3)], offsets_dtype="int64")
    with pytest.raises(TypeError, match=r"from_padded: offsets_dtype="):
        ragged.from_padded(torch.randn(2, 4, 3), [1, 2], offsets_dtype="int64")
    with pytest.raises(ValueError, match=r"from_padded: offsets_dtype must be int32 or int64"):
        ragged.from_padded(torch.randn(2, 4, 3), [1, 2], offsets_dtype=torch.int16)


def test_from_list_checks_feature_shape():
    """feature_shape=3 failed as "Value after * must be an iterable", (-3,) inside torch.empty."""
    for shape in (3, "3", (3.0,), (True,)):
        with pytest.raises(TypeError, match=r"from_list: feature_shape= must be a tuple of ints"):
            ragged.from_list([], feature_shape=shape, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"from_list: feature_shape="):
        ragged.from_list([torch.randn(2, 3)], feature_shape=3)
    with pytest.raises(ValueError, match=r"from_list: feature_shape= must have sizes >= 0"):
        ragged.from_list([], feature_shape=(-3,), dtype=torch.float32)
    r = ragged.from_list([], feature_shape=torch.Size([3]), dtype=torch.float32)
    assert r.values.shape == (0, 3) and r.offsets.tolist() == [0]


def test_from_list_checks_device():
    """An unknown device raised torch's RuntimeError listing every device type."""
    with pytest.raises(ValueError, match=r"from_list: device='foo' is not a device"):
        ragged.from_list([torch.randn(2, 3)], device="foo")
    with pytest.raises(ValueError, match=r"from_list: device='foo'"):
        ragged.from_list([], feature_shape=(3,), dtype=torch.float32, device="foo")
    with pytest.raises(TypeError, match=r"from_list: device= must be"):
        ragged.from_list([], feature_shape=(3,), dtype=torch.float32, device=1.5)
    assert ragged.from_list([torch.randn(2, 3)], device="cpu").device == torch.device("cpu")


def test_from_list_refuses_rows_past_int32_offsets():
    """2^31 rows with int32 offsets raised torch.tensor's bare overflow error."""
    rows = torch.empty(2**31, 0, dtype=torch.uint8)  # (no bytes)
    with pytest.raises(ValueError, match=r"from_list: 2147483648 rows do not fit torch.int32 offsets"):
        ragged.from_list([rows], offsets_dtype=torch.int32)


def test_from_padded_refuses_rows_past_int32_offsets():
    """int32 offsets of 2^31 + 2 rows wrapped around silently (the cumsum copied into them)."""
    width = 2**30 + 1
    padded = torch.empty(1, 1, 0).expand(2, width, 0)  # (no bytes)
    for lengths in ([width, width], torch.tensor([width, width])):
        with pytest.raises(ValueError, match=r"from_padded: 2147483650 rows do not fit torch.int32"):
            ragged.from_padded(padded, lengths, offsets_dtype=torch.int32)


def test_collate_refuses_a_batch_that_is_not_a_list_with_type_error():
    """A string or a generator of samples was a ValueError ("expects a non-empty list")."""
    for batch in ("ab", (s for s in [(torch.zeros(2),)]), None):
        with pytest.raises(TypeError, match=r"collate expects a list of samples"):
            ragged.collate(batch)
    with pytest.raises(ValueError, match="non-empty list"):
        ragged.collate([])


def test_collate_checks_pin_memory_and_ragged_fields_types():
    """pin_memory="no" was taken as True; ragged_fields=1.0 failed as "'float' object is not iterable"."""
    batch = [(torch.zeros(2),), (torch.zeros(3),)]
    with pytest.raises(TypeError, match=r"collate: pin_memory= takes True, False or None"):
        ragged.collate(batch, pin_memory="no")
    with pytest.raises(TypeError, match=r"collate: ragged_fields= takes a field"):
        ragged.collate(batch, ragged_fields=1.0)


def test_wait_for_kernels_checks_timeout():
    """timeout="10" passed while nothing compiled and failed inside threading when a job was pending."""
    for timeout in ("10", [1], True):
        with pytest.raises(TypeError, match=r"ember.wait_for_kernels: timeout= takes seconds"):
            ember.wait_for_kernels(timeout)
    for timeout in (-1, math.nan):
        with pytest.raises(ValueError, match=r"ember.wait_for_kernels: timeout= must be >= 0"):
            ember.wait_for_kernels(timeout)
    assert ember.wait_for_kernels(0) and ember.wait_for_kernels(0.5) and ember.wait_for_kernels()


def test_wait_for_kernels_takes_an_infinite_timeout():
    """timeout=math.inf raised OverflowError from threading while a compile was pending."""
    triton_matmul.submit_compile(lambda: time.sleep(0.2))  # (a stand-in for a kernel compiling)
    assert ember.wait_for_kernels(math.inf)


def test_cli_demo_refuses_an_unknown_device(capsys):
    """`ember demo --device foo` ran on the CPU without a GPU (and failed in torch with one)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--device", "foo", "--batch", "1"])
    assert exit_info.value.code == 2
    assert "'foo' is not cpu or cuda" in capsys.readouterr().err
    assert cli._demo_device("cuda:1") == "cuda:1" and cli._demo_device("cpu") == "cpu"


def test_cuda_graph_capacity_of_the_wrong_type_is_a_type_error():
    """capacity="64" or 64.0 was a ValueError; warmup's wrong types were already TypeErrors."""
    for capacity in ("64", 64.0, True):
        with pytest.raises(TypeError, match=r"cuda_graph: capacity must be a positive int or None"):
            ember.cuda_graph(lambda x: x, capacity=capacity)
    with pytest.raises(ValueError, match=r"capacity must be a positive int"):
        ember.cuda_graph(lambda x: x, capacity=-1)


def test_setting_an_unknown_config_attribute_raises():
    """ember.config.debg = 2 (a misspelt setting) was kept and silently ignored."""
    with pytest.raises(AttributeError, match=r"ember.config has no setting 'debg'; known: .*'debug'"):
        ember.config.debg = 2
    assert not hasattr(ember.config, "debg")
    cfg = ember.Config()
    cfg.debug = 1  # (known settings are set as before, and replace() still works)
    assert cfg.debug == 1 and cfg.replace(debug=2).debug == 2


def test_ragged_to_refuses_a_tensor_and_a_dtype_as_non_blocking():
    """r.to(tensor) cast the offsets to the tensor's dtype (float16 offsets, silently), and
    r.to("cpu", torch.half) failed inside Tensor.to."""
    r = ragged.from_list([torch.randn(2, 3), torch.randn(3, 3)])
    with pytest.raises(TypeError, match=r"Ragged.to takes a device or a dtype, got Tensor"):
        r.to(torch.zeros(2, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"Ragged.to: non_blocking= takes True or False, got torch.float16"):
        r.to("cpu", torch.float16)
    assert r.to("cpu") is r and r.to(torch.device("cpu"), non_blocking=True) is r
    half = r.to(torch.float16)
    assert half.dtype == torch.float16 and half.offsets.dtype == torch.int64
