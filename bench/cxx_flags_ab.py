"""A/B of the CPU compiler flags: every case compiled twice in one process, once with ember's
default ``cxx_flags`` and once with them changed, timed in interleaved rounds (the machine's speed
drifts between whole-suite runs; interleaving cancels it).

    python bench/cxx_flags_ab.py --add=-fno-tree-pre   # B: the default and this flag
    python bench/cxx_flags_ab.py --drop=-fno-tree-pre  # A: the default without this flag
    python bench/cxx_flags_ab.py --lang guards_as_selects=0  # A: the C++ renderer's field set so

``--lang`` flips a field of the C++ renderer's ``Language`` (codegen/cpp.py) while A compiles:
the same flags, other source. ``--train`` times the training-step cases only (forward and
backward of a transformer layer, a relu MLP, the padded GIoU loss with and without
``skip_masked``); ``--where`` the selects only. Sizes are static unless ``--dynamic`` (every
case goes through one lambda, which Dynamo would otherwise recompile with symbolic sizes from
the second shape on: GCC compiles loops of known and unknown trip counts differently).

Cases: ``bench/cpu_fusion.py``'s, plus relu + max pooling, a bf16 pointwise sum, a bf16 column
sum and a max over relu'd rows. Prints ms medians (6 rounds of 5 calls) and the ratio A / B.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_fusion import cases  # noqa: E402

import ember  # noqa: E402
from ember.config import Config  # noqa: E402


def extra_cases() -> list:
    bf16 = torch.bfloat16
    return [("relu + max_pool2d 2x2, 4x64x112x112", lambda x: F.max_pool2d(torch.relu(x), 2),
             lambda: (torch.randn(4, 64, 112, 112),)),
            ("relu(x) + 2y + 1, 4096² bf16", lambda x, y: torch.relu(x) + 2 * y + 1,
             lambda: (torch.randn(4096, 4096, dtype=bf16), torch.randn(4096, 4096, dtype=bf16))),
            ("x.sum(0), 4096x1024 bf16", lambda x: x.sum(0), lambda: (torch.randn(4096, 1024, dtype=bf16),)),
            ("relu(x).amax(-1), 4096² f32", lambda x: torch.relu(x).amax(-1), lambda: (torch.randn(4096, 4096),))]


def where_cases() -> list:
    """Selects beside column sums: a relu's backward and its bias gradient; a select computing
    its taken branch, summed over rows; a row sum of it. 512 rows (GCC 12 unrolls those loops
    otherwise than at 4096) and 4096."""
    def relu_backward_and_bias_grad(g, mask):
        dx = torch.where(mask, 0.0, g)
        return dx, dx.sum(0)

    def column_sum_of_a_select(x, y, mask):
        return torch.where(mask, torch.exp(x) * y, 0).sum(0)

    def row_sum_of_a_select(x, y, mask):
        return torch.where(mask, torch.exp(x) * y, 0).sum(-1)

    out = []
    for rows in (512, 4096):
        out += [(f"where(mask, 0, g) and its sum(0), {rows}x1024", relu_backward_and_bias_grad,
                 lambda rows=rows: (torch.randn(rows, 1024), torch.rand(rows, 1024) < 0.5)),
                (f"where(mask, exp(x) * y, 0).sum(0), {rows}x1024", column_sum_of_a_select,
                 lambda rows=rows: (torch.randn(rows, 1024), torch.randn(rows, 1024), torch.rand(rows, 1024) < 0.5)),
                (f"where(mask, exp(x) * y, 0).sum(-1), {rows}x1024", row_sum_of_a_select,
                 lambda rows=rows: (torch.randn(rows, 1024), torch.randn(rows, 1024), torch.rand(rows, 1024) < 0.5))]
    return out


def train_cases() -> list:
    """(name, module or loss, inputs, options): each timed as forward + backward."""
    from cpu_fusion import make_batch, padded_giou_loss
    torch.manual_seed(0)
    pred, _targets, padded = make_batch(1024)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
    return [("transformer layer 8x64x256, train step", layer, lambda: (torch.randn(8, 64, 256),), {}),
            ("relu MLP 2048x512, train step", mlp, lambda: (torch.randn(2048, 512),), {}),
            ("padded GIoU loss 1024x256, train step", padded_giou_loss, lambda: (pred, padded), {}),
            ("padded GIoU, skip_masked, train step", padded_giou_loss, lambda: (pred, padded),
             {"skip_masked": True})]


def _median_call(fn, args, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _train_step(fn):
    """fn's forward and backward, the first input requiring grad; returns that gradient."""
    def step(*args):
        first = args[0].detach().requires_grad_(True)
        out = fn(first, *args[1:])
        (out if out.dim() == 0 else out.float().square().mean()).backward()
        return first.grad
    return step


def _set_lang(fields: dict[str, bool]) -> dict[str, bool]:
    """Set fields of the C++ renderer's Language; returns their old values."""
    from ember.codegen.cpp import CPP
    old = {name: getattr(CPP, name) for name in fields}
    for name, value in fields.items():
        setattr(CPP, name, value)
    return old


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--add", action="append", default=[], help="a flag B has and the default lacks")
    p.add_argument("--drop", action="append", default=[], help="a default flag A lacks")
    p.add_argument("--quick", action="store_true", help="cpu_fusion's small sizes")
    p.add_argument("--lang", action="append", default=[], metavar="FIELD=0|1",
                   help="a field of the C++ renderer's Language, set so while A compiles")
    p.add_argument("--train", action="store_true", help="the training-step cases only")
    p.add_argument("--where", action="store_true", help="the select cases only")
    p.add_argument("--dynamic", action="store_true", help="symbolic sizes (default: static)")
    p.add_argument("--baselines", action="store_true", help="time eager and Inductor in the same rounds")
    a = p.parse_args()
    torch._dynamo.config.recompile_limit = torch._dynamo.config.cache_size_limit = 1000
    flags_b = tuple(dict.fromkeys(Config().cxx_flags + tuple(a.add)))
    flags_a = tuple(f for f in Config().cxx_flags if f not in a.drop)
    lang_a = {k: v != "0" for k, v in (item.split("=", 1) for item in a.lang)}
    print(f"A: {' '.join(flags_a)} {lang_a or ''}\nB: {' '.join(flags_b)}")
    if a.train:
        todo = train_cases()
    elif a.where:
        todo = [(name, fn, make, {}) for name, fn, make in where_cases()]
    else:
        todo = [(name, fn, make, {}) for name, fn, make in cases(a.quick) + extra_cases() + where_cases()]
    wrap = _train_step if a.train else (lambda f: f)
    for name, fn, make, options in todo:
        args = make()
        fa = wrap(ember.compile(lambda *xs, fn=fn: fn(*xs), options={**options, "cxx_flags": flags_a},
                                dynamic=a.dynamic))
        fb = wrap(ember.compile(lambda *xs, fn=fn: fn(*xs), options={**options, "cxx_flags": flags_b},
                                dynamic=a.dynamic))
        old = _set_lang(lang_a)
        try:
            out_a = fa(*args)
        finally:
            _set_lang(old)
        torch.testing.assert_close(out_a, fb(*args))
        variants = {"A": fa, "B": fb}
        if a.baselines:
            variants["eager"] = wrap(fn)
            variants["Inductor"] = wrap(torch.compile(lambda *xs, fn=fn: fn(*xs), dynamic=a.dynamic))
            variants["Inductor"](*args)
        rounds: dict[str, list[float]] = {key: [] for key in variants}
        for _ in range(6):
            for key, f in variants.items():
                rounds[key].append(_median_call(f, args, 5))
        ms = {key: statistics.median(r) * 1e3 for key, r in rounds.items()}
        others = "".join(f"  {key} {ms[key]:8.2f} (B {ms[key] / ms['B']:4.2f}x)" for key in ms if key not in "AB")
        print(f"{name:40s} A {ms['A']:8.2f}  B {ms['B']:8.2f}  A/B {ms['A'] / ms['B']:5.2f}{others}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
