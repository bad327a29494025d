"""``ember bench giou``: the seed article's GIoU study, re-measured on this machine.

Why it exists: the article (../shared/seeds/custom-operators-dynamic-shapes.txt) weighs a
per-sample loop, concatenation and padding + mask against a hand-written CUDA kernel for a loss
over a different number of boxes per image. ember's claim is that the plain ragged code, compiled,
beats all of them, with its backward, for any dtype and box count, without recompiles. This
module measures exactly that, side by side on the same inputs and in one process:

* seven variants: per-sample loop, concatenation, padding + mask (eager), torch.compile on the
  padded code (Inductor), ember on the padded code (as written, and with the ``skip_masked``
  option: padded boxes neither loaded nor computed), ember on the ragged code;
* forward (under ``no_grad``) and forward + backward (gradient to the predictions) times, medians
  of interleaved runs after warm-up (CUDA events on a GPU);
* every variant's loss and gradient against a float64 eager reference;
* kernel launches per step (torch.profiler on a GPU; on a CPU, ATen calls of the eager variants
  and kernels + ATen calls of ember's compiled programs);
* the host-to-device copy of the targets as a list of tensors, one padded tensor, or
  ``ember.ragged.collate``'s packed buffer (GPU only);
* recompiles of the ragged variant over many batches with different box counts.

Results print as tables, save as JSON (``--json``) and plot as a log-scale bar chart
(``--plot``, needs matplotlib; a JSON file can be plotted later with ``--from-json``).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..ragged import Ragged, collate, to_device
from .giou import (
    MAX_BOXES,
    box_counts,
    generalized_box_iou_loss,
    make_batch,
    padded_giou_loss,
    ragged_giou_loss,
    random_boxes,
)
from .timing import (
    DTYPES,
    TOLERANCE,
    busy_warning,
    count_aten_calls,
    count_cuda_kernels,
    describe,
    format_time,
    machine,
    median_times,
    poison_cuda,
    rel_error,
    save_json,
    synchronize,
    table,
    wall_time,
)

# key (for --variants) -> label (tables, JSON, plot), in the article's order
VARIANTS = {
    "loop": "per-sample loop",
    "concat": "concatenate",
    "pad": "pad + mask",
    "inductor": "torch.compile(pad)",
    "ember-pad": "ember(pad)",
    "ember-pad-skip": "ember(pad, skip_masked)",
    "ember-ragged": "ember(ragged)",
}
BASELINE = "inductor"
SLOW = {"loop": 3}  # at most this many timed repetitions (a B=1024 loop backward takes seconds)


def per_sample_loss(pred: torch.Tensor, targets: list[torch.Tensor]) -> torch.Tensor:
    """The article's first loss: one GIoU call per image, B times the kernels.

    The running sum is float32: the article's sum in the predictions' dtype loses ~20% of the
    loss in bfloat16 over 1024 images (a sum near 2000 has an ulp of 16), and this variant is
    here for its launch count, not for that rounding."""
    total, loss_sum = 0, pred.new_zeros((), dtype=torch.float32)
    for i, t in enumerate(targets):
        n = t.shape[0]
        if n > 0:
            total += n
            loss_sum = loss_sum + generalized_box_iou_loss(pred[i, :n], t).sum()
    if total == 0:  # no boxes: a 0 that still reaches pred, so backward() runs as for the others
        return pred[:, :0].sum()
    return (loss_sum / max(total, 1)).to(pred.dtype)


def concat_loss(pred: torch.Tensor, targets: list[torch.Tensor]) -> torch.Tensor:
    """The article's second loss: concatenate the targets and the matched predictions, one call."""
    counts = [t.shape[0] for t in targets]
    matched = torch.cat([pred[i, :n] for i, n in enumerate(counts)])
    return generalized_box_iou_loss(matched, torch.cat(targets)).sum() / max(sum(counts), 1)


def random_targets(batch: int, seed: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """A batch's targets only (no predictions), for the recompile run: same distribution as
    ``make_batch``, cheaper to draw 100 times."""
    g = torch.Generator().manual_seed(seed)
    counts = box_counts(batch, g)
    boxes = random_boxes(int(counts.sum()), g).to(dtype)
    return list(boxes.split(counts.tolist()))


def pack(targets: list[torch.Tensor], device: torch.device) -> Ragged:
    """The targets as a data loader would deliver them: ``collate`` packs them into one (pinned,
    when a GPU is present) buffer, ``to_device`` moves it in one copy per buffer."""
    return to_device(collate([(t,) for t in targets], ragged_fields=[0]), device)[0]


def run_study(device: str = "cpu", batch: int = 1024, dtype: str = "fp32", reps: int = 20,
              recompile_batches: int = 100, variants: list[str] | None = None, seed: int = 0,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every variant; returns the JSON-ready results (see ``format_results``)."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device here")
    torch_dtype = DTYPES[dtype]
    keys = variants or list(VARIANTS)
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    cuda = dev.type == "cuda"
    host, warning = machine(dev), busy_warning(dev)  # before the run: the load is other jobs', not ours

    pred_cpu, targets_cpu, padded_cpu = make_batch(batch, torch_dtype, seed)
    counts = [t.shape[0] for t in targets_cpu]
    pinned = [t.pin_memory() if cuda and t.numel() else t for t in targets_cpu]
    padded_pinned = padded_cpu.pin_memory() if cuda else padded_cpu
    targets_dev = [t.to(dev) for t in pinned]
    padded_dev = padded_pinned.to(dev)
    ragged_dev = pack(targets_cpu, dev)
    pred = pred_cpu.to(dev).requires_grad_()

    # float64 reference: loss and gradient to the predictions
    pred64 = pred.detach().double().requires_grad_()
    ref_loss = padded_giou_loss(pred64, padded_dev.double())
    ref_loss.backward()
    ref_grad = pred64.grad

    reports: dict[str, Any] = {}
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    errors: dict[str, str] = {}
    for key in keys:
        try:
            fns[key] = _variant(key, targets_dev, padded_dev, ragged_dev, reports)
        except Exception as e:  # noqa: BLE001 -- e.g. a backend that cannot be built here
            errors[key] = describe(e)

    tol = TOLERANCE[torch_dtype]
    rows: dict[str, dict[str, Any]] = {k: {"key": k, "variant": VARIANTS[k]} for k in keys}
    graphs_of: dict[str, tuple[list[Any], list[Any]]] = {}
    for key, fn in list(fns.items()):
        log(f"  checking {VARIANTS[key]} ...")
        try:
            if cuda:
                poison_cuda()
            report = reports.get(key)
            n0 = len(report.graphs) if report is not None else 0
            with torch.no_grad():
                fwd_loss = fn(pred)
            n1 = len(report.graphs) if report is not None else 0
            pred.grad = None
            loss = fn(pred)
            loss.backward()
            synchronize(dev)
            n2 = len(report.graphs) if report is not None else 0
            if report is not None:
                graphs_of[key] = (report.graphs[n0:n1], report.graphs[n1:n2])
            loss_err = max(rel_error(fwd_loss, ref_loss), rel_error(loss, ref_loss))
            grad_err = rel_error(pred.grad, ref_grad)
            rows[key].update(loss_err=loss_err, grad_err=grad_err, ok=loss_err <= tol and grad_err <= tol)
            log(f"    relative error: loss {loss_err:.1e}, gradient {grad_err:.1e}")
        except Exception as e:  # noqa: BLE001
            errors[key] = describe(e)
            del fns[key]
            log(f"    failed: {errors[key]}")

    def forward(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], Any]:
        def step() -> Any:
            with torch.no_grad():
                return fn(pred)
        return step

    def train(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], Any]:
        def step() -> Any:
            pred.grad = None
            fn(pred).backward()
        return step

    reps_of = {k: min(reps, n) for k, n in SLOW.items()}
    log("  timing the forward ...")
    fwd_times = median_times({k: forward(f) for k, f in fns.items()}, dev, reps, reps_of=reps_of, errors=errors)
    log("  timing forward + backward ...")
    train_times = median_times({k: train(f) for k, f in fns.items()}, dev, reps, reps_of=reps_of, errors=errors)
    for key in keys:
        rows[key].update(fwd_s=fwd_times.get(key), train_s=train_times.get(key), error=errors.get(key))
    for title, times in (("forward", fwd_times), ("forward + backward", train_times)):
        log(f"    {title}: " + ", ".join(f"{VARIANTS[k]} {format_time(t)}" for k, t in times.items()))

    log("  counting launches ...")
    for key, fn in fns.items():
        if key in errors:
            continue
        rows[key].update(_launches(key, fn, pred, cuda, forward, train, graphs_of.get(key)))

    h2d = _host_to_device(pinned, padded_pinned, targets_cpu, dev, reps) if cuda else None
    recompiles = None
    if "ember-ragged" in fns and "ember-ragged" not in errors and recompile_batches > 0:
        log(f"  {recompile_batches} batches with different box counts through ember(ragged) ...")
        recompiles = _recompiles(fns["ember-ragged"], pred, batch, torch_dtype, dev, recompile_batches, seed)

    notes = []
    for key, report in reports.items():
        for g in report.graphs:
            line = f"{VARIANTS[key]} {g.name} ({g.kind}): {len(g.kernels)} kernel(s)"
            line += f", ATen: {', '.join(g.fallbacks)}" if g.fallbacks else ", no ATen calls"
            notes.append(line + (f"; not compiled: {g.error}" if g.error else ""))
    return {
        "meta": {"device": str(dev), "machine": host, "warning": warning, "batch": batch, "dtype": dtype, "reps": reps,
                 "boxes": sum(counts), "max_boxes_per_image": max(counts, default=0),
                 "padded_to": MAX_BOXES, "tolerance": tol, "seed": seed,
                 "date": datetime.date.today().isoformat(), "launches": "cuda kernels" if cuda else
                 "cpu: ATen calls (eager), kernels + ATen calls (ember); n/a for Inductor"},
        "variants": [rows[k] for k in keys],
        "h2d": h2d,
        "recompiles": recompiles,
        "notes": notes,
    }


def compile_with_inductor(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile`` with its default backend. A seam: the CLI tests swap in a backend that
    compiles in a second instead of Inductor's 20 s cold start on a 2-core machine."""
    return torch.compile(fn)


def _variant(key: str, targets: list[torch.Tensor], padded: torch.Tensor, ragged: Ragged,
             reports: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    import ember

    if key == "loop":
        return lambda p: per_sample_loss(p, targets)
    if key == "concat":
        return lambda p: concat_loss(p, targets)
    if key == "pad":
        return lambda p: padded_giou_loss(p, padded)
    if key == "inductor":
        compiled = compile_with_inductor(padded_giou_loss)
        return lambda p: compiled(p, padded)
    reports[key] = report = ember.Report()
    if key in ("ember-pad", "ember-pad-skip"):
        # skip_masked: the padded boxes are neither loaded nor computed (passes/masks.py)
        options = {"skip_masked": key == "ember-pad-skip"}
        compiled = ember.compile(padded_giou_loss, report=report, options=options)
        return lambda p: compiled(p, padded)
    compiled = ember.compile(ragged_giou_loss, report=report)
    return lambda p, r=ragged: compiled(p, r)  # the recompile run passes other batches as r


def _launches(key: str, fn: Callable[[torch.Tensor], torch.Tensor], pred: torch.Tensor, cuda: bool,
              forward: Callable[..., Callable[[], Any]], train: Callable[..., Callable[[], Any]],
              graphs: tuple[list[Any], list[Any]] | None) -> dict[str, Any]:
    """Kernel launches of one forward and one forward + backward step."""
    try:
        if cuda:
            return {"launches_fwd": count_cuda_kernels(forward(fn)), "launches_train": count_cuda_kernels(train(fn))}
        if graphs is not None:  # ember on a CPU: what its compiled programs run
            size = lambda gs: sum(len(g.kernels) + len(g.fallbacks) for g in gs) if gs else None
            return {"launches_fwd": size(graphs[0]), "launches_train": size(graphs[1])}
        if key == "inductor":
            return {"launches_fwd": None, "launches_train": None}
        return {"launches_fwd": count_aten_calls(forward(fn)), "launches_train": count_aten_calls(train(fn))}
    except Exception as e:  # noqa: BLE001 -- a count is not worth the run
        return {"launches_fwd": None, "launches_train": None, "launches_error": describe(e)}


def _host_to_device(pinned: list[torch.Tensor], padded: torch.Tensor, targets: list[torch.Tensor],
                    dev: torch.device, reps: int) -> list[dict[str, Any]]:
    """Copy time of the targets three ways, from pinned memory as a DataLoader with
    ``pin_memory=True`` would hand them over."""
    batch = collate([(t,) for t in targets], ragged_fields=[0])
    r = batch[0]
    ragged_bytes = r.values.untyped_storage().nbytes()  # values and offsets: one buffer
    cases = [
        ("list of tensors (one .to per image)", len(pinned), sum(t.nbytes for t in pinned),
         lambda: [t.to(dev, non_blocking=True) for t in pinned]),
        (f"padded to {MAX_BOXES} (one tensor)", 1, padded.nbytes, lambda: padded.to(dev, non_blocking=True)),
        ("ragged (collate buffer + to_device)", 1, ragged_bytes, lambda: to_device(batch, dev)),
    ]
    out = []
    for name, copies, nbytes, fn in cases:
        try:
            out.append({"layout": name, "copies": copies, "bytes": nbytes, "time_s": wall_time(fn, dev, reps)})
        except Exception as e:  # noqa: BLE001
            out.append({"layout": name, "copies": copies, "bytes": nbytes, "time_s": None, "error": describe(e)})
    return out


def _recompiles(fn: Callable[[torch.Tensor, Ragged], torch.Tensor], pred: torch.Tensor, batch: int,
                dtype: torch.dtype, dev: torch.device, n: int, seed: int) -> dict[str, Any]:
    """Train steps of ember(ragged) over ``n`` fresh batches (different box counts): new Dynamo
    frames and ember graphs compiled meanwhile; zero means one compiled program serves them all."""
    from torch._dynamo.utils import counters

    import ember

    before = (counters["frames"]["total"], counters["stats"]["unique_graphs"], ember.stats()["graphs_compiled"])
    totals, times, error = [], [], None
    for i in range(n):
        r = pack(random_targets(batch, seed + 1000 + i, dtype), dev)
        totals.append(r.total_length)
        try:
            synchronize(dev)
            start = time.perf_counter()
            pred.grad = None
            fn(pred, r).backward()
            synchronize(dev)
            times.append(time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001
            error = describe(e)
            break
    after = (counters["frames"]["total"], counters["stats"]["unique_graphs"], ember.stats()["graphs_compiled"])
    return {"batches": len(totals), "boxes_min": min(totals), "boxes_max": max(totals),
            "distinct_box_totals": len(set(totals)), "dynamo_frames_compiled": after[0] - before[0],
            "dynamo_graphs": after[1] - before[1], "ember_graphs_compiled": after[2] - before[2],
            "median_step_s": statistics.median(times) if times else None, "error": error}


# ---- reporting ------------------------------------------------------------------------------


def _num(x: Any) -> float | None:
    """JSON numbers back to floats ('inf'/'nan' strings included)."""
    if x is None:
        return None
    return float(x)


def format_results(results: dict[str, Any]) -> str:
    """The article-style table, the copy table and the recompile line."""
    meta = results["meta"]
    lines = [f"# GIoU loss, batch {meta['batch']} ({meta['boxes']} boxes, at most {meta['max_boxes_per_image']} "
             f"per image, predictions ({meta['batch']}, {meta['padded_to']}, 4)), {meta['dtype']}",
             f"# {meta['machine']}, median of {meta['reps']} runs, {meta['date']}", ""]
    if meta.get("warning"):
        lines.insert(-1, meta["warning"])
    base = next((r for r in results["variants"] if r.get("key") == BASELINE), None)
    tol = meta["tolerance"]
    rows = []
    for r in results["variants"]:
        fwd, train = _num(r.get("fwd_s")), _num(r.get("train_s"))
        if r.get("error") and fwd is None and train is None:
            rows.append([r["variant"], f"failed: {r['error']}", "", "", "", ""])
            continue
        speed = []
        for mine, theirs in ((fwd, _num(base.get("fwd_s")) if base else None),
                             (train, _num(base.get("train_s")) if base else None)):
            speed.append(f"{theirs / mine:.2f}x" if mine and theirs else "n/a")
        lf, lt = r.get("launches_fwd"), r.get("launches_train")
        launches = "n/a" if lf is None and lt is None else f"{'n/a' if lf is None else lf} / " \
                                                            f"{'n/a' if lt is None else lt}"
        loss_err, grad_err = _num(r.get("loss_err", "nan")), _num(r.get("grad_err", "nan"))
        within = loss_err <= tol and grad_err <= tol  # False for NaN too
        err_text = f"{loss_err:.1e} / {grad_err:.1e}" + ("" if within else f" (over {tol:.0e})")
        note = f" [{r['error']}]" if r.get("error") else ""
        rows.append([r["variant"] + note, format_time(fwd), format_time(train), " / ".join(speed), launches, err_text])
    lines.append(table(rows, ["variant", "forward", "forward + backward", "vs Inductor (fwd / fwd+bwd)",
                              "launches (fwd / fwd+bwd)", "rel err (loss / grad)"]))
    lines.append(f"launches: {meta['launches']}")
    h2d = results.get("h2d")
    lines.append("")
    if h2d:
        lines.append(table([[h["layout"], h["copies"], f"{h['bytes'] / 1e3:.1f} KB",
                             format_time(_num(h.get("time_s"))) if h.get("time_s") is not None
                             else f"failed: {h.get('error')}"] for h in h2d],
                           ["targets to the GPU", "copies", "bytes", "time"]))
    else:
        lines.append("host-to-device copy of the targets: n/a on the CPU")
    rc = results.get("recompiles")
    if rc:
        lines.append("")
        lines.append(f"recompiles: ember(ragged) over {rc['batches']} batches with different box counts "
                     f"({rc['distinct_box_totals']} distinct totals, {rc['boxes_min']}..{rc['boxes_max']} boxes): "
                     f"{rc['dynamo_frames_compiled']} Dynamo frame(s) compiled, {rc['ember_graphs_compiled']} "
                     f"ember graph(s) compiled, median step {format_time(_num(rc.get('median_step_s')))}"
                     + (f"; stopped: {rc['error']}" if rc.get("error") else ""))
    if results.get("notes"):
        lines.append("")
        lines.extend(f"  {n}" for n in results["notes"])
    return "\n".join(lines)


def _writable(path: str | Path) -> bool:
    """Whether ``path`` can be written (tried: permissions alone do not say, e.g. under /proc)."""
    path = Path(path)
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError:
        return False
    if not existed:
        path.unlink(missing_ok=True)
    return True


def load_json(path: str | Path) -> dict[str, Any]:
    """Results saved by ``--json``; ValueError for a file that is not such results."""
    try:
        results = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    if not (isinstance(results, dict) and {"meta", "variants"} <= results.keys()):
        raise ValueError(f"{path} holds no results of `ember bench giou --json` (no 'meta' and 'variants')")
    return results


_NO_MATPLOTLIB = ("matplotlib is not installed (pip install 'ember[plot]'); save the results with --json "
                  "out.json and plot them anywhere with: ember bench giou --from-json out.json --plot {path}")


def plot(results: dict[str, Any], path: str | Path) -> str:
    """A log-scale bar chart, forward and forward + backward per variant; returns a message
    (matplotlib is optional: without it, say how to get it and how to plot the JSON later)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return f"not plotting {path}: {_NO_MATPLOTLIB.format(path=path)}"
    meta = results["meta"]
    rows = results["variants"]
    fig = Figure(figsize=(max(6.0, 1.5 * len(rows)), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.38
    for offset, field, label, color in ((-width / 2, "fwd_s", "forward", "#4c72b0"),
                                        (width / 2, "train_s", "forward + backward", "#dd8452")):
        xs, ys = [], []
        for i, r in enumerate(rows):
            t = _num(r.get(field))
            if t is not None and math.isfinite(t) and t > 0:
                xs.append(i + offset)
                ys.append(t * 1e3)
        bars = ax.bar(xs, ys, width, label=label, color=color)
        for bar, y in zip(bars, ys):
            ax.annotate(format_time(y / 1e3), (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom",
                        fontsize=7, rotation=90, xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_ylabel("time per step (ms, log scale)")
    ax.set_xticks(range(len(rows)), [r["variant"] + ("\n(failed)" if r.get("fwd_s") is None else "")
                                     for r in rows], rotation=20, ha="right")
    ax.set_title(f"GIoU loss, batch {meta['batch']}, {meta['dtype']}, {meta['device']}\n{meta['machine']}",
                 fontsize=9)
    ax.legend()
    ax.margins(y=0.25)
    fig.savefig(path, dpi=150)
    return f"wrote {path}"


def main(device: str | None = None, batch: int = 1024, dtype: str | None = None, reps: int | None = None,
         recompile_batches: int = 100, variants: str | None = None, json_path: str | None = None,
         plot_path: str | None = None, from_json: str | None = None) -> int:
    """What ``ember bench giou`` runs: measure (or load), print, save, plot. Defaults follow the
    device: bf16 and 50 runs on a GPU (the article's setting), fp32 and 20 runs on a CPU."""
    if json_path and not _writable(json_path):  # (before a study of minutes, not after it)
        print(f"error: --json: cannot write {json_path}")
        return 2
    if plot_path and importlib.util.find_spec("matplotlib") is None:  # (a chart asked for, none written)
        print(f"error: --plot: {_NO_MATPLOTLIB.format(path=plot_path)}")
        return 2
    if from_json:
        try:
            results = load_json(from_json)
            text = format_results(results)
        except (ValueError, KeyError, TypeError) as e:
            print(f"error: --from-json: {e if isinstance(e, ValueError) else f'{from_json} is malformed ({e!r})'}")
            return 2
    else:
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        cuda = torch.device(device).type == "cuda"
        dtype = dtype or ("bf16" if cuda else "fp32")
        reps = reps or (50 if cuda else 20)
        keys = [k.strip() for k in variants.split(",") if k.strip()] if variants else None
        print(f"GIoU study on {device}: batch {batch}, {dtype}, {reps} runs", flush=True)
        try:
            results = run_study(device, batch, dtype, reps, recompile_batches, keys,
                                log=lambda s: print(s, flush=True))
        except ValueError as e:
            print(f"error: {e}")
            return 2
        text = format_results(results)
    print(text, flush=True)
    if json_path:
        save_json(results, json_path)
        print(f"wrote {json_path}")
    if plot_path:
        print(plot(results, plot_path))
    return 0
