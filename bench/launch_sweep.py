"""Time one case of the GPU fusion suite under forced Triton launch configurations, one device call.

    python bench/launch_sweep.py --case cross_entropy --configs "1,1024,1,3;1,2048,4,1;2,1024,8,2"

Each configuration is ``XBLOCK,RBLOCK,num_warps[,num_stages[,persistent[,split]]]`` and is forced on
every kernel of the case, or on those named by ``--only`` (``options={"triton_launch": ...}``, which
a kernel kind that cannot use it adapts). Prints the median µs of a call (CUDA events), the
device time of each kernel and the error against float64, next to Inductor and ember's heuristic
choice ("ember heuristic", the Triton backend; ``--cuda`` adds the CUDA C++ backend's kernels). A
tool for choosing the heuristics' defaults; the numbers that count go through gpu_fusion.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fusion import cases, copy_bandwidth, kernel_times, rel_error, rmsnorm, train_step  # noqa: E402

import ember  # noqa: E402

F = torch.nn.functional
BF16 = torch.bfloat16


def _read(a) -> int:  # bytes a case reads: its first input once
    return a[0].numel() * a[0].element_size()


def _read_write(a) -> int:  # ... and writes as many
    return 2 * _read(a)


def _rows(fn, rows: int, width: int, dtype=BF16, nbytes=_read_write):
    """A case of ``fn`` over a (rows, width) tensor."""
    return fn, lambda: (torch.randn(rows, width, device="cuda", dtype=dtype),), nbytes


def _ce(rows: int, classes: int, dtype=BF16):
    """Cross-entropy's mean over (rows, classes) logits."""
    return (lambda x, t: F.cross_entropy(x, t),
            lambda: (torch.randn(rows, classes, device="cuda", dtype=dtype),
                     torch.randint(0, classes, (rows,), device="cuda")), _read)


def _layer_norm(rows: int, width: int):
    return (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
            lambda: (torch.randn(rows, width, device="cuda", dtype=BF16), torch.randn(width, device="cuda", dtype=BF16),
                     torch.randn(width, device="cuda", dtype=BF16)), _read_write)


def _bias(fn):
    """The gelu linear layer's epilogue shape: fn(y + b) over an 8192 x 4096 product."""
    return (lambda y, b: fn(y + b), lambda: (torch.randn(8192, 4096, device="cuda", dtype=BF16),
                                             torch.randn(4096, device="cuda", dtype=BF16)), _read_write)


def _softmax(x):
    return torch.softmax(x, -1)


LONG_ROWS = {
    # few long rows: the heuristic splits each row over programs (compare with "SPLIT=1")
    "row_sums_bf16": _rows(lambda x: x.sum(-1), 8, 4 << 20, nbytes=_read),
    "row_amax_f32": _rows(lambda x: x.amax(-1), 4, 16 << 20, torch.float32, _read),
    "row_sums_64": _rows(lambda x: x.sum(-1), 64, 1 << 20, nbytes=_read),
    "row_sumsq_200": _rows(lambda x: x.float().square().sum(-1), 200, 32000, nbytes=_read),
    # online softmax over few long rows (a language model's loss over a 128256-token vocabulary
    # at small batch, logsumexp over long rows): each slice's (max, sum of exp), rescaled
    "ce_vocab_8": _ce(8, 128256),
    "ce_vocab_64": _ce(64, 128256),
    "ce_vocab_256": _ce(256, 32000),
    # a softmax over few wide rows (it stores its rows, so it cannot split: its own tiles)
    "softmax_vocab_8": _rows(_softmax, 8, 128256),
    "softmax_vocab_64": _rows(_softmax, 64, 128256),
    "softmax_256": _rows(_softmax, 256, 32000),
    "softmax_8192x32000": _rows(_softmax, 8192, 32000),
    "logsumexp_f32": _rows(lambda x: torch.logsumexp(x, -1), 64, 1 << 20, torch.float32, _read),
}

EPILOGUES = {
    # the gelu linear layer's epilogue alone (cuBLAS's product, then bias + gelu), against the same
    # bytes through a cheaper function: how much of its time is instructions, not memory
    "bias_gelu": _bias(F.gelu),
    "bias_gelu_tanh": _bias(lambda z: F.gelu(z, approximate="tanh")),
    "bias_relu": _bias(torch.relu),
}

SHORT_ROWS = {
    # rows shorter than a warp's iteration: the CUDA C++ backend gives each a group of lanes
    "softmax_64": _rows(_softmax, 1 << 20, 64),
    "softmax_128": _rows(_softmax, 1 << 19, 128),
    "sum_16": _rows(lambda x: x.sum(-1), 1 << 22, 16, torch.float32, _read),
    "sum_70": _rows(lambda x: x.sum(-1), 1 << 20, 70, torch.float32, _read),
    "layernorm_64": _layer_norm(1 << 20, 64),
    "layernorm_768": _layer_norm(65536, 768),
    # rows of 512-2048: a few rows a program, rows in registers (BERT's and GPT-2's widths)
    **{f"layernorm_{w}": _layer_norm((1 << 26) // w, w) for w in (512, 1024, 2048)},
    **{f"softmax_{w}": _rows(_softmax, (1 << 26) // w, w) for w in (1024, 2048)},
    "softmax_1024_f32": _rows(_softmax, 1 << 15, 1024, torch.float32),
    "rmsnorm_1024": (rmsnorm, lambda: (torch.randn(1 << 16, 1024, device="cuda", dtype=BF16),
                                       torch.randn(1024, device="cuda", dtype=BF16)), _read_write),
    # a pre-norm block's residual sum stored and normed (bench/residual_stack.py's norm kernels)
    "add_layernorm_1024": (lambda x, h, w, b: (x + h, F.layer_norm(x + h, (1024,), w, b)),
                           lambda: (*(torch.randn(1 << 16, 1024, device="cuda", dtype=BF16) for _ in range(2)),
                                    *(torch.randn(1024, device="cuda", dtype=BF16) for _ in range(2))),
                           lambda a: 4 * a[0].numel() * 2),
    # rows reduced and then reduced over all rows (a loss's mean over its rows)
    "ce_10": _ce(1 << 20, 10, torch.float32),
    "ce_10_bf16": _ce(1 << 20, 10),
    "ce_100": _ce(1 << 18, 100, torch.float32),
    "ce_1000_bf16": _ce(1 << 16, 1000),
    "norm_mean_16": _rows(lambda x: x.square().sum(-1).sqrt().mean(), 1 << 20, 16, torch.float32, _read),
}


ODD_WIDTHS = {
    # rows whose width is no power of two: padded to one in registers (ImageNet's 1000 classes,
    # the hidden sizes of GPT-2 XL, Qwen 1.5B, GPT-J and LLaMA-13B)
    "softmax_1000": _rows(_softmax, 1 << 16, 1000),
    **{f"layernorm_{w}": _layer_norm((1 << 26) // w, w) for w in (1536, 3072, 5120)},
    **{f"softmax_{w}": _rows(_softmax, (1 << 26) // w, w) for w in (768, 3072, 5120)},
    **{f"rmsnorm_{w}": (rmsnorm, lambda w=w: (torch.randn((1 << 26) // w, w, device="cuda", dtype=BF16),
                                              torch.randn(w, device="cuda", dtype=BF16)), _read_write)
       for w in (1536, 5120)},
    # GPT-2's vocabulary: 50257 classes
    "ce_50257": _ce(8192, 50257),
    "softmax_50257": _rows(_softmax, 2048, 50257),
    # pointwise over an odd number of elements: no vector of the flat tensor is aligned to a
    # mask it can prove constant
    "relu_add_odd": (lambda x, y: torch.relu(x) + y + 1,
                     lambda: (torch.randn((64 << 20) - 1, device="cuda"), torch.randn((64 << 20) - 1, device="cuda")),
                     lambda a: 3 * a[0].numel() * 4),
    "add_odd_bf16": (torch.add, lambda: (torch.randn((64 << 20) - 1, device="cuda", dtype=BF16),
                                         torch.randn((64 << 20) - 1, device="cuda", dtype=BF16)),
                     lambda a: 3 * a[0].numel() * 2),
}


TRANSPOSES = {
    # pointwise kernels reading along one dimension and writing along another: 2D tiles
    "transpose_copy": _rows(lambda x: (x.t() * 2).contiguous(), 8192, 8192),
    "batched_mT_add": (lambda x, y: x.mT + y, lambda: (torch.randn(64, 512, 512, device="cuda", dtype=BF16),
                                                       torch.randn(64, 512, 512, device="cuda", dtype=BF16)),
                       lambda a: 3 * a[0].numel() * 2),
    "permute_021": (lambda x: (x.permute(0, 2, 1) * 2).contiguous(),
                    lambda: (torch.randn(64, 1000, 1024, device="cuda", dtype=BF16),), _read_write),
}


COLUMNS = {
    # reductions over a dim that is not the last (pooling a (batch, seq, hidden) activation over
    # its sequence), and full reductions, over element counts with and without a divisor
    "sum_dim1_bf16": (lambda x: x.sum(1), lambda: (torch.randn(64, 2048, 768, device="cuda", dtype=BF16),), _read),
    "mean_dim1_f32": (lambda x: x.mean(1), lambda: (torch.randn(32, 1024, 1024, device="cuda"),), _read),
    "full_sum": (torch.sum, lambda: (torch.randn(64 << 20, device="cuda"),), _read),
    "full_sum_odd": (torch.sum, lambda: (torch.randn((64 << 20) - 1, device="cuda"),), _read),
    "full_sum_odd_bf16": (torch.sum, lambda: (torch.randn((64 << 20) - 1, device="cuda", dtype=BF16),), _read),
    "layernorm_999": _layer_norm(1 << 16, 999),
    "softmax_999": _rows(_softmax, 1 << 16, 999),
}


def _pool(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The ragged suite's mean pooling, on values and offsets (ember.ragged.segment_mean's formula)."""
    sums = torch.ops.ember.segment_reduce(values.float(), offsets, "sum")
    return (sums / offsets.diff().clamp(min=1).float()[:, None]).to(values.dtype)


def _pool_inputs(width: int = 768, docs: int = 256, longest: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.randint(1, longest + 1, (docs,), generator=torch.Generator().manual_seed(0))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).cuda()
    return torch.randn(int(lengths.sum()), width, device="cuda", dtype=torch.bfloat16), offsets


def _giou(pred: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The GIoU study's ragged loss (its forward: row ids searched in the offsets, one reduction)."""
    from ember.ragged import Ragged
    from ember.workloads.giou import ragged_giou_loss
    return ragged_giou_loss(pred, Ragged._make(values, offsets, 256))


def _giou_inputs(batch: int = 1024) -> tuple[torch.Tensor, ...]:
    from ember.workloads.giou import make_batch
    from ember.workloads.giou_bench import pack
    pred, targets, _ = make_batch(batch, BF16)
    r = pack(targets, torch.device("cuda"))
    torch._dynamo.mark_dynamic(r.values, 0)  # the box count varies, as in the study's training step
    return pred.cuda(), r.values, r.offsets


RAGGED = {
    # segment kernels: the ragged suite's pooling (256 documents of 1..512 tokens, width 768),
    # and narrower and wider features
    "segment_mean_pool": (_pool, _pool_inputs, lambda a: a[0].numel() * 2),
    "segment_mean_pool64": (_pool, lambda: _pool_inputs(64, 2048), lambda a: a[0].numel() * 2),
    "segment_mean_pool4096": (_pool, lambda: _pool_inputs(4096), lambda a: a[0].numel() * 2),
    # a handful of long documents: too few row blocks to fill the GPU unless their rows split
    "segment_mean_long": (_pool, lambda: _pool_inputs(768, 4, 32768), lambda a: a[0].numel() * 2),
    # the GIoU study's ragged loss over 1024 images of about 2 boxes, a symbolic box count (a
    # latency-bound reduction)
    "giou_ragged": (_giou, _giou_inputs, None),
}


SCANS = {
    # cumulative scans (a scan kernel walks each row's chunks in order, a carry per row): rows
    # as wide as a hidden size, few long rows (one program per row, nothing to split) and many
    # short ones (position ids of short sequences)
    "cumsum_bf16": _rows(lambda x: x.cumsum(-1), 16384, 4096),
    "cumsum_f32": _rows(lambda x: x.cumsum(-1), 16384, 4096, torch.float32),
    "cumsum_long": _rows(lambda x: x.cumsum(-1), 8, 1 << 20, torch.float32),
    "cumsum_short": _rows(lambda x: x.cumsum(-1), 1 << 20, 64, torch.float32),
    "cumsum_1000": _rows(lambda x: x.cumsum(-1), 1 << 16, 1000, torch.float32),
    "logcumsumexp_f32": _rows(lambda x: torch.logcumsumexp(x, -1), 4096, 4096, torch.float32),
    "cumprod_f32": _rows(lambda x: (1 - x.sigmoid() * 0.01).cumprod(-1), 4096, 4096, torch.float32),
    # rows as wide as a vocabulary: a plain scan, and a softmax's (a row-stats kernel first)
    "cumsum_vocab": _rows(lambda x: x.cumsum(-1), 1024, 32000),
    "softmax_cumsum": _rows(lambda x: torch.softmax(x, -1).cumsum(-1), 1024, 32000),
    **{f"cumsum_vocab_{n}": _rows(lambda x: x.cumsum(-1), n, 32000) for n in (64, 256, 4096)},
}

# wide rows only reduced (a softmax's or cross-entropy's statistics) at batch sizes from a few
# SMs' worth of rows to many waves
ROW_STATS = {f"lse_vocab_{n}": _rows(lambda x: torch.logsumexp(x, -1), n, 32000, BF16, _read)
             for n in (256, 512, 1024, 2048, 4096, 8192)}


def parse(spec: str, only: str) -> dict:
    if "=" in spec:  # some parameters only, e.g. SPLIT=1
        config = {k: int(v) for k, v in (kv.split("=") for kv in spec.split(","))}
    else:
        parts = [int(p) for p in spec.split(",")]
        x, r, w = parts[:3]
        config = dict(XBLOCK=x, RBLOCK=r, num_warps=w, num_stages=parts[3] if len(parts) > 3 else 1,
                      PERSISTENT=bool(parts[4]) if len(parts) > 4 else False)
        if len(parts) > 5:
            config["SPLIT"] = parts[5]
    if only:
        config["only"] = only
    return config


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--case", required=True)
    p.add_argument("--configs", default="",
                   help="';'-separated XBLOCK,RBLOCK,warps[,stages[,persistent[,split]]] or KEY=value,...")
    p.add_argument("--only", default="", help="force the configurations on kernels whose name contains this")
    p.add_argument("--train", action="store_true", help="time forward + backward instead (errors are not checked)")
    p.add_argument("--leaves", type=int, default=None,
                   help="with --train: only the first N floating inputs require grad (default: all)")
    p.add_argument("--no-inductor", action="store_true", help="leave Inductor out (it fails on some cases' training)")
    p.add_argument("--cuda", action="store_true", help="also time the CUDA C++ backend (its own launch heuristic)")
    args = p.parse_args()
    from triton.testing import do_bench
    os.environ.setdefault("EMBER_CACHE_DIR", "/tmp/ember-sweep")
    every = {**cases(1.0), **LONG_ROWS, **EPILOGUES, **SHORT_ROWS, **ODD_WIDTHS, **TRANSPOSES, **COLUMNS, **RAGGED,
             **SCANS, **ROW_STATS}
    fn, make, nbytes = every[args.case]
    torch.manual_seed(0)
    inputs = make()
    ref = fn(*[x.double() if x.is_floating_point() else x for x in inputs])
    # every variant is a compile of the same function: Dynamo caches one entry per backend
    # (and falls back to eager after its default limit of 8)
    specs = [s for s in args.configs.split(";") if s]
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(specs) + 4)
    variants = {"eager": fn, "inductor": torch.compile(fn), "ember heuristic": ember.compile(fn)}
    if args.no_inductor:
        del variants["inductor"]
    if args.cuda:
        variants["ember cuda"] = ember.compile(fn, options={"gpu_backend": "cuda"})
    for spec in specs:
        variants[spec] = ember.compile(fn, options={"triton_launch": parse(spec, args.only)})
    bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}, copy {bw / 1e9:.0f} GB/s, case {args.case}")
    if args.train:
        floats = [i for i, x in enumerate(inputs) if x.is_floating_point()][:args.leaves]
        inputs = [x.requires_grad_() if i in floats else x for i, x in enumerate(inputs)]
        grad = torch.randn_like(ref, dtype=inputs[0].dtype) if ref.dim() else None
    for name, f in variants.items():
        call = train_step(f, inputs, grad) if args.train else (lambda f=f: f(*inputs))
        try:
            if args.train:
                call()
                err = float("nan")  # gradients are checked by gpu_fusion.py --train
            else:
                err = rel_error(call(), ref)
        except Exception as e:  # noqa: BLE001 -- a configuration that does not compile is a result
            print(f"{name:>20}: FAILED {type(e).__name__}: {str(e)[:200]}")
            continue
        ms = do_bench(call, warmup=25, rep=100, return_mode="median")
        share = f"{100 * nbytes(inputs) / (ms * 1e-3) / bw:.0f}% of copy" if nbytes and not args.train else ""
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(100):  # (launches queue: the host's own time per call, not the GPU's)
            call()
        host = (time.perf_counter() - start) / 100 * 1e6
        torch.cuda.synchronize()
        print(f"{name:>20}: {ms * 1e3:7.1f} us {share:>12} host {host:5.1f} us err {err:.1e}  "
              f"{kernel_times(call, []) if name != 'eager' else ''}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
