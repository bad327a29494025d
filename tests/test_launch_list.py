"""``ember.cuda_graph`` launching a captured graph's kernels itself (runtime/launch_list.py): the
launches noted while a capture records, the check that they are the whole graph, and replays
that give what the graph gives."""

from __future__ import annotations

import ctypes
import warnings

import pytest
import torch

import ember
from ember import cudagraphs
from ember.ragged import Ragged, jagged_softmax, segment_mean
from ember.runtime import launch_list
from ember.workloads.giou import make_batch, ragged_giou_loss
from ember.workloads.giou_bench import pack

from .conftest import DEVICE

gpu = pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda",
                         reason="CUDA graphs need a GPU (EMBER_TEST_DEVICE=cuda)")


def _noted(launches: launch_list.LaunchList, name: str, grid=(4, 1, 1), stream: int = 7, values=(16, 2.5)):
    slots = [ctypes.c_void_p(values[0]), ctypes.c_float(values[1])]
    launches.note(name, 0x1000 + len(launches), grid, (128, 1, 1), 0, stream, slots)
    return slots


def test_a_launch_keeps_the_argument_values_it_was_made_with():
    """A launcher refills its argument slots for its next launch; the noted launch keeps copies,
    and its argument array points at them."""
    launches = launch_list.LaunchList()
    slots = _noted(launches, "k")
    slots[0].value, slots[1].value = 99, -1.0
    launch = launches.launches[0]
    assert launch.arguments[0].value == 16 and launch.arguments[1].value == 2.5
    argv = ctypes.cast(launch.argv, ctypes.POINTER(ctypes.c_void_p))
    assert ctypes.c_void_p.from_address(argv[0]).value == 16
    assert ctypes.c_float.from_address(argv[1]).value == 2.5
    assert launch.signature() == (0x1000, 4, 1, 1, 128, 1, 1, 0)


def test_launches_match_a_graph_only_when_they_are_all_of_it():
    launches = launch_list.LaunchList()
    _noted(launches, "a")
    _noted(launches, "b", grid=(2, 3, 1))
    nodes = [launch.signature() for launch in launches.launches]
    assert launches.matches(nodes, stream=7)
    assert launches.matches(nodes[::-1], stream=7)               # the driver's node order is its own
    assert not launches.matches(None, stream=7)                  # a node that is no kernel (a copy, a fill)
    assert not launches.matches(nodes + [(0x2000, 1, 1, 1, 32, 1, 1, 0)], stream=7)  # an ATen kernel too
    assert not launches.matches(nodes[:1], stream=7)             # a launch the capture did not record
    assert not launches.matches([nodes[0], (0x1001, 2, 1, 1, 128, 1, 1, 0)], stream=7)  # another grid
    assert not launches.matches(nodes, stream=8)                 # launched on another stream


def test_launchers_note_only_while_a_list_records():
    assert not launch_list.recording_active()
    with launch_list.record() as outer:
        with launch_list.record() as inner:
            assert launch_list.recording_active()
            launch_list.note("k", 0x10, (1, 1, 1), (32, 1, 1), 0, 7, [ctypes.c_int64(3)])
        launch_list.note("j", 0x11, (1, 1, 1), (32, 1, 1), 0, 7, [])
    assert not launch_list.recording_active()
    assert [launch.name for launch in outer.launches] == ["k", "j"]
    assert [launch.name for launch in inner.launches] == ["k"]


class _FakeGraph:
    def raw_cuda_graph(self) -> int:
        return 1234


def _launched_with(monkeypatch, replay: str, n: int, nodes_match: bool = True):
    launches = launch_list.LaunchList()
    for i in range(n):
        _noted(launches, f"k{i}")
    nodes = [launch.signature() for launch in launches.launches] if nodes_match else None
    monkeypatch.setattr(launch_list, "graph_kernel_nodes", lambda raw: nodes if raw == 1234 else None)

    class _Stream:
        cuda_stream = 7
    step = ember.cuda_graph(lambda x: x, replay=replay)
    return step._launched(_FakeGraph(), launches, _Stream(), torch.device("cuda", 0))


def test_which_captures_are_launched(monkeypatch):
    """'auto' launches a graph of ember's kernels up to the limit; 'launches' at any count;
    'graph' never; a graph with anything else in it is always replayed as a graph."""
    limit = cudagraphs.LAUNCH_LIMIT
    assert _launched_with(monkeypatch, "auto", 1) is not None
    assert _launched_with(monkeypatch, "auto", limit) is not None
    assert _launched_with(monkeypatch, "auto", limit + 1) is None
    assert _launched_with(monkeypatch, "launches", limit + 1) is not None
    assert _launched_with(monkeypatch, "graph", 1) is None
    for replay in ("auto", "launches"):
        assert _launched_with(monkeypatch, replay, 2, nodes_match=False) is None


def test_replay_argument_is_checked():
    with pytest.raises(ValueError, match="replay must be one of auto, graph, launches"):
        ember.cuda_graph(lambda x: x, replay="kernels")


# ---- on a GPU --------------------------------------------------------------------------------

def _softmax(r: Ragged) -> torch.Tensor:
    return jagged_softmax(r).values


def _ragged(seed: int, rows: int = 8, width: int = 48, dtype=torch.float32) -> Ragged:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 30, (rows,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    values = torch.randn(int(lengths.sum()), width, generator=g).to(dtype)
    return Ragged(values.cuda(), offsets.cuda())


def _only_capture(step: cudagraphs.CudaGraphStep) -> cudagraphs._Capture:
    (entry,) = step.captures.values()
    return entry


@gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_launched_forward_matches_eager_over_batches_of_any_total(backend, dtype):
    """A ragged softmax under ``cuda_graph``: one kernel, so the capture's calls launch it
    themselves, reading each batch's total from the offsets as the graph's kernel would."""
    softmax = ember.compile(_softmax, options={"gpu_backend": backend})

    def forward(r: Ragged) -> torch.Tensor:
        with torch.no_grad():
            return softmax(r)

    launched = ember.cuda_graph(forward)
    graphed = ember.cuda_graph(forward, replay="graph")
    for seed in range(5):
        r = _ragged(seed, dtype=dtype)
        a = launched(r)[:r.total_length].clone()
        b = graphed(r)[:r.total_length].clone()
        torch.testing.assert_close(a, _softmax(r))
        assert torch.equal(a, b)
    entry = _only_capture(launched)
    assert entry.launches is not None and len(entry.launches) >= 1
    assert _only_capture(graphed).launches is None


@gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_a_launched_training_step_gives_the_graphs_loss_and_gradients(backend):
    """The GIoU step (forward and backward kernels) launched as replayed, against eager in
    float64, for box counts that change."""
    loss_fn = ember.compile(ragged_giou_loss, options={"gpu_backend": backend})

    def step(p, targets):
        p.grad = None
        loss = loss_fn(p, targets)
        loss.backward()
        return loss

    pred, _, _ = make_batch(48, torch.float32, 0)
    pred = pred.cuda().requires_grad_()
    launched = ember.cuda_graph(step, replay="launches")
    for seed in range(4):
        _, targets, _ = make_batch(48, torch.float32, seed)
        r = pack(targets, torch.device("cuda"))
        loss = launched(pred, r)
        p64 = pred.detach().double().requires_grad_()
        ref = ragged_giou_loss(p64, r.to(torch.float64))
        ref.backward()
        torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pred.grad.double(), p64.grad, rtol=1e-4, atol=1e-7)
    assert all(entry.launches is not None for entry in launched.captures.values())


@gpu
def test_a_graph_with_aten_work_in_it_is_replayed_as_a_graph():
    """An eager op inside the step (its kernel is no launch of ember's) keeps the graph replay,
    whatever ``replay`` asks."""
    pool = ember.compile(segment_mean)

    def forward(r: Ragged, w: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return pool(r) @ w  # cuBLAS's kernel, in the graph beside ember's

    w = torch.randn(48, 8, device="cuda")
    step = ember.cuda_graph(forward, replay="launches")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(3):
            r = _ragged(seed)
            torch.testing.assert_close(step(r, w), segment_mean(r) @ w, rtol=1e-4, atol=1e-5)
    assert all(entry.launches is None for entry in step.captures.values())


@gpu
def test_launches_follow_the_current_stream():
    """Replayed launches go to the caller's current stream, as a graph replay does."""
    softmax = ember.compile(_softmax)

    def forward(r: Ragged) -> torch.Tensor:
        with torch.no_grad():
            return softmax(r)

    step = ember.cuda_graph(forward)
    r = _ragged(0)
    step(r)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        r2 = _ragged(1)
        out = step(r2)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    torch.testing.assert_close(out[:r2.total_length], _softmax(r2))
