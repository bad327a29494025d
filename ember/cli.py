"""Command line: ``ember demo``, ``ember explain FILE.py:FUNCTION``, ``ember cache``, ``ember bench``.

    ember demo                                   # a small model and the padded GIoU loss
    ember explain model.py:loss --shapes 64x128,128 [--dtype float32] [--full]
    ember cache info | clear
    ember bench giou [--device cuda] [--batch 1024] [--dtype bf16] [--json out.json] [--plot giou.png]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


def _median_ms(fn: Callable[[], Any], reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class DemoModel(torch.nn.Module):
    """A small MLP block: Linear -> GELU -> Linear, residual, LayerNorm."""

    def __init__(self, width: int = 512):
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def demo(args: argparse.Namespace) -> int:
    import ember
    from ember.workloads.giou import make_batch, padded_giou_loss

    device = args.device
    if device != "cpu" and not torch.cuda.is_available():
        print(f"no {device} device here; running on the CPU")
        device = "cpu"
    torch.manual_seed(0)
    model = DemoModel().to(device).eval()
    x = torch.randn(256, 512, device=device)
    pred, _, padded = make_batch(args.batch)
    pred, padded = pred.to(device), padded.to(device)
    cases = [("MLP block (Linear, GELU, residual, LayerNorm)", model, (x,)),
             (f"padded GIoU loss ({args.batch}x256 boxes)", padded_giou_loss, (pred, padded))]
    print(f"ember {ember.__version__} on {device} (torch {torch.__version__}, {torch.get_num_threads()} threads)\n")
    with torch.no_grad():
        for title, fn, inputs in cases:
            report = ember.explain(fn, *inputs)
            fast = ember.compile(fn)
            out, ref = fast(*inputs), fn(*inputs)
            err = ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
            eager_ms = _median_ms(lambda: fn(*inputs))  # noqa: B023
            ember_ms = _median_ms(lambda: fast(*inputs))  # noqa: B023
            print(f"== {title}")
            print(report.summary())
            print(f"   eager {eager_ms:.3f} ms, ember {ember_ms:.3f} ms ({eager_ms / ember_ms:.2f}x), "
                  f"relative error {err:.1e}\n")
    print(f"ember.stats() = {ember.stats()}")
    return 0


def _parse_shapes(text: str | None) -> list[tuple[int, ...]]:
    if text is None or text.strip().lower() == "none":  # a function of no inputs
        return []
    shapes = []
    for part in text.split(","):
        part = part.strip()
        try:
            shapes.append(() if part in ("", "scalar", "()") else tuple(int(d) for d in part.lower().split("x")))
        except ValueError:
            raise SystemExit(f"--shapes: {part!r} is no shape; write sizes joined by x, e.g. 64x128") from None
    return shapes


def _load_function(spec: str) -> Callable[..., Any]:
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise SystemExit(f"expected FILE.py:FUNCTION, got {spec!r}")
    file = Path(path)
    if not file.exists():
        raise SystemExit(f"no such file: {file}")
    module_spec = importlib.util.spec_from_file_location(file.stem, file) if file.is_file() else None
    if module_spec is None or module_spec.loader is None:
        raise SystemExit(f"{file} is not a Python file (FILE.py:FUNCTION)")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(file.parent.resolve()))
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 -- the user's file: one line, as for the other mistakes
        if _debugging():
            raise
        raise SystemExit(f"{file} failed to import: {_one_line(e)}{_TRACEBACK_HINT}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise SystemExit(f"{file} has no function {name!r}")
    if not callable(fn):
        raise SystemExit(f"{file}: {name!r} is a {type(fn).__name__}, not a function")
    if isinstance(fn, type):  # (called with the inputs, a module class failed in its __init__)
        raise SystemExit(f"{file}: {name!r} is a class; name a function, or an instance of a module")
    return fn


_TRACEBACK_HINT = "\n(EMBER_DEBUG=1 shows the traceback)"


def _debugging() -> bool:
    import ember
    return ember.config.debug > 0


def _one_line(e: BaseException) -> str:
    """``Type: message``, the message's first line (torch's messages run to many)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _random_input(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A random input of ``shape`` and ``dtype`` (explain's --shapes, --dtype)."""
    try:
        if dtype == torch.bool:
            return torch.randint(0, 2, shape).bool()
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(shape, dtype=torch.complex128 if dtype.is_complex else torch.float64).to(dtype)
        return torch.randint(0, 10, shape, dtype=dtype)
    except (RuntimeError, TypeError) as e:
        raise SystemExit(f"--shapes/--dtype: no random {dtype} input of shape {shape} ({e})") from None


def explain(args: argparse.Namespace) -> int:
    import ember

    fn = _load_function(args.target)
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"--dtype: {args.dtype!r} is no torch dtype (float32, bfloat16, int64, ...)")
    inputs = [_random_input(s, dtype) for s in _parse_shapes(args.shapes)]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a callable whose signature Python cannot read: it will say
        params = None
    if params is not None:
        needed = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(inputs) < len(needed):
            raise SystemExit(f"{args.target} takes {len(needed)} input(s); --shapes gives {len(inputs)}")
        if len(inputs) > len(positional) and not any(p.kind is p.VAR_POSITIONAL for p in params):
            raise SystemExit(f"{args.target} takes at most {len(positional)} input(s); --shapes gives {len(inputs)}")
        keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
        if keyword_only:
            raise SystemExit(f"{args.target} needs keyword-only argument(s) {', '.join(keyword_only)}, which "
                             "--shapes cannot give; wrap it in a function that passes them")
    options = {"debug": 0}
    try:
        report = ember.explain(fn, *inputs, options=options, dynamic=True if args.dynamic else None)
    except Exception as e:  # noqa: BLE001 -- the function's own error (or ember's): one line
        if _debugging():
            raise
        print(f"ember explain: {args.target} raised {_one_line(e)}{_TRACEBACK_HINT}", file=sys.stderr)
        return 1
    print(report if args.full else report.summary())
    if not args.full:
        for k in report.kernels:
            print(f"\n// ---- {k.name} ----\n{k.source}")
    return 0


def cache(args: argparse.Namespace) -> int:
    import ember

    root = Path(ember.config.cache_dir)
    if root.exists() and not root.is_dir():
        print(f"ember: the cache directory {root} (EMBER_CACHE_DIR) is not a directory", file=sys.stderr)
        return 1
    # only what ember writes there: EMBER_CACHE_DIR may name a directory that holds other things
    parts = [root / name for name in CACHE_PARTS]
    if args.action == "clear":
        # (a read-only cache was reported cleared, with every file still there)
        failures = [failure for part in parts for failure in _remove_tree(part)]
        if failures:
            print(f"ember: could not clear {root}:\n  " + "\n  ".join(failures[:10])
                  + (f"\n  ... and {len(failures) - 10} more" if len(failures) > 10 else ""), file=sys.stderr)
            return 1
        try:
            root.rmdir()  # (only if nothing else is left in it)
        except OSError:
            pass
        print(f"cleared ember's kernels ({', '.join(CACHE_PARTS)}) from {root}")
        return 0
    size, built = 0, 0
    for part in parts:
        # os.walk, not rglob: another process's build directory may vanish while it is listed
        # (rglob raised FileNotFoundError then); walk skips a directory it cannot list
        for folder, dirs, files in os.walk(part):
            dirs[:] = [d for d in dirs if not d.startswith(".")]  # a build in progress (.build-*/)
            for name in files:
                if name.startswith("."):
                    continue  # a file being written (.*.tmp): not a module yet
                try:
                    size += os.stat(os.path.join(folder, name)).st_size
                except OSError:  # (removed meanwhile: another process builds or clears)
                    continue
                built += Path(name).suffix in (".so", ".cubin", ".py")
    print(f"{root}: {built} built module(s), {size / 1e6:.1f} MB")
    return 0


# the kernel caches under cache_dir (runtime/), and the timed choices between two plans (choice.py)
CACHE_PARTS = ("cpp", "cuda", "triton", "choices.json")


def _remove_tree(path: Path, top: bool = True) -> list[str]:
    """Removes ``path`` and what it holds; what could not be removed, with why. A ``top`` that
    links to a folder keeps the link and loses what the folder holds."""
    failures: list[str] = []

    def failed(function: Any, name: str, error: BaseException) -> None:
        if not isinstance(error, FileNotFoundError):  # (removed meanwhile: another process clears)
            failures.append(f"{name}: {getattr(error, 'strerror', None) or error}")

    if top and path.is_symlink() and path.is_dir():
        # a cache folder linked to another disk: what it holds goes, the link stays (rmtree
        # refuses a link, and the clear failed); links inside it are removed, not followed
        try:
            children = list(path.iterdir())
        except OSError as e:
            failed(os.listdir, str(path), e)
            children = []
        for child in children:
            failures += _remove_tree(child, top=False)
    elif path.is_dir() and not path.is_symlink():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=failed)
        else:
            shutil.rmtree(path, onerror=lambda function, name, info: failed(function, name, info[1]))
    elif path.exists() or path.is_symlink():  # (a file where ember keeps a cache was reported
        # cleared, and kept; a link to a file, or to nothing)
        try:
            path.unlink()
        except OSError as e:
            failed(os.unlink, str(path), e)
    return failures


def bench_giou(args: argparse.Namespace) -> int:
    from .workloads import giou_bench

    if args.from_json and not Path(args.from_json).is_file():
        raise SystemExit(f"--from-json: no such file: {args.from_json}")
    return giou_bench.main(device=args.device, batch=args.batch, dtype=args.dtype, reps=args.reps,
                           recompile_batches=args.batches_for_recompiles, variants=args.variants,
                           json_path=args.json, plot_path=args.plot, from_json=args.from_json)


def _positive_int(text: str, least: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is not positive" if least == 1 else f"{value} is negative")
    return value


def _demo_device(text: str) -> str:
    """A CPU or CUDA device string (``cuda:1`` too). (An unknown one ran on the CPU without a GPU,
    and failed in torch with a traceback where one is present.)"""
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is not cpu or cuda (or cuda:N)")
    return text


def _count(text: str) -> int:
    return _positive_int(text, least=0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ember", description="ember: a compiler for PyTorch programs")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="compile a small model and the padded GIoU loss, time them")
    p.add_argument("--device", type=_demo_device, default="cpu", help="cpu (default) or cuda")
    p.add_argument("--batch", type=_positive_int, default=1024, help="images in the GIoU batch")
    p.set_defaults(func=demo)

    p = sub.add_parser("explain", help="show what ember does with a function")
    p.add_argument("target", help="FILE.py:FUNCTION")
    p.add_argument("--shapes", help="input shapes, e.g. 64x128,128 (random inputs); '' is one 0-d input; "
                   "leave out (or 'none') for a function of no inputs")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--dynamic", action="store_true", help="compile with symbolic sizes")
    p.add_argument("--full", action="store_true", help="the IR after every pass, kernels, host program")
    p.set_defaults(func=explain)

    p = sub.add_parser("cache", help="inspect or clear the kernel cache")
    p.add_argument("action", choices=["info", "clear"])
    p.set_defaults(func=cache)

    p = sub.add_parser("bench", help="benchmarks: ember bench giou")
    bench = p.add_subparsers(dest="bench", required=True)
    p = bench.add_parser("giou", help="the seed article's GIoU study on this machine (tables, JSON, bar chart)")
    p.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda if present, else cpu")
    p.add_argument("--batch", type=_positive_int, default=1024, help="images per batch (default 1024)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--reps", type=_positive_int, help="timed runs per variant (default 50 on cuda, 20 on cpu; "
                                            "the per-sample loop runs at most 3)")
    p.add_argument("--batches-for-recompiles", type=_count, default=100,
                   help="batches with different box counts run through ember(ragged) to count recompiles")
    p.add_argument("--variants", help="comma-separated subset of: loop,concat,pad,inductor,ember-pad,"
                                      "ember-pad-skip,ember-ragged")
    p.add_argument("--json", help="save the results to this JSON file")
    p.add_argument("--plot", help="bar chart (PNG, log scale) of the results; needs matplotlib")
    p.add_argument("--from-json", help="print and plot saved results instead of measuring")
    p.set_defaults(func=bench_giou)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
