"""Ragged workloads beyond GIoU: ember on the ragged code vs the padded code (eager, Inductor, ember).

    python bench/ragged_suite.py [--device cuda|cpu] [--reps N] [--json out.json]
                                 [--cases pool,softmax,ce] [--dtype bf16] [--sizes pool_docs=64,...]

Cases (issue 5, part 6), each written twice in plain torch -- padded with a mask, and over a
``Ragged`` (values + offsets) with ember.ragged's segment functions:

* pool: mean of the token embeddings of each document (256 documents of 1..512 tokens, width
  768 on a GPU);
* softmax: softmax of a per-token score within each document (the same documents);
* ce: per-token cross-entropy over packed sequences (32 sequences of 1..512 tokens, vocabulary
  32000 on a GPU), mean over the tokens; the padded form uses ignore_index=-100.

The padded code also runs with ember's ``skip_masked`` option ("ember padded, skip_masked"):
``x * mask`` becomes a select, so padding is neither loaded nor computed. On a GPU both compilers
also run under CUDA graphs ("padded Inductor, reduce-overhead"; "ember ragged, cuda_graph",
``ember.cuda_graph`` around the ragged forward and training step), since the small cases are
host time around short kernels. Both read their (unchanging) inputs in place. Lengths are uniform
random (seeded). Protocol (../shared/BENCHMARKS.md): every variant's output and
input gradient against a float64 reference first, then medians of interleaved runs (CUDA events
on a GPU), forward (no_grad) and forward + backward, kernel launches per call on a GPU. The CPU
defaults are smaller (and float32) so that ``--device cpu --reps 3`` takes a minute or two.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ember  # noqa: E402
from ember import ragged  # noqa: E402
from ember.ragged import Ragged  # noqa: E402
from ember.workloads.timing import (  # noqa: E402
    DTYPES,
    TOLERANCE,
    busy_warning,
    describe,
    format_time,
    machine,
    median_times,
    poison_cuda,
    profile_cuda_kernels,
    rel_error,
    save_json,
    synchronize,
    table,
)


@dataclass(frozen=True)
class Sizes:
    """Problem sizes; GPU defaults follow the issue, ``CPU_SIZES`` keeps a CPU run short."""
    pool_docs: int = 256
    pool_max_len: int = 512
    pool_width: int = 768
    softmax_docs: int = 256
    softmax_max_len: int = 512
    ce_seqs: int = 32
    ce_max_len: int = 512
    ce_vocab: int = 32000


GPU_SIZES = Sizes()
CPU_SIZES = Sizes(pool_docs=64, pool_max_len=256, pool_width=256, ce_seqs=16, ce_max_len=128, ce_vocab=4096)

VARIANTS = {
    "padded-eager": "padded eager",
    "padded-inductor": "padded Inductor",
    "padded-ember": "ember padded",
    "padded-emberskip": "ember padded, skip_masked",
    "ragged-eager": "ragged eager",
    "ragged-inductor": "ragged Inductor",
    "ragged-ember": "ember ragged",
    "padded-inductorgraphs": "padded Inductor, reduce-overhead",
    "ragged-embergraph": "ember ragged, cuda_graph",
}
DEFAULT_VARIANTS = ("padded-eager", "padded-inductor", "padded-ember", "padded-emberskip", "ragged-eager",
                    "ragged-ember")
# on a GPU also both compilers' CUDA graphs: the small cases are host time around short kernels
GPU_VARIANTS = (*DEFAULT_VARIANTS, "padded-inductorgraphs", "ragged-embergraph")
# (ember variant, baseline) pairs of the ratio table, where both ran
RATIOS = (("ragged-ember", "padded-inductor"), ("ragged-embergraph", "padded-inductor"),
          ("ragged-embergraph", "padded-inductorgraphs"))
CASES = ("pool", "softmax", "ce")


# ---- the two formulations of each case (what a user writes) ----------------------------------


def pool_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, L, D) zero-padded tokens -> (B, D) mean over each document's real tokens."""
    mask = torch.arange(x.shape[1], device=x.device) < lengths[:, None]
    return (x * mask[..., None]).sum(1) / lengths[:, None]


def pool_ragged(tokens: Ragged) -> torch.Tensor:
    return ragged.segment_mean(tokens)


def softmax_padded(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, L) padded scores -> (B, L) softmax over each row's real entries (0 past the end)."""
    mask = torch.arange(scores.shape[1], device=scores.device) < lengths[:, None]
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def softmax_ragged(scores: Ragged) -> torch.Tensor:
    return ragged.jagged_softmax(scores).values


def ce_padded(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, L, V) logits, (B, L) targets with -100 past each sequence's end -> mean token loss."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def ce_ragged(logits: Ragged, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.values, targets)


# ---- inputs -----------------------------------------------------------------------------------


@dataclass
class Case:
    """One workload: both formulations, their inputs (the first is the differentiable leaf,
    a Ragged's values for the ragged side), and how to compare against the reference."""
    name: str
    title: str
    padded_fn: Callable[..., torch.Tensor]
    ragged_fn: Callable[..., torch.Tensor]
    padded_args: tuple[Any, ...]
    ragged_args: tuple[Any, ...]
    grad_padded: torch.Tensor | None  # upstream gradient (None: scalar loss)
    grad_ragged: torch.Tensor | None
    padded_to_ragged: Callable[[torch.Tensor], torch.Tensor]  # padded output -> reference layout
    ref_out: torch.Tensor | None = None
    ref_grad: torch.Tensor | None = None

    def leaf(self, layout: str) -> torch.Tensor:
        first = self.padded_args[0] if layout == "padded" else self.ragged_args[0]
        return first.values if isinstance(first, Ragged) else first


def _lengths(n: int, max_len: int, seed: int) -> torch.Tensor:
    return torch.randint(1, max_len + 1, (n,), generator=torch.Generator().manual_seed(seed))


def _ragged(values: torch.Tensor, lengths: torch.Tensor) -> Ragged:
    offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return Ragged(values, offsets.to(values.device), int(lengths.max()), validate=False)


def make_case(name: str, sizes: Sizes, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Case:
    """Seeded inputs for one case, with a leaf (requires_grad) per layout."""
    gen = torch.Generator(device=device).manual_seed(seed)
    randn = lambda *shape: torch.randn(shape, device=device, generator=gen).to(dtype)  # noqa: E731
    if name == "pool":
        lengths = _lengths(sizes.pool_docs, sizes.pool_max_len, seed)
        r = _ragged(randn(int(lengths.sum()), sizes.pool_width), lengths)
        dev_lengths = lengths.to(device)
        padded = r.to_padded().requires_grad_()
        r = _ragged(r.values.requires_grad_(), lengths)
        g = randn(sizes.pool_docs, sizes.pool_width)
        case = Case(name, f"mean pooling, {sizes.pool_docs} docs of 1..{sizes.pool_max_len} tokens, "
                          f"width {sizes.pool_width}",
                    pool_padded, pool_ragged, (padded, dev_lengths), (r,), g, g, lambda out: out)
    elif name == "softmax":
        lengths = _lengths(sizes.softmax_docs, sizes.softmax_max_len, seed)
        r = _ragged(randn(int(lengths.sum())), lengths)
        dev_lengths = lengths.to(device)
        padded = r.to_padded().requires_grad_()
        r = _ragged(r.values.requires_grad_(), lengths)
        g = randn(r.total_length)
        rows, positions = r.row_ids(), r.positions()
        case = Case(name, f"jagged softmax, {sizes.softmax_docs} docs of 1..{sizes.softmax_max_len} tokens",
                    softmax_padded, softmax_ragged, (padded, dev_lengths), (r,),
                    _ragged(g, lengths).to_padded(), g, lambda out: out[rows, positions])
    elif name == "ce":
        lengths = _lengths(sizes.ce_seqs, sizes.ce_max_len, seed)
        total = int(lengths.sum())
        r = _ragged(randn(total, sizes.ce_vocab), lengths)
        targets = torch.randint(0, sizes.ce_vocab, (total,), device=device, generator=gen)
        padded = r.to_padded().requires_grad_()
        padded_targets = _ragged(targets, lengths).to_padded(padding_value=-100)
        r = _ragged(r.values.requires_grad_(), lengths)
        case = Case(name, f"cross-entropy, {sizes.ce_seqs} seqs of 1..{sizes.ce_max_len} tokens, "
                          f"vocabulary {sizes.ce_vocab}",
                    ce_padded, ce_ragged, (padded, padded_targets), (r, targets), None, None, lambda out: out)
    else:
        raise ValueError(f"unknown case {name!r}; choose from {CASES}")
    _reference(case)
    return case


def _reference(case: Case) -> None:
    """float64 eager output and gradient, in the ragged layout. Pooling and softmax use the
    padded formulation (independent of ember.ragged's segment code); cross-entropy the packed
    one (the padded float64 logits would need gigabytes)."""
    if case.name == "ce":
        logits, targets = case.ragged_args
        x = logits.values.detach().double().requires_grad_()
        out = F.cross_entropy(x, targets)
        out.backward()
        case.ref_out, case.ref_grad = out.detach(), x.grad
        return
    padded, lengths = case.padded_args
    x = padded.detach().double().requires_grad_()
    out = case.padded_fn(x, lengths)
    out.backward(case.grad_padded.double())
    r = case.ragged_args[0]
    case.ref_out = case.padded_to_ragged(out.detach())
    case.ref_grad = x.grad[r.row_ids(), r.positions()]


# ---- measuring --------------------------------------------------------------------------------


def compile_with_inductor(fn: Callable[..., Any], mode: str | None = None) -> Callable[..., Any]:
    """``torch.compile`` with its default backend (a seam: the smoke test swaps in a faster one)."""
    return torch.compile(fn, mode=mode)


def _compiled(key: str, case: Case) -> Callable[..., torch.Tensor]:
    layout, how = key.split("-")
    fn = case.padded_fn if layout == "padded" else case.ragged_fn
    if how == "eager":
        return fn
    if how == "emberskip":  # padding neither loaded nor computed (x * mask as a select)
        return ember.compile(fn, options={"skip_masked": True})
    if how == "inductorgraphs":  # Inductor's CUDA graphs (cudagraph trees)
        return compile_with_inductor(fn, mode="reduce-overhead")
    return compile_with_inductor(fn) if how == "inductor" else ember.compile(fn)


def _steps(key: str, case: Case, args: tuple[Any, ...], leaf: torch.Tensor,
           grad: torch.Tensor | None) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(forward under no_grad, forward + backward into ``leaf.grad``) of one variant."""
    if key == "ragged-embergraph":
        return _ember_graph_steps(case, grad)
    fn = _compiled(key, case)
    graphs = key == "padded-inductorgraphs"
    if graphs:  # the suite's inputs never change: read in place, as ember's graphs read them
        for t in (*args, grad):
            if isinstance(t, torch.Tensor):
                torch._dynamo.mark_static_address(t)

    def fwd() -> Any:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return fn(*args)

    def train() -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        leaf.grad = None
        fn(*args).backward(grad)

    return fwd, train


def _ember_graph_steps(case: Case, grad: torch.Tensor | None) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """ember on the ragged code inside ``ember.cuda_graph``, the forward and the training step
    each captured once. The suite's inputs never change, so every argument is in
    ``static_args``: read where it is, not copied (Inductor's graphs get the same, through
    ``mark_static_address``). Tensors of T rows beside the Ragged (cross-entropy's targets,
    softmax's upstream gradient) go in as Ragged sharing its offsets, as ``cuda_graph`` asks of
    copied arguments; the values' gradient lands in ``values.grad``."""
    compiled = ember.compile(case.ragged_fn)
    r, *rest = case.ragged_args

    def rows(t: torch.Tensor) -> Ragged:
        return Ragged._make(t, r.offsets, r.max_length)

    extra = tuple(rows(t) for t in rest)
    upstream = rows(grad) if grad is not None and case.name == "softmax" else grad

    @ember.cuda_graph(static_args=range(1 + len(extra)))
    def forward(x: Ragged, *extra: Ragged) -> torch.Tensor:
        with torch.no_grad():
            return compiled(x, *(e.values for e in extra))

    @ember.cuda_graph(static_args=range(2 + len(extra)))
    def train(x: Ragged, up: Any, *extra: Ragged) -> torch.Tensor:
        x.values.grad = None
        out = compiled(x, *(e.values for e in extra))
        out.backward(up.values if isinstance(up, Ragged) else up)
        return out

    return (lambda: forward(r, *extra)), (lambda: train(r, upstream, *extra))


def run_case(case: Case, device: torch.device, dtype: torch.dtype, reps: int, variants: Sequence[str],
             backward: bool = True, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Check, then time, every variant on one case; one result row per variant."""
    rows = {k: {"case": case.name, "key": k, "variant": VARIANTS[k]} for k in variants}
    steps_fwd: dict[str, Callable[[], Any]] = {}
    steps_train: dict[str, Callable[[], Any]] = {}
    errors: dict[str, str] = {}
    tol = TOLERANCE[dtype]
    for key in variants:
        layout = key.split("-")[0]
        args = case.padded_args if layout == "padded" else case.ragged_args
        grad = case.grad_padded if layout == "padded" else case.grad_ragged
        leaf = case.leaf(layout)
        to_ref = case.padded_to_ragged if layout == "padded" else (lambda out: out)
        try:
            fwd, train = _steps(key, case, args, leaf, grad)
            if device.type == "cuda":
                poison_cuda()
            out = fwd()
            out_err = rel_error(to_ref(out), case.ref_out)
            grad_err = None
            if backward:
                train()
                synchronize(device)
                r = case.ragged_args[0]
                got = leaf.grad if layout == "ragged" else leaf.grad[r.row_ids(), r.positions()]
                grad_err = rel_error(got, case.ref_grad)
            ok = out_err <= tol and (grad_err is None or grad_err <= tol)  # False for NaN too
            rows[key].update(out_err=out_err, grad_err=grad_err, ok=ok)
        except Exception as e:  # noqa: BLE001 -- report it in the table, go on with the others
            errors[key] = describe(e)
            continue
        steps_fwd[key] = fwd
        if backward:
            steps_train[key] = train
    log(f"  {case.name}: timing ...")
    fwd_times = median_times(steps_fwd, device, reps, errors=errors)
    train_times = median_times(steps_train, device, reps, errors=errors) if backward else {}
    for key, row in rows.items():
        row.update(fwd_s=fwd_times.get(key), train_s=train_times.get(key), error=errors.get(key))
        if device.type == "cuda" and key in steps_fwd and key not in errors:
            try:
                row["launches_fwd"], row["kernels_fwd_s"] = profile_cuda_kernels(steps_fwd[key])
                if key in steps_train:
                    row["launches_train"], row["kernels_train_s"] = profile_cuda_kernels(steps_train[key])
            except Exception as e:  # noqa: BLE001
                row["launches_error"] = describe(e)
    return list(rows.values())


def run_suite(device: str = "cpu", dtype: str | None = None, reps: int | None = None, sizes: Sizes | None = None,
              cases: Sequence[str] = CASES, variants: Sequence[str] = DEFAULT_VARIANTS, backward: bool = True,
              seed: int = 0, log: Callable[[str], None] = print,
              on_case: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every case, every variant; returns JSON-ready results (see ``format_results``).
    ``on_case`` gets the results so far after each case (a run cut short keeps what it measured)."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    dtype = dtype or ("bf16" if cuda else "fp32")
    reps = reps or (50 if cuda else 20)
    sizes = sizes or (GPU_SIZES if cuda else CPU_SIZES)
    torch_dtype = DTYPES[dtype]
    host, warning = machine(dev), busy_warning(dev)  # before the run: the load is other jobs', not ours
    rows: list[dict[str, Any]] = []
    titles: dict[str, str] = {}
    results = {"meta": {"device": str(dev), "machine": host, "warning": warning, "dtype": dtype, "reps": reps,
                        "tolerance": TOLERANCE[torch_dtype], "sizes": dataclasses.asdict(sizes), "titles": titles,
                        "date": datetime.date.today().isoformat(), "backward": backward},
               "rows": rows}
    for name in cases:
        log(f"  {name}: inputs and float64 reference ...")
        case = make_case(name, sizes, dev, torch_dtype, seed)
        titles[name] = case.title
        rows += run_case(case, dev, torch_dtype, reps, variants, backward, log)
        del case
        if cuda:
            torch.cuda.empty_cache()
        if on_case is not None:
            on_case(results)
    return results


def format_results(results: dict[str, Any]) -> str:
    """Per-variant rows, then the ratio table: ember ragged time / padded Inductor time."""
    meta = results["meta"]
    tol = meta["tolerance"]
    lines = [f"# ragged suite, {meta['dtype']}, {meta['machine']}, median of {meta['reps']} runs, {meta['date']}"]
    lines += [f"#   {name}: {title}" for name, title in meta["titles"].items()]
    if meta.get("warning"):
        lines.append(meta["warning"])
    detail = []
    for r in results["rows"]:
        if r.get("error") and r.get("fwd_s") is None:
            detail.append([r["case"], r["variant"], f"failed: {r['error']}", "", "", "", ""])
            continue
        errs = [e for e in (r.get("out_err"), r.get("grad_err")) if e is not None]
        within = all(float(e) <= tol for e in errs)  # False for NaN too
        err_text = " / ".join(f"{float(e):.1e}" for e in errs) + ("" if within else f" (over {tol:.0e})")
        lf, lt = r.get("launches_fwd"), r.get("launches_train")
        launches = "n/a" if lf is None else f"{lf} / {'n/a' if lt is None else lt}"
        kf, kt = r.get("kernels_fwd_s"), r.get("kernels_train_s")
        kernel_time = "n/a" if kf is None else f"{format_time(kf)} / {format_time(kt)}"
        note = f" [{r['error']}]" if r.get("error") else ""
        detail.append([r["case"], r["variant"] + note, format_time(r.get("fwd_s")), format_time(r.get("train_s")),
                       launches, kernel_time, err_text])
    lines += ["", table(detail, ["case", "variant", "forward", "forward + backward", "launches (fwd / fwd+bwd)",
                                 "kernel time (fwd / fwd+bwd)", "rel err (out / grad)"])]
    summary = []
    for name in meta["titles"]:
        by_key = {r["key"]: r for r in results["rows"] if r["case"] == name}
        for mine_key, base_key in RATIOS:
            if mine_key not in by_key or base_key not in by_key:
                continue
            ratio = []
            for field in ("fwd_s", "train_s"):
                mine, base = by_key[mine_key].get(field), by_key[base_key].get(field)
                ratio.append("n/a" if not (mine and base) else f"{mine / base:.2f} (" + (
                    f"{base / mine:.1f}x faster)" if mine <= base else f"{mine / base:.1f}x slower)"))
            summary.append([name, f"{VARIANTS[mine_key]} / {VARIANTS[base_key]}", *ratio])
    lines += ["", table(summary, ["case", "ember / baseline", "fwd", "fwd+bwd"])]
    return "\n".join(lines)


def _parse_sizes(text: str | None, base: Sizes) -> Sizes:
    if not text:
        return base
    fields = {f.name for f in dataclasses.fields(Sizes)}
    changes = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in fields:
            raise SystemExit(f"--sizes: unknown field {key!r}; fields: {sorted(fields)}")
        changes[key.strip()] = int(value)
    return dataclasses.replace(base, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda if present, else cpu")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--reps", type=int, help="timed runs per variant (default 50 on cuda, 20 on cpu)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--variants", help=f"comma-separated subset of {','.join(VARIANTS)} (default: all but "
                   "ragged-inductor; the two CUDA-graph variants only on cuda)")
    p.add_argument("--sizes", help="override sizes, e.g. pool_docs=64,ce_vocab=4096 (see Sizes)")
    p.add_argument("--full", action="store_true", help="the GPU sizes even on the CPU")
    p.add_argument("--no-backward", action="store_true", help="forward only")
    p.add_argument("--json", help="save the results to this JSON file")
    args = p.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device here")
        return 2
    chosen = args.variants or ",".join(GPU_VARIANTS if device == "cuda" else DEFAULT_VARIANTS)
    variants = [v for v in chosen.split(",") if v]
    cases = [c for c in args.cases.split(",") if c]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; choose from {list(VARIANTS)}")
    base = GPU_SIZES if device == "cuda" or args.full else CPU_SIZES
    def on_case(results: dict[str, Any]) -> None:
        last = list(results["meta"]["titles"])[-1]
        print(format_results({**results, "rows": [r for r in results["rows"] if r["case"] == last],
                              "meta": {**results["meta"], "titles": {last: results["meta"]["titles"][last]}}}),
              flush=True)
        if args.json:
            save_json(results, args.json)

    results = run_suite(device, args.dtype, args.reps, _parse_sizes(args.sizes, base), cases, variants,
                        not args.no_backward, log=lambda s: print(s, flush=True), on_case=on_case)
    print("\n" + format_results(results), flush=True)
    if args.json:
        print(f"wrote {args.json}")
    bad = [r for r in results["rows"] if r.get("error") or not r.get("ok", False)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
