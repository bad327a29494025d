"""ember.ragged: the packed Ragged tensor, its conversions, collate and to_device."""

from __future__ import annotations

import pickle
import time
import warnings
from collections import namedtuple

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader, Dataset

from ember import ragged
from ember.ragged import Ragged

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
FEATURES = [(), (4,), (2, 3)]
LENGTHS = [[3, 0, 5, 1], [0], [7], [0, 0, 0], [2, 2]]


def make_rows(lengths: list[int], feature: tuple[int, ...] = (4,), dtype: torch.dtype = torch.float32,
              seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        x = torch.randn((n, *feature), generator=gen) * 10
        rows.append(x > 0 if dtype == torch.bool else x.to(dtype))
    return rows


def storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class CountOps(TorchFunctionMode):
    """Counts torch calls, to prove an op's work does not grow with B in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


# ---- construction and validation ----------------------------------------------------------------

def test_construct_and_properties():
    values, offsets = torch.randn(9, 4), torch.tensor([0, 3, 3, 8, 9])
    r = Ragged(values, offsets)
    assert r.values is values and r.offsets is offsets
    assert (r.batch_size, len(r), r.total_length, r.max_length) == (4, 4, 9, 5)
    assert r.feature_shape == torch.Size([4]) and r.dtype == torch.float32 and r.device == torch.device("cpu")
    assert r.lengths().tolist() == [3, 0, 5, 1] and r.lengths().dtype == torch.int64
    assert repr(r) == "Ragged(B=4, T=9, max_length=5, feature=(4,), dtype=float32)"
    assert Ragged(values, offsets, 7).max_length == 7  # an upper bound is allowed
    r32 = Ragged(torch.zeros(3), torch.tensor([0, 1, 3], dtype=torch.int32))
    assert r32.lengths().dtype == torch.int32 and r32.max_length == 2


@pytest.mark.parametrize("values, offsets, kwargs, error, match", [
    ([1.0, 2.0], torch.tensor([0, 2]), {}, TypeError, "values must be a torch.Tensor, got list"),
    (torch.zeros(2), [0, 2], {}, TypeError, "offsets must be a torch.Tensor, got list"),
    (torch.tensor(1.0), torch.tensor([0]), {}, ValueError, "at least one dimension"),
    (torch.zeros(2), torch.tensor([[0, 2]]), {}, ValueError, r"offsets must be 1-D, got shape \(1, 2\)"),
    (torch.zeros(2), torch.tensor([0.0, 2.0]), {}, ValueError, "int32 or int64, got torch.float32"),
    (torch.zeros(2), torch.tensor([0, 2], dtype=torch.int16), {}, ValueError, "int32 or int64"),
    (torch.zeros(0), torch.zeros(0, dtype=torch.int64), {}, ValueError, "at least 1 element"),
    (torch.zeros(3), torch.tensor([1, 3]), {}, ValueError, r"must start at 0, got offsets\[0\] = 1"),
    (torch.zeros(4), torch.tensor([0, 3, 2, 4]), {}, ValueError,
     r"non-decreasing, but offsets\[2\] = 2 < offsets\[1\] = 3"),
    (torch.zeros(5), torch.tensor([0, 1, 2, 5, 4, 5]), {}, ValueError, r"offsets\[4\] = 4 < offsets\[3\] = 5"),
    (torch.zeros(5), torch.tensor([0, 2, 4]), {}, ValueError, "offsets end at 4 but values has 5 rows"),
    (torch.zeros(5), torch.tensor([0]), {}, ValueError, "offsets end at 0 but values has 5 rows"),
    (torch.zeros(3), torch.tensor([0, 3], device="meta"), {}, ValueError, "offsets are on meta but values are on cpu"),
    (torch.zeros(3), torch.tensor([0, 1, 3]), {"max_length": 1}, ValueError,
     r"max_length 1 is smaller than the longest row \(2\)"),
    (torch.zeros(3), torch.tensor([0, 1, 3]), {"max_length": -1}, ValueError, "max_length must be >= 0, got -1"),
    (torch.zeros(3), torch.tensor([0, 1, 3]), {"max_length": 2.0}, TypeError, "max_length must be an int"),
])
def test_validation_errors(values, offsets, kwargs, error, match):
    with pytest.raises(error, match=match):
        Ragged(values, offsets, **kwargs)


def test_validate_false_skips_data_checks_only():
    r = Ragged(torch.zeros(3), torch.tensor([0, 5, 3]), 5, validate=False)  # not checked: caller's promise
    assert r.batch_size == 2
    with pytest.raises(ValueError, match="int32 or int64"):
        Ragged(torch.zeros(3), torch.tensor([0.0, 3.0]), 3, validate=False)
    with pytest.raises(ValueError, match="1-D"):
        Ragged(torch.zeros(3), torch.tensor([[0, 3]]), 3, validate=False)
    assert Ragged(torch.zeros(3), torch.tensor([0, 1, 3]), validate=False).max_length == 2  # still computed


# ---- rows ------------------------------------------------------------------------------------------

def test_rows_getitem_iter_and_to_list_are_views():
    rows = make_rows([3, 0, 5])
    r = ragged.from_list(rows)
    for i, row in enumerate(rows):
        assert torch.equal(r[i], row) and torch.equal(r[i - 3], row)
    assert all(storage_ptr(x) == storage_ptr(r.values) for x in r.to_list())
    assert [x.shape[0] for x in r] == [3, 0, 5]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        r[3]
    with pytest.raises(TypeError, match="must be ints"):
        r[0:1]


@pytest.mark.parametrize("lengths", LENGTHS)
def test_row_ids_and_positions_match_python_loop(lengths):
    r = ragged.from_list(make_rows(lengths))
    ids = [b for b, n in enumerate(lengths) for _ in range(n)]
    pos = [p for n in lengths for p in range(n)]
    assert r.row_ids().tolist() == ids and r.positions().tolist() == pos
    assert r.row_ids().dtype == torch.int64 and r.positions().dtype == torch.int64
    dense = torch.randn(len(lengths), max(lengths + [1]), 4)
    gathered = dense[r.row_ids(), r.positions()]
    assert torch.equal(gathered, torch.cat([dense[b, :n] for b, n in enumerate(lengths)]))


def test_row_ids_with_int32_offsets():
    r = ragged.from_list(make_rows([2, 0, 3]), offsets_dtype=torch.int32)
    assert r.offsets.dtype == torch.int32
    assert r.row_ids().tolist() == [0, 0, 2, 2, 2] and r.positions().tolist() == [0, 1, 0, 1, 2]


# ---- from_list / from_padded / to_padded -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_round_trips(dtype, feature, lengths):
    rows = make_rows(lengths, feature, dtype)
    r = ragged.from_list(rows)
    assert (r.batch_size, r.total_length, r.max_length) == (len(lengths), sum(lengths), max(lengths))
    assert r.feature_shape == feature and r.dtype == dtype and r.offsets.dtype == torch.int64
    assert all(torch.equal(a, b) for a, b in zip(r.to_list(), rows))

    pad = True if dtype == torch.bool else 7
    padded = r.to_padded(padding_value=pad)
    assert padded.shape == (len(lengths), max(lengths), *feature) and padded.dtype == dtype
    for b, (row, n) in enumerate(zip(rows, lengths)):
        assert torch.equal(padded[b, :n], row)
        assert (padded[b, n:] == pad).all()

    back = ragged.from_padded(padded, r.lengths())
    assert torch.equal(back.values, r.values) and torch.equal(back.offsets, r.offsets)
    assert back.max_length == r.max_length
    from_list_lengths = ragged.from_padded(padded, lengths)
    assert torch.equal(from_list_lengths.values, r.values)


def test_edge_cases_b1_t0_b0():
    one = ragged.from_list([torch.arange(4.0)[:, None]])
    assert one.batch_size == 1 and one.to_padded().shape == (1, 4, 1)
    empty_rows = ragged.from_list([torch.zeros(0, 3), torch.zeros(0, 3)])
    assert empty_rows.total_length == 0 and empty_rows.max_length == 0
    assert empty_rows.to_padded().shape == (2, 0, 3) and empty_rows.row_ids().shape == (0,)
    assert ragged.from_padded(torch.zeros(2, 0, 3), [0, 0]).total_length == 0
    none = ragged.from_list([], feature_shape=(3,), dtype=torch.bfloat16)
    assert (none.batch_size, none.total_length, none.max_length) == (0, 0, 0)
    assert none.values.shape == (0, 3) and none.dtype == torch.bfloat16
    assert none.to_padded().shape == (0, 0, 3) and none.to_list() == []
    assert ragged.from_padded(torch.zeros(0, 5, 3), torch.zeros(0, dtype=torch.int64)).batch_size == 0
    Ragged(none.values, none.offsets)  # B = 0 validates


def test_from_list_errors():
    with pytest.raises(ValueError, match="empty list needs feature_shape= and dtype="):
        ragged.from_list([])
    with pytest.raises(TypeError, match="item 1 is a list"):
        ragged.from_list([torch.zeros(2), [1.0]])
    with pytest.raises(ValueError, match=r"item 1 has feature shape \(3,\), item 0 has \(4,\)"):
        ragged.from_list([torch.zeros(2, 4), torch.zeros(2, 3)])
    with pytest.raises(ValueError, match="item 1 has dtype torch.float64"):
        ragged.from_list([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])
    with pytest.raises(ValueError, match="0-d tensor"):
        ragged.from_list([torch.tensor(1.0)])
    with pytest.raises(ValueError, match="dtype=torch.int64 but the tensors are torch.float32"):
        ragged.from_list([torch.zeros(2)], dtype=torch.int64)
    with pytest.raises(TypeError, match="list or tuple"):
        ragged.from_list(torch.zeros(2, 2))


def test_from_padded_errors():
    padded = torch.zeros(3, 4, 2)
    with pytest.raises(ValueError, match="lengths must be >= 0, got -1"):
        ragged.from_padded(padded, torch.tensor([1, -1, 2]))
    with pytest.raises(ValueError, match="a length of 5 exceeds the padded size 4"):
        ragged.from_padded(padded, [1, 5, 2])
    with pytest.raises(ValueError, match=r"lengths must have shape \(3,\) for a batch of 3, got \(2,\)"):
        ragged.from_padded(padded, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="2 lengths for a batch of 3"):
        ragged.from_padded(padded, [1, 2])
    with pytest.raises(TypeError, match="lengths must be integers"):
        ragged.from_padded(padded, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="padded"):
        ragged.from_padded(torch.zeros(3), [1, 1, 1])
    with pytest.raises(TypeError, match="numpy array of float64"):
        ragged.from_padded(padded, np.array([1.0, 2.0, 3.0]))


def test_from_padded_takes_numpy_lengths():
    # (a sampler's lengths array, as Ragged's max_length takes numpy integers)
    padded = torch.randn(3, 4, 2)
    for lengths in (np.array([1, 0, 3]), np.array([1, 0, 3], dtype=np.uint8), [np.int64(1), 0, np.int32(3)]):
        r = ragged.from_padded(padded, lengths)
        assert r.offsets.tolist() == [0, 1, 1, 4] and r.max_length == 3
        assert torch.equal(r.values, torch.cat([padded[0, :1], padded[2, :3]]))


def test_to_padded_max_length():
    r = ragged.from_list(make_rows([2, 4]))
    assert r.to_padded(max_length=6).shape == (2, 6, 4)
    with pytest.raises(ValueError, match=r"max_length 3 is smaller than the longest row \(4\)"):
        r.to_padded(max_length=3)
    loose = Ragged(r.values, r.offsets, 10)  # a loose bound: only the real longest row limits
    assert loose.to_padded().shape == (2, 10, 4) and loose.to_padded(max_length=4).shape == (2, 4, 4)
    assert r.to_padded(max_length=np.int64(5)).shape == (2, 5, 4)
    # checked as the constructor checks it (a float failed inside new_full, True padded to 1)
    for bad, error, message in ((5.0, TypeError, "got float"), ("4", TypeError, "got str"),
                                (True, TypeError, "got bool"), (-1, ValueError, "must be >= 0, got -1")):
        with pytest.raises(error, match=message):
            r.to_padded(max_length=bad)


def op_counts(batch: int) -> dict[str, int]:
    """Torch calls made by each op for a batch of B sequences (and a check of the results)."""
    gen = torch.Generator().manual_seed(batch)
    lengths = torch.randint(0, 6, (batch,), generator=gen)
    padded = torch.randn(batch, 6, 2, generator=gen)
    counts = {}
    with CountOps() as mode:
        r = ragged.from_padded(padded, lengths)
    counts["from_padded"] = mode.calls
    for name in ("to_padded", "row_ids", "positions", "lengths"):
        with CountOps() as mode:
            getattr(r, name)()
        counts[name] = mode.calls
    mask = (torch.arange(6) < lengths[:, None])[..., None]
    assert torch.equal(r.to_padded(max_length=6), padded * mask)
    return counts


def test_no_python_loop_over_the_batch():
    """Each op makes as many torch calls for B = 10000 as for B = 3, and B = 10000 is quick."""
    small = op_counts(3)
    start = time.perf_counter()
    large = op_counts(10_000)
    assert time.perf_counter() - start < 2.0
    assert small == large


# ---- torch.nested -------------------------------------------------------------------------------------

@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("offsets_dtype", [torch.int64, torch.int32])
def test_nested_round_trip(feature, offsets_dtype):
    r = ragged.from_list(make_rows([3, 1, 4], feature), offsets_dtype=offsets_dtype)
    nt = r.to_nested()
    assert nt.is_nested and nt.layout == torch.jagged and nt.size(0) == 3
    assert storage_ptr(nt.values()) == storage_ptr(r.values)  # a view, no copy
    assert all(torch.equal(a, b) for a, b in zip(nt.unbind(), r.to_list()))
    back = Ragged.from_nested(nt)
    assert torch.equal(back.values, r.values) and torch.equal(back.offsets, r.offsets)
    assert back.offsets.dtype == offsets_dtype and back.max_length == 4


def test_from_nested_built_by_torch_and_with_holes():
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(5, 3)], layout=torch.jagged)
    r = Ragged.from_nested(nt)
    assert r.lengths().tolist() == [2, 5] and r.max_length == 5
    holes = torch.nested.nested_tensor_from_jagged(torch.arange(6.0), torch.tensor([0, 2, 3, 6]),
                                                   torch.tensor([1, 1, 2]))
    compact = Ragged.from_nested(holes)
    assert compact.lengths().tolist() == [1, 1, 2] and compact.values.tolist() == [0.0, 2.0, 3.0, 4.0]


def test_from_nested_errors():
    with pytest.raises(ValueError, match="layout=torch.jagged"):
        Ragged.from_nested(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="nested tensor"):
        Ragged.from_nested([torch.zeros(2)])
    nt = torch.nested.nested_tensor([torch.randn(2, 3, 4), torch.randn(5, 3, 4)], layout=torch.jagged)
    with pytest.raises(ValueError, match="ragged dimension at dim 1"):
        Ragged.from_nested(nt.transpose(1, 2))


# ---- moving, copying, pytree, pickle ----------------------------------------------------------------------

def test_to_clone_and_pin_memory():
    r = ragged.from_list(make_rows([2, 3]))
    assert r.to("cpu") is r and r.to(torch.float32) is r
    half = r.to(torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.offsets is r.offsets and half.max_length == 3
    meta = r.to("meta")
    assert meta.device.type == "meta" and meta.offsets.device.type == "meta" and meta.max_length == 3
    copy = r.clone()
    copy.values.zero_()
    assert r.values.abs().sum() > 0 and torch.equal(copy.offsets, r.offsets)
    if torch.cuda.is_available():
        pinned = r.pin_memory()
        assert pinned.values.is_pinned() and pinned.offsets.is_pinned()
    else:
        with pytest.raises(RuntimeError):
            r.pin_memory()


def test_pytree_flatten_unflatten():
    r = ragged.from_list(make_rows([2, 0, 3]))
    leaves, spec = pytree.tree_flatten({"x": r, "y": 1})
    assert len(leaves) == 3 and leaves[0] is r.values and leaves[1] is r.offsets
    back = pytree.tree_unflatten(leaves, spec)["x"]
    assert isinstance(back, Ragged) and back.values is r.values and back.max_length == 3
    doubled = pytree.tree_map(lambda t: t * 2 if t.is_floating_point() else t, r)
    assert torch.equal(doubled.values, r.values * 2) and doubled.offsets is r.offsets
    keys = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(r)[0]]
    assert keys == [".values", ".offsets"]
    assert not hasattr(r, "__dict__")


def test_pickle():
    r = ragged.from_list(make_rows([2, 3]))
    back = pickle.loads(pickle.dumps(r))
    assert torch.equal(back.values, r.values) and torch.equal(back.offsets, r.offsets) and back.max_length == 3


# ---- collate and to_device ------------------------------------------------------------------------------------

def tuple_batch() -> list[tuple]:
    return [(torch.randn(n, 4), torch.arange(n + 1), torch.full((3,), float(n)), n, f"s{n}") for n in (2, 0, 5)]


def test_collate_tuples():
    batch = tuple_batch()
    feats, ids, dense, count, names = ragged.collate(batch)
    assert isinstance(feats, Ragged) and isinstance(ids, Ragged)
    assert feats.lengths().tolist() == [2, 0, 5] and ids.lengths().tolist() == [3, 1, 6]
    assert all(torch.equal(a, s[0]) for a, s in zip(feats.to_list(), batch))
    assert all(torch.equal(a, s[1]) for a, s in zip(ids.to_list(), batch))
    assert torch.equal(dense, torch.stack([s[2] for s in batch]))
    assert torch.equal(count, torch.tensor([2, 0, 5])) and names == ["s2", "s0", "s5"]
    # one buffer for all: ids (int64 values) and both offsets share its int64 region, feats has
    # the float32 one
    assert storage_ptr(ids.values) == storage_ptr(ids.offsets) == storage_ptr(feats.offsets) == storage_ptr(
        feats.values)
    assert ids._values_buffer is ids._offsets_buffer is feats._offsets_buffer
    assert feats._values_buffer.numel() == 7 * 4 and feats._values_buffer.dtype == torch.float32
    assert ids._values_buffer.numel() == 10 + 2 * 4
    assert feats.values.is_pinned() == torch.cuda.is_available()  # (pinned where an accelerator is)
    assert feats.max_length == 5 and ids.max_length == 6


def test_collate_dicts_share_one_buffer():
    batch = [{"a": torch.randn(n, 2), "b": torch.randn(2 * n), "mask": torch.ones(n, dtype=torch.bool),
              "label": torch.tensor(n % 2), "w": 0.5} for n in (1, 4, 3)]
    out = ragged.collate(batch)
    assert list(out) == ["a", "b", "mask", "label", "w"]
    a, b, mask = out["a"], out["b"], out["mask"]
    assert storage_ptr(a.values) == storage_ptr(b.values) == storage_ptr(a.offsets) == storage_ptr(mask.values)
    assert a._values_buffer is b._values_buffer and a._offsets_buffer is mask._offsets_buffer
    assert a._values_buffer.data_ptr() % 16 == 0 and mask._values_buffer.data_ptr() % 16 == 0  # aligned regions
    assert mask.dtype == torch.bool and mask.values.all()
    assert torch.equal(b.to_padded(), torch.nn.utils.rnn.pad_sequence([s["b"] for s in batch], batch_first=True))
    assert out["label"].tolist() == [1, 0, 1] and out["w"].dtype == torch.float64


def test_collate_ragged_fields_and_namedtuple():
    Sample = namedtuple("Sample", ["x", "y"])
    batch = [Sample(torch.randn(3, 2), torch.randn(3)) for _ in range(2)]
    out = ragged.collate(batch, ragged_fields=[0])
    assert isinstance(out, Sample) and isinstance(out.x, Ragged) and out.y.shape == (2, 3)
    as_dict = ragged.collate([{"x": torch.randn(2)}, {"x": torch.randn(2)}], ragged_fields=["x"])
    assert isinstance(as_dict["x"], Ragged) and as_dict["x"].lengths().tolist() == [2, 2]
    as_list = ragged.collate([[torch.randn(2), 1], [torch.randn(3), 2]])
    assert isinstance(as_list, list) and isinstance(as_list[0], Ragged)
    # samples' keys in different orders (dicts built from JSON, or merged): sample 0's order
    rows = [torch.randn(2), torch.randn(3)]
    reordered = ragged.collate([{"x": rows[0], "y": 1}, {"y": 2, "x": rows[1]}])
    assert list(reordered) == ["x", "y"] and reordered["y"].tolist() == [1, 2]
    assert torch.equal(reordered["x"].values, torch.cat(rows))


def test_collate_errors():
    with pytest.raises(ValueError, match="non-empty list"):
        ragged.collate([])
    with pytest.raises(ValueError, match="name it in ragged_fields"):
        ragged.collate([(torch.zeros(2), torch.zeros(1)), (torch.zeros(3), torch.zeros(1))], ragged_fields=[1])
    with pytest.raises(ValueError, match=r"rows of shape \(3,\) in sample 1 but \(2,\) in sample 0"):
        ragged.collate([(torch.zeros(1, 2),), (torch.zeros(2, 3),)])
    with pytest.raises(ValueError, match="torch.float64 in sample 1"):
        ragged.collate([(torch.zeros(1),), (torch.zeros(2, dtype=torch.float64),)])
    with pytest.raises(ValueError, match=r"sample 1 has keys \['b'\]"):
        ragged.collate([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])
    with pytest.raises(ValueError, match="is not a key"):
        ragged.collate([{"a": torch.zeros(1)}], ragged_fields=["z"])
    with pytest.raises(ValueError, match="out of range"):
        ragged.collate([(torch.zeros(1),)], ragged_fields=[3])
    with pytest.raises(TypeError, match="mixes tensors with int"):
        ragged.collate([(torch.zeros(1),), (1,)])
    with pytest.raises(ValueError, match="holds numbers"):
        ragged.collate([(1,), (2,)], ragged_fields=[0])


def test_collate_pin_memory_without_accelerator_warns():
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present: pinning works")
    with pytest.warns(UserWarning, match="not pinning"):
        out = ragged.collate(tuple_batch(), pin_memory=True)
    assert not out[0].values.is_pinned()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ragged.collate(tuple_batch())  # pin_memory=None: no attempt, no warning


def test_to_device_copies_the_buffer_once(monkeypatch):
    batch = ragged.collate(tuple_batch())
    copies = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(self.dtype) or to(self, *a, **k))
    moved = ragged.to_device(batch, "cpu", copy=True)
    monkeypatch.undo()
    assert copies == [torch.uint8, torch.float32, torch.int64]  # the ragged buffer, then the dense fields
    feats, ids, dense = moved[0], moved[1], moved[2]
    assert storage_ptr(feats.values) != storage_ptr(batch[0].values)  # a real copy ...
    assert storage_ptr(ids.values) == storage_ptr(ids.offsets) == storage_ptr(feats.offsets)  # ... still shared
    assert feats._values_buffer is not batch[0]._values_buffer and storage_ptr(dense) != storage_ptr(batch[2])
    for old, new in zip(batch[:2], moved[:2]):
        assert torch.equal(old.values, new.values) and torch.equal(old.offsets, new.offsets)
        assert new.max_length == old.max_length
    assert moved[3].tolist() == [2, 0, 5] and moved[4] == ["s2", "s0", "s5"]
    same = ragged.to_device(batch, "cpu")  # already there: no copy at all
    assert storage_ptr(same[0].values) == storage_ptr(batch[0].values)
    plain = ragged.to_device({"r": ragged.from_list(make_rows([1, 2])), "t": torch.ones(2)}, "meta")
    assert plain["r"].device.type == "meta" and plain["t"].device.type == "meta"


class VarLenDataset(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict:
        return {"tokens": torch.arange(i % 4 + 1), "boxes": torch.full((i % 3, 4), float(i)), "label": i}


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataloader(num_workers):
    pin = torch.cuda.is_available()  # the loader pins each field: the batch stays one pinned buffer
    loader = DataLoader(VarLenDataset(), batch_size=4, collate_fn=ragged.collate, num_workers=num_workers,
                        pin_memory=pin)
    seen = []
    for batch in loader:
        tokens, boxes = batch["tokens"], batch["boxes"]
        assert storage_ptr(tokens.offsets) == storage_ptr(boxes.values) and tokens.values.is_pinned() == pin
        batch = ragged.to_device(batch, "cpu", non_blocking=False)
        tokens, boxes = batch["tokens"], batch["boxes"]
        assert storage_ptr(tokens.offsets) == storage_ptr(boxes.offsets) == storage_ptr(tokens.values)
        for j, i in enumerate(batch["label"].tolist()):
            assert torch.equal(tokens[j], torch.arange(i % 4 + 1)) and boxes[j].shape == (i % 3, 4)
            seen.append(i)
    assert seen == list(range(10))


def test_segment_sum_counts_bools_and_max_length_takes_any_integer():
    # masked tokens per row: bool values are counted in int64, as Tensor.sum counts them (it
    # raised "segment_reduce: torch.bool values are not supported"); a numpy max_length raised
    import numpy as np

    r = ragged.Ragged(torch.tensor([True, False, True, True]), torch.tensor([0, 3, 3, 4]), max_length=np.int64(5))
    assert r.max_length == 5 and type(r.max_length) is int
    import ember

    expected = torch.tensor([2, 0, 1])
    assert torch.equal(ragged.segment_sum(r), expected)
    assert torch.equal(ember.compile(ragged.segment_sum)(r), expected)
    with pytest.raises(TypeError, match="max_length"):
        ragged.Ragged(torch.ones(4), torch.tensor([0, 4]), max_length=4.0)


def test_dataloader_pinning_keeps_a_batch_in_one_buffer(monkeypatch):
    # DataLoader(pin_memory=True) pins a batch field by field (Ragged.pin_memory each): the fields
    # pinned one by one landed in separate buffers, and the batch took a copy per tensor to the GPU
    from torch.utils.data._utils.pin_memory import pin_memory as dataloader_pin

    pinned_bytes = []

    def fake_pin(self, device=None):  # no accelerator here: a copy stands for the pinned one
        pinned_bytes.append(self.numel() * self.element_size())
        return self.clone()

    batch = ragged.collate(tuple_batch(), pin_memory=False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    pinned = dataloader_pin(batch)
    feats, ids = pinned[0], pinned[1]
    storage = feats.values.untyped_storage().data_ptr()
    assert storage != batch[0].values.untyped_storage().data_ptr()
    assert {t.untyped_storage().data_ptr() for t in (feats.values, feats.offsets, ids.values, ids.offsets)} == {storage}
    whole = batch[0].values.untyped_storage().nbytes()
    assert pinned_bytes.count(whole) == 1 and len(pinned_bytes) == 3  # the buffer once, two dense fields
    for new, old in zip(pinned[:2], batch[:2]):
        assert torch.equal(new.values, old.values) and torch.equal(new.offsets, old.offsets)
        assert new.max_length == old.max_length
    moved = ragged.to_device(pinned, "meta")  # still one buffer: one copy moves both fields
    assert moved[0].values.untyped_storage().data_ptr() == moved[1].offsets.untyped_storage().data_ptr()
    lone = ragged.from_list(make_rows([1, 2]))  # not from collate: both tensors pinned on their own
    assert torch.equal(lone.pin_memory().values, lone.values) and len(pinned_bytes) == 5


def test_collate_pins_nothing_in_a_dataloader_worker(monkeypatch):
    # a worker forked after the main process initialized CUDA cannot pin ("CUDA error:
    # initialization error" in every batch); DataLoader(pin_memory=True) pins in the main process
    import importlib

    collate_module = importlib.import_module("ember.ragged.collate")  # (the package's collate is the function)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert collate_module._should_pin(None)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    assert not collate_module._should_pin(None)
