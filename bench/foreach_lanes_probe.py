"""Does a foreach kernel run faster with each program on one tensor (a "lane") than on all of them?

ember fuses a foreach optimizer step over equal-sized parameters into one kernel whose every
program loads and stores its block of every parameter (SGD over 8 tensors: 24 load and 16 store
streams a program). Inductor's combo kernels give each program one tensor's block instead
(3 loads, 2 stores). This probe writes both forms by hand for SGD with momentum and Adam over
``--params`` x ``--numel`` floats, in a few launch configurations, checks them against eager's
update, and times them beside eager, Inductor and ember's compiled steps (CUDA events, medians of
interleaved rounds).

    PYTHONPATH=. python bench/foreach_lanes_probe.py [--params 2,8] [--numel 1048576]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import tempfile
import warnings

import torch

from bench.common import interleaved_gpu_times, table

BODIES = {
    # (tensors per lane, loads, math and stores); a lane's tensors are t0, t1, ... in that order
    "sgd": (3, """
        p = tl.load(t0 + idx, mask)
        g = tl.load(t1 + idx, mask)
        b = tl.load(t2 + idx, mask)
        b = b * 0.9 + g
        tl.store(t2 + idx, b, mask)
        tl.store(t0 + idx, p + b * -0.01, mask)"""),
    "adam": (4, """
        p = tl.load(t0 + idx, mask)
        g = tl.load(t1 + idx, mask)
        m = tl.load(t2 + idx, mask)
        v = tl.load(t3 + idx, mask)
        m = m * 0.9 + g * 0.1
        v = v * 0.999 + g * g * 0.001
        tl.store(t2 + idx, m, mask)
        tl.store(t3 + idx, v, mask)
        tl.store(t0 + idx, p - 0.001 * (m / 0.1) / (tl.sqrt(v / 0.001) + 1e-8), mask)"""),
}


def _lane_body(body: str, lane: int, per: int, indent: str) -> str:
    lines = [line.strip() for line in body.strip().splitlines()]
    out = []
    for line in lines:
        for j in range(per):
            line = line.replace(f"t{j} ", f"a{lane * per + j} ")
        out.append(indent + line)
    return "\n".join(out)


def _rename_values(text: str, lane: int) -> str:
    return re.sub(r"\b([pgbmv])\b", lambda m: f"{m.group(1)}{lane}", text)


def kernel_source(name: str, lanes: int) -> str:
    per, body = BODIES[name]
    args = ", ".join(f"a{i}" for i in range(lanes * per))
    joint_loads, joint_rest = [], []
    for lane in range(lanes):
        text = _rename_values(_lane_body(body, lane, per, "    "), lane)
        for line in text.splitlines():
            (joint_loads if "tl.load" in line else joint_rest).append(line)
    split = []
    for lane in range(lanes):
        split.append(f"    {'if' if lane == 0 else 'elif'} lane == {lane}:")
        split.append(_rename_values(_lane_body(body, lane, per, "        "), lane))
    return f"""import triton
import triton.language as tl


@triton.jit
def joint({args}, n, XBLOCK: tl.constexpr):
    idx = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = idx < n
{chr(10).join(joint_loads)}
{chr(10).join(joint_rest)}


@triton.jit
def lanes({args}, n, NBLK, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lane = pid // NBLK
    idx = (pid - lane * NBLK) * XBLOCK + tl.arange(0, XBLOCK)
    mask = idx < n
{chr(10).join(split)}
"""


def load_kernels(name: str, lanes: int):
    path = os.path.join(tempfile.mkdtemp(), f"lanes_{name}.py")
    with open(path, "w") as f:
        f.write(kernel_source(name, lanes))
    spec = importlib.util.spec_from_file_location(f"lanes_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tensors(name: str, params: int, numel: int, seed: int = 0) -> list[torch.Tensor]:
    """Each lane's tensors in the kernels' order: the parameter, its gradient, its state."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(params):
        lane = [torch.randn(numel, device="cuda", generator=g) for _ in range(BODIES[name][0])]
        if name == "adam":
            lane[3] = lane[3].abs()  # the second moment
        out += lane
    return out


def optimizer_steps(name: str, params: int, numel: int):
    import ember
    steps = {}
    for variant in ("eager", "inductor", "ember"):
        ps = [torch.randn(numel, device="cuda", requires_grad=True) for _ in range(params)]
        for p in ps:
            p.grad = torch.randn_like(p)
        opt = (torch.optim.SGD(ps, lr=1e-2, momentum=0.9, foreach=True) if name == "sgd"
               else torch.optim.Adam(ps, lr=1e-3, foreach=True))
        step = {"eager": opt.step, "inductor": torch.compile(opt.step), "ember": ember.compile(opt.step)}[variant]
        for _ in range(3):
            step()
        steps[variant] = step
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="8", help="comma-separated tensor counts")
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for params in map(int, args.params.split(",")):
        probe(params, args.numel, args.rounds)


def probe(params: int, n: int, rounds: int) -> None:
    print(f"# foreach lanes probe, {params} x {n} float32, {torch.cuda.get_device_name()}")
    for name in ("sgd", "adam"):
        per = BODIES[name][0]
        module = load_kernels(name, params)
        variants = {}
        base = tensors(name, params, n)
        # correctness: every hand-written form against the joint kernel at its first configuration
        expected = [t.clone() for t in base]
        module.joint[(triton_cdiv(n, 1024),)](*expected, n, XBLOCK=1024, num_warps=4)
        for x, w in ((512, 4), (1024, 4), (2048, 8)):
            got = [t.clone() for t in base]
            nblk = triton_cdiv(n, x)
            module.lanes[(nblk * params,)](*got, n, nblk, XBLOCK=x, num_warps=w)
            assert all(torch.allclose(a, b) for a, b in zip(got, expected)), f"{name} lanes {x}/{w} differ"
        work = [t.clone() for t in base]
        for x, w in ((512, 4), (1024, 4), (1024, 8)):
            variants[f"joint {x}/{w}"] = (lambda x=x, w=w, module=module, work=work: module.joint[(triton_cdiv(n, x),)](
                *work, n, XBLOCK=x, num_warps=w))
        for x, w in ((512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 8)):
            nblk = triton_cdiv(n, x)
            grid = (nblk * params,)
            variants[f"lanes {x}/{w}"] = (lambda x=x, w=w, nblk=nblk, grid=grid, module=module, work=work:
                                          module.lanes[grid](*work, n, nblk, XBLOCK=x, num_warps=w))
        variants.update({f"step {k}": v for k, v in optimizer_steps(name, params, n).items()})
        times = interleaved_gpu_times(variants, rounds=rounds)
        moved = params * n * 4 * (per + (per - 1))  # loads + stores (the gradient is not stored)
        rows = [[k, f"{t * 1e3:.1f}", f"{moved / (t * 1e-3) / 1e12:.2f}"] for k, t in times.items()]
        print(f"\n## {name}: {per} loads and {per - 1} stores a tensor\n")
        print(table(rows, ["variant", "µs", "TB/s"]))


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


if __name__ == "__main__":
    main()
