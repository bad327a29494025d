"""``ember bench giou`` and bench/ragged_suite.py, run in-process on the CPU at tiny sizes.

These check the harness (every variant measured and checked, tables, JSON, plot, failures reported
in the table), not speed: timings are never asserted. Inductor is swapped for a backend that
compiles in a second (its cold start alone is ~20 s on a 2-core machine); the real one runs in
``ember bench giou`` itself.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from ember import cli
from ember.workloads import giou_bench

ROOT = Path(__file__).resolve().parents[1]


def fast_inductor(fn):
    return torch.compile(fn, backend="aot_eager")


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(giou_bench, "compile_with_inductor", fast_inductor)


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["bench", "giou", *args])
    return code, capsys.readouterr().out


def test_every_variant_measured_and_correct(quick, capsys, tmp_path):
    out_json = tmp_path / "giou.json"
    code, out = run_cli(capsys, "--device", "cpu", "--batch", "16", "--reps", "1",
                        "--batches-for-recompiles", "3", "--json", str(out_json))
    assert code == 0
    results = json.loads(out_json.read_text())
    rows = {r["key"]: r for r in results["variants"]}
    assert list(rows) == list(giou_bench.VARIANTS)
    tol = results["meta"]["tolerance"]
    for key, r in rows.items():
        label = giou_bench.VARIANTS[key]
        assert label in out
        assert r.get("error") is None, (key, r.get("error"))
        for field in ("fwd_s", "train_s"):
            assert isinstance(r[field], float) and math.isfinite(r[field]) and r[field] > 0, (key, field)
        assert r["loss_err"] <= tol and r["grad_err"] <= tol, (key, r["loss_err"], r["grad_err"])
    # CPU launch counts: ATen calls of the eager variants, ember's kernels + ATen calls
    assert rows["loop"]["launches_train"] > rows["pad"]["launches_train"] > 0
    assert rows["ember-ragged"]["launches_fwd"] >= 1
    assert results["h2d"] is None and "n/a on the CPU" in out
    rc = results["recompiles"]
    assert rc["batches"] == 3 and rc["error"] is None and rc["distinct_box_totals"] >= 2
    assert "vs Inductor" in out and "recompiles: ember(ragged) over 3 batches" in out


def test_json_round_trip_and_plot(quick, capsys, tmp_path, monkeypatch):
    out_json = tmp_path / "giou.json"
    code, out = run_cli(capsys, "--device", "cpu", "--batch", "8", "--reps", "1", "--variants", "pad,ember-pad",
                        "--batches-for-recompiles", "0", "--json", str(out_json))
    assert code == 0
    results = giou_bench.load_json(out_json)
    assert [r["variant"] for r in results["variants"]] == ["pad + mask", "ember(pad)"]
    table = out[out.index("# GIoU loss"):out.index("wrote ")]
    code, again = run_cli(capsys, "--from-json", str(out_json))
    assert code == 0 and table.strip() in again  # the same tables, printed from the file

    # without matplotlib: a clear message and a failing exit (the chart asked for is not written),
    # before a study of minutes starts
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, msg = run_cli(capsys, "--from-json", str(out_json), "--plot", str(tmp_path / "none.png"))
    assert code == 2 and "matplotlib is not installed" in msg and "--from-json" in msg
    assert not (tmp_path / "none.png").exists()
    code, msg = run_cli(capsys, "--device", "cpu", "--batch", "8", "--plot", str(tmp_path / "none.png"))
    assert code == 2 and "matplotlib is not installed" in msg and "GIoU study" not in msg
    assert "not plotting" in giou_bench.plot(results, tmp_path / "none.png")


def test_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    results = {"meta": {"batch": 4, "dtype": "fp32", "device": "cpu", "machine": "test"},
               "variants": [{"variant": "a", "fwd_s": 1e-4, "train_s": 3e-4},
                            {"variant": "b", "fwd_s": 2e-2, "train_s": None, "error": "x"},
                            {"variant": "c", "fwd_s": None, "train_s": None}]}
    path = tmp_path / "giou.png"
    giou_bench.save_json(results, tmp_path / "r.json")
    assert giou_bench.plot(giou_bench.load_json(tmp_path / "r.json"), path) == f"wrote {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_variant_is_reported_not_raised(monkeypatch, capsys, tmp_path):
    def broken(fn):
        raise RuntimeError("Inductor needs a C++ compiler")
    monkeypatch.setattr(giou_bench, "compile_with_inductor", broken)
    out_json = tmp_path / "giou.json"
    code, out = run_cli(capsys, "--device", "cpu", "--batch", "8", "--reps", "1", "--variants", "pad,inductor",
                        "--batches-for-recompiles", "0", "--json", str(out_json))
    assert code == 0
    assert "torch.compile(pad) | failed: RuntimeError: Inductor needs a C++ compiler" in out
    rows = {r["key"]: r for r in giou_bench.load_json(out_json)["variants"]}
    assert rows["pad"]["fwd_s"] > 0 and "needs a C++ compiler" in rows["inductor"]["error"]


def test_non_finite_errors_survive_json(tmp_path):
    results = {"x": [float("inf"), float("nan"), 1.0]}
    giou_bench.save_json(results, tmp_path / "r.json")
    text = (tmp_path / "r.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert math.isinf(giou_bench._num(json.loads(text)["x"][0]))


def test_cuda_without_a_gpu_is_an_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code, out = run_cli(capsys, "--device", "cuda", "--batch", "4")
    assert code == 2 and "no CUDA device" in out


def test_files_that_are_no_results_and_outputs_that_cannot_be_written_are_errors(capsys, tmp_path):
    # tracebacks before (KeyError 'meta', JSONDecodeError), and an unwritable --json failed only
    # after the whole study
    (tmp_path / "other.json").write_text('{"a": 1}')
    (tmp_path / "text.json").write_text("not json")
    for name, message in (("other.json", "no results"), ("text.json", "not JSON")):
        code, out = run_cli(capsys, "--from-json", str(tmp_path / name))
        assert code == 2 and message in out, out
    code, out = run_cli(capsys, "--device", "cpu", "--batch", "4", "--json", str(tmp_path / "missing" / "r.json"))
    assert code == 2 and "cannot write" in out and "GIoU study" not in out, out


def load_suite():
    spec = importlib.util.spec_from_file_location("ragged_suite", ROOT / "bench" / "ragged_suite.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ragged_suite"] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["ragged_suite"]
    return module


def test_ragged_suite_smoke(monkeypatch):
    suite = load_suite()
    monkeypatch.setattr(suite, "compile_with_inductor", fast_inductor)
    sizes = suite.Sizes(pool_docs=5, pool_max_len=7, pool_width=8, softmax_docs=6, softmax_max_len=9,
                        ce_seqs=4, ce_max_len=6, ce_vocab=16)
    results = suite.run_suite("cpu", "fp32", reps=1, sizes=sizes, log=lambda s: None)
    rows = results["rows"]
    assert {(r["case"], r["key"]) for r in rows} == {(c, v) for c in suite.CASES for v in suite.DEFAULT_VARIANTS}
    for r in rows:
        assert r.get("error") is None, (r["case"], r["key"], r.get("error"))
        assert r["fwd_s"] > 0 and r["train_s"] > 0
        assert r["ok"], (r["case"], r["key"], r["out_err"], r["grad_err"])
    text = suite.format_results(results)
    assert "ember ragged / padded Inductor" in text and "mean pooling" in text and "cross-entropy" in text
    assert "cuda_graph" not in text  # the CUDA-graph variants run on a GPU only


def test_gpu_results_print_from_json(tmp_path, capsys):
    """A GPU run's JSON (copies, kernel counts) prints and plots anywhere, e.g. on this CPU."""
    results = {
        "meta": {"device": "cuda", "machine": "NVIDIA H200", "warning": None, "batch": 1024, "dtype": "bf16",
                 "reps": 50, "boxes": 1932, "max_boxes_per_image": 9, "padded_to": 256, "tolerance": 1e-2,
                 "date": "2026-11-22", "launches": "cuda kernels"},
        "variants": [
            {"key": "inductor", "variant": "torch.compile(pad)", "fwd_s": 223e-6, "train_s": 583e-6,
             "launches_fwd": 5, "launches_train": 9, "loss_err": 1e-3, "grad_err": 2e-3, "error": None},
            {"key": "ember-ragged", "variant": "ember(ragged)", "fwd_s": 20e-6, "train_s": 45e-6,
             "launches_fwd": 1, "launches_train": 2, "loss_err": "nan", "grad_err": 1e-3, "error": None},
        ],
        "h2d": [{"layout": "list of tensors (one .to per image)", "copies": 1024, "bytes": 61824, "time_s": 4.4e-3},
                {"layout": "ragged (collate buffer + to_device)", "copies": 2, "bytes": 24000, "time_s": None,
                 "error": "RuntimeError: x"}],
        "recompiles": {"batches": 100, "boxes_min": 1800, "boxes_max": 2100, "distinct_box_totals": 90,
                       "dynamo_frames_compiled": 0, "dynamo_graphs": 0, "ember_graphs_compiled": 0,
                       "median_step_s": 5e-5, "error": None},
        "notes": [],
    }
    giou_bench.save_json(results, tmp_path / "gpu.json")
    code, out = run_cli(capsys, "--from-json", str(tmp_path / "gpu.json"))
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("| ember(ragged)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["ember(ragged)", "20.0 µs", "45.0 µs", "11.15x / 12.96x", "1 / 2", "nan / 1.0e-03 (over 1e-02)"]
    assert "4.40 ms" in out and "failed: RuntimeError: x" in out and "0 Dynamo frame(s) compiled" in out


def test_a_batch_without_boxes_has_a_loss_of_0_in_every_variant():
    # the ragged loss was a mean over no boxes (NaN, where the padded loss gives 0), and the
    # per-sample loop's 0 had no graph to pred, so its backward() raised
    from ember.ragged import from_list
    from ember.workloads.giou import padded_giou_loss, ragged_giou_loss

    pred = torch.rand(2, 256, 4, requires_grad=True)
    targets = [torch.zeros(0, 4), torch.zeros(0, 4)]
    losses = [padded_giou_loss(pred, torch.zeros(2, 256, 4)), ragged_giou_loss(pred, from_list(targets)),
              giou_bench.per_sample_loss(pred, targets), giou_bench.concat_loss(pred, targets)]
    for loss in losses:
        assert loss.item() == 0
        (grad,) = torch.autograd.grad(loss, pred)
        assert torch.equal(grad, torch.zeros_like(pred))
