"""bench/fuzz.py's random programs: a DAG of 2-8 ops over 1-3 inputs, emitted as Python source.
Each candidate line is tried on meta tensors first (shape errors and values past the element
budget are dropped), so that programs run; see fuzz.py for how they are checked."""

from __future__ import annotations

import math
import random
import re
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from fuzz_int_ops import IntegerOps, broadcasts  # (bench/ is on sys.path)

AWKWARD = [1, 3, 7, 17, 33, 127, 128, 129, 1000]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------- inputs (copied into reproducers)

def make_inputs(specs: list[dict], device: str, train: bool = False, leading: int | None = None) -> list:
    """Build the program's inputs from their specs (each seeded). ``leading`` replaces dim 0 of
    the inputs marked ``dyn`` (the --dynamic second shape)."""
    out = []
    for s in specs:
        if s["kind"] == "alias":  # a view of an earlier input: the program's inputs share memory
            x, view = out[s["of"]], s["view"]
            out.append(x if view == "same" else x[1:] if view == "rows" else x[..., 1:] if view == "cols"
                       else x.transpose(-1, -2) if view == "t" else x[::2])
            continue
        g = torch.Generator().manual_seed(s["seed"])
        shape = list(s["shape"])
        if leading is not None and s.get("dyn"):
            shape[0] = leading
        n = math.prod(shape)
        if s["kind"] == "target":
            t = torch.randint(0, s["classes"], shape, generator=g)
            t[torch.rand(shape, generator=g) < 0.15] = -100
            out.append(t.to(device))
            continue
        alloc = list(shape)
        if s["layout"] == "t" and len(shape) >= 2:
            alloc[-1], alloc[-2] = alloc[-2], alloc[-1]
        elif s["layout"] == "slice" and len(shape) >= 1:
            alloc[-1] = alloc[-1] * 2
        elif s["layout"] == "offset" and len(shape) >= 1:
            alloc[0] = alloc[0] + 1
        if s["kind"] == "bool":  # each element set with probability `density` (0: none, 1: all)
            base = torch.rand(alloc, generator=g) < s["density"]
        elif s["kind"] == "int":  # small values (many ties), or the dtype's whole range and its ends
            info = torch.iinfo(getattr(torch, s["dtype"]))
            lo, hi = (info.min, info.max) if s.get("wide") else (max(info.min, -40), min(info.max, 40))
            base = torch.randint(lo, hi, alloc, generator=g, dtype=torch.int64)
            if s.get("wide") and base.numel():
                flat = base.view(-1)
                picks = torch.randint(0, flat.numel(), (max(1, flat.numel() // 20),), generator=g)
                flat[picks] = torch.tensor([info.min, info.max, 0, -1 if info.min else 1])[
                    torch.randint(0, 4, picks.shape, generator=g)]
        elif s["kind"] == "perm":  # distinct values: no ties for argmax/argsort
            m = math.prod(alloc)
            base = (torch.randperm(m, generator=g).float() - m / 2) * (4.0 / max(m, 1))
            base = base.reshape(alloc)
        else:
            base = torch.randn(alloc, generator=g) * s.get("scale", 1.0)
            if s.get("special") and base.numel():
                flat = base.view(-1)
                picks = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=g)
                vals = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
                flat[picks] = vals[torch.randint(0, 4, picks.shape, generator=g)]
        base = base.to(getattr(torch, s["dtype"])).to(device)
        if s["layout"] == "t" and len(shape) >= 2:
            base = base.transpose(-1, -2)
        elif s["layout"] == "slice" and len(shape) >= 1:
            base = base[..., ::2]
        elif s["layout"] == "offset" and len(shape) >= 1:
            base = base[1:]
        assert list(base.shape) == shape and n == base.numel()
        if train and base.is_floating_point():
            base = base.detach().requires_grad_(True)
        out.append(base)
    return out


# ---------------------------------------------------------------- program generation

class Program:
    """A generated program: source of ``fn``, input specs, and flags for the comparison."""

    def __init__(self, seed: int, source: str, specs: list[dict], disc: bool, outputs: int) -> None:
        self.seed, self.source, self.specs, self.disc, self.outputs = seed, source, specs, disc, outputs
        # the least precise float dtype anywhere in the program sets the tolerance floor
        text = source + " ".join(s["dtype"] for s in specs if s["kind"] != "target")
        self.low = next((d for n, d in (("bfloat16", torch.bfloat16), ("float16", torch.float16))
                         if n in text), torch.float32)


class Generator(IntegerOps):
    """Builds one random program. Each candidate line is tried on meta tensors; lines that
    raise there (shape errors) or grow a value past the element budget are dropped."""

    UNARY = ["torch.relu({x})", "F.gelu({x})", "F.gelu({x}, approximate='tanh')", "F.silu({x})",
             "torch.sigmoid({x})", "torch.tanh({x})", "torch.exp({x})", "torch.log({x}.abs() + 1e-3)",
             "torch.sqrt({x}.abs())", "torch.rsqrt({x}.abs() + 1e-2)", "-{x}", "{x}.abs()",
             "torch.reciprocal({x}.abs() + 0.5)", "torch.sin({x})", "torch.erf({x})", "F.softplus({x})",
             "{x}.clamp(-0.5, 0.75)", "{x}.pow(2)", "{x}.abs().pow(0.5)", "F.leaky_relu({x}, 0.1)",
             "F.hardswish({x})", "F.elu({x})", "{x} * 2.0 + 1.0", "F.hardtanh({x}, -0.5, 1.0)",
             "F.relu6({x} * 4)", "F.mish({x})", "F.selu({x})", "F.celu({x}, 0.5)", "F.logsigmoid({x})",
             "F.softsign({x})", "F.hardsigmoid({x})", "torch.expm1({x})", "torch.log1p({x}.abs())",
             "torch.atan({x})", "torch.cos({x})", "{x}.clamp_min(0.25)"]
    DISC_UNARY = ["torch.floor({x})", "torch.round({x})", "torch.round({x}).to(torch.int32)",
                  "({x} > 0.1).to({x}.dtype)"]
    BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / ({b}.abs() + 0.5)", "torch.maximum({a}, {b})",
              "torch.minimum({a}, {b})", "torch.where({a} > {b}, {a}, {b})", "torch.lerp({a}, {b}.to({a}.dtype), 0.3)",
              "{a} * 0.5 + {b}"]
    DISC_BINARY = ["{a}.masked_fill({b} > 0, 0.5)", "({a} > {b}).to({a}.dtype)", "{a} >= {b}"]

    # op_more's wider op set (added 2026-12-05: a seed's programs from then on differ from before)
    MORE_UNARY = ["torch.nan_to_num({x}, nan=0.0, posinf=2.0, neginf=-2.0)",
                  "torch.logit(torch.sigmoid({x}), eps=1e-3)",
                  "torch.erfinv(torch.tanh({x}) * 0.9)", "torch.sinh({x}.clamp(-3, 3))", "torch.asinh({x})",
                  "torch.frac({x} * 3)", "{x}.square()", "torch.exp2({x}.clamp(-10, 10))",
                  "torch.log2({x}.abs() + 1e-2)", "torch.log10({x}.abs() + 1e-2)", "torch.cosh({x}.clamp(-3, 3))",
                  "torch.acos(torch.tanh({x}) * 0.9)", "torch.tan({x}.clamp(-1.2, 1.2))", "torch.sinc({x})",
                  "torch.special.expit({x})", "torch.special.log_ndtr({x})", "torch.special.ndtr({x})",
                  "F.softplus({x}, beta=2.0, threshold=5.0)", "F.rrelu({x}, 0.1, 0.3, training=False)",
                  "F.hardshrink({x}, 0.3)", "F.softshrink({x}, 0.2)", "F.tanhshrink({x})",
                  "F.threshold({x}, 0.1, -1.0)",
                  "torch.clamp({x}, min=-0.3)", "{x}.clamp(max=0.4)", "F.glu(torch.cat([{x}, {x}.flip(-1)], -1), -1)"]
    # (floor_divide and heaviside of detached values: torch has no derivative for them)
    MORE_DISC_UNARY = ["torch.trunc({x} * 3)", "torch.sign({x})", "torch.ceil({x} * 2)",
                       "({x} * 4).detach().floor_divide(3)", "torch.signbit(torch.nan_to_num({x}, 0.0)).to({x}.dtype)",
                       "torch.isnan({x}) | torch.isinf({x})",
                       "torch.heaviside({x}.detach(), torch.tensor(0.5, dtype={x}.dtype, device={x}.device))"]
    MORE_BINARY = ["torch.atan2({a}, {b})", "torch.hypot({a}, {b})", "torch.xlogy({a}.abs(), {b}.abs() + 0.1)",
                   "torch.addcmul({a}, {a}, {b}, value=0.5)", "torch.addcdiv({a}, {a}, {b}.abs() + 1.0, value=-0.5)",
                   "({a}.abs() + 0.1).pow({b}.clamp(-2, 2))", "torch.where({b} > 0, {a}, 0.0)",
                   "torch.clamp({a}, min={b} - 1, max={b} + 1)", "torch.fmax({a}, {b})", "torch.fmin({a}, {b})",
                   "torch.logaddexp({a}, {b})", "torch.sub({a}, {b}, alpha=2)", "torch.true_divide({a}, {b}.abs() + 2)"]
    # (copysign reads a NaN-free sign, as signbit does: a computed NaN's sign is no one's to match)
    MORE_DISC_BINARY = ["torch.fmod({a}, {b}.abs() + 0.5)", "torch.remainder({a}, {b}.abs() + 0.5)",
                        "torch.copysign({a}, torch.nan_to_num({b}, 0.0))",
                        "torch.div({a}, {b}.abs() + 0.5, rounding_mode='floor')",
                        "torch.div({a}, {b}.abs() + 0.5, rounding_mode='trunc')", "torch.eq({a}, {b}.round())",
                        "torch.isclose({a}, {b}, atol=0.5)"]

    def __init__(self, seed: int, device: str, backend: str, dtypes: list[str], train: bool,
                 dynamic: bool) -> None:
        self.r = random.Random(seed)
        self.seed, self.device, self.train, self.dynamic = seed, device, train, dynamic
        self.dtypes = dtypes
        self.budget = 2_000_000 if device == "cuda" else (20_000 if backend == "triton" else 200_000)
        self.specs: list[dict] = []
        self.env: dict[str, torch.Tensor] = {}
        self.flags: dict[str, dict] = {}
        self.lines: list[str] = []
        self.disc = False
        self.count = 0
        self.favour: frozenset[str] = frozenset()  # (op families drawn 8x as often: --favour int,more)

    # -- inputs
    def shape(self, rank: int | None = None) -> list[int]:
        """A random awkward shape within the element budget."""
        r = self.r
        rank = rank if rank is not None else r.choice([1, 2, 2, 2, 3, 3, 4])
        sizes = AWKWARD + ([2048, 4100] if self.device == "cuda" else [])
        while True:
            shape = [r.choice(sizes if i == rank - 1 else AWKWARD[:6]) for i in range(rank)]
            if rank >= 2 and r.random() < 0.3:
                shape[0] = r.choice([2, 4, 8, 16, 64])
            if r.random() < 0.03:
                shape[r.randrange(rank)] = 0
            if math.prod(shape) <= self.budget // 4:
                return shape

    def add_input(self, shape: list[int], kind: str = "float", dtype: str | None = None, **extra: Any) -> str:
        """Declare a new input; returns its name."""
        r = self.r
        name = f"x{len(self.specs)}"
        dt = dtype or str(DTYPES[r.choice(self.dtypes)]).replace("torch.", "")
        if kind == "perm" and math.prod(shape) > 256:
            dt = "float32"
        spec = {"name": name, "shape": list(shape), "kind": kind, "dtype": dt, "seed": r.randrange(2**31),
                "layout": r.choice(["contig"] * 5 + ["t", "slice", "offset"]) if kind != "target" else "contig",
                "special": kind == "float" and r.random() < 0.08, "scale": r.choice([1.0, 1.0, 3.0])}
        spec.update(extra)
        self.specs.append(spec)
        self.env[name] = self._meta_input(spec)
        self.flags[name] = {"perm": kind == "perm", "input": name, "fresh": False}
        return name

    def maybe_alias(self, name: str) -> None:
        """Sometimes make input ``name`` a view of input x0 (``fn(x, x[1:])``, ``fn(x, x)``): Dynamo
        merges inputs that share memory, and a write to one changes the other. (Drawn from a
        generator of its own, so that programs without one are as before.)"""
        pick = random.Random(self.seed * 7919 + len(self.specs))
        x0 = self.env["x0"]
        if pick.random() > 0.12 or self.specs[0]["kind"] != "float":
            return
        views = ["same"] + (["rows", "cols", "every2"] if x0.dim() else []) + (["t"] if x0.dim() >= 2 else [])
        view = pick.choice(views)
        spec = self.specs[-1]
        spec.clear()
        spec.update(name=name, kind="alias", of=0, view=view, dtype=self.specs[0]["dtype"])
        self.env[name] = make_inputs([self.specs[0], spec], "meta")[1]
        self.flags[name] = dict(self.flags["x0"], input=name)

    @staticmethod
    def _meta_input(spec: dict) -> torch.Tensor:
        """A meta tensor with the input's shape, dtype and strides."""
        if spec["kind"] == "target":
            return torch.empty(spec["shape"], dtype=torch.int64, device="meta")
        return make_inputs([dict(spec, kind="float", special=False)], "meta")[0]

    # -- emission
    def try_line(self, expr: str, flags: dict | None = None, disc: bool = False, names: int = 1) -> str | None:
        """Emit ``v = expr`` if it runs on meta tensors within budget; returns the new name."""
        new = [f"v{self.count + i}" for i in range(names)]
        line = f"{', '.join(new)} = {expr}"
        scope = dict(self.env)
        try:
            exec(line, {"torch": torch, "F": F}, scope)
        except Exception:  # noqa: BLE001 -- an invalid combination: try another op
            return None
        for n in new:
            v = scope[n]
            if not isinstance(v, torch.Tensor) or v.numel() > self.budget:
                return None
        self.count += names
        self.lines.append(line)
        for n in new:
            self.env[n] = scope[n]
            self.flags[n] = dict(flags or {"perm": False, "input": None, "fresh": True})
        self.disc |= disc
        return new[0]

    def floats(self) -> list[str]:
        return [n for n, t in self.env.items() if t.is_floating_point()]

    def pick(self, names: list[str]) -> str:
        """A value to build on, favouring the newest computed ones (a chain, not a fan of inputs)."""
        computed = [n for n in self.env if n.startswith("v")]
        weights = [6 if computed and n == computed[-1] else 3 if n.startswith("v") else 1 for n in names]
        return self.r.choices(names, weights=weights)[0]

    def dim(self, name: str) -> int:
        nd = self.env[name].dim()
        return self.r.randrange(-nd, nd) if nd else 0

    # -- ops, each returns True when it emitted something
    def op_unary(self) -> bool:
        x = self.pick(self.floats())
        if self.r.random() < 0.15:
            return self.try_line(self.r.choice(self.DISC_UNARY).format(x=x), disc=True) is not None
        expr = self.r.choice(self.UNARY).format(x=x)
        fl = {"perm": self.flags[x]["perm"] and expr.startswith(("-", "{x} * 2")), "input": None, "fresh": True}
        return self.try_line(expr, fl) is not None

    def op_binary(self) -> bool:
        a = self.pick(self.floats())
        others = [n for n in self.floats() if n != a]
        sa = self.env[a].shape
        compat = [n for n in others if broadcasts(sa, self.env[n].shape)]
        if compat and self.r.random() < 0.8:
            b = self.pick(compat)
        elif self.r.random() < 0.5:
            b = f"{a}.flip(-1)" if self.env[a].dim() else "1.5"
        else:  # a fresh input broadcasting against a
            shp = [s if self.r.random() < 0.7 else 1 for s in sa][self.r.randrange(len(sa) + 1):] if len(sa) else []
            b = self.add_input(shp)
        if self.r.random() < 0.15:
            return self.try_line(self.r.choice(self.DISC_BINARY).format(a=a, b=b), disc=True) is not None
        return self.try_line(self.r.choice(self.BINARY).format(a=a, b=b)) is not None

    def op_more(self) -> bool:
        """The wider op set: more elementwise functions, and structural ops (triangles, rolls,
        repeats, differences, einsums, windows)."""
        r = self.r
        kind = r.choice(["unary", "unary", "binary", "binary", "shape"])
        x = self.pick(self.floats())
        if kind == "unary":
            if r.random() < 0.2:
                return self.try_line(r.choice(self.MORE_DISC_UNARY).format(x=x), disc=True) is not None
            return self.try_line(r.choice(self.MORE_UNARY).format(x=x)) is not None
        if kind == "binary":
            compat = [n for n in self.floats() if n != x and broadcasts(self.env[x].shape, self.env[n].shape)]
            b = self.pick(compat) if compat else f"{x}.flip(-1)" if self.env[x].dim() else "0.75"
            if r.random() < 0.25:
                return self.try_line(r.choice(self.MORE_DISC_BINARY).format(a=x, b=b), disc=True) is not None
            return self.try_line(r.choice(self.MORE_BINARY).format(a=x, b=b)) is not None
        t = self.env[x]
        nd = t.dim()
        if nd == 0:
            return False
        d = self.dim(x)
        choices = [f"torch.roll({x}, {r.choice([1, -2])}, {d})", f"torch.diff({x}, dim={d})",
                   f"{x}.repeat({', '.join(str(r.choice([1, 2])) for _ in range(nd))})",
                   f"torch.repeat_interleave({x}, 2, dim={d})", f"{x}.unfold({d}, {min(2, t.shape[d]) or 1}, 1)",
                   f"torch.cumsum({x}.flip({d}), {d}).flip({d})", f"{x} - {x}.mean({d}, keepdim=True)",
                   f"{x} / ({x}.abs().amax({d}, keepdim=True) + 1)", f"F.softmin({x}, {d})"]
        if nd >= 2:
            choices += [f"torch.tril({x})", f"torch.triu({x}, 1)", f"torch.einsum('...ij,...kj->...ik', {x}, {x})",
                        f"{x}.masked_fill(torch.ones({x}.shape[-2:], dtype=torch.bool, "
                        f"device={x}.device).tril(-1), 0.0)",
                        f"torch.rot90({x}, 1, [-2, -1])", f"{x}.diagonal(0, -2, -1)"]
        line = r.choice(choices)
        fl = None
        if ".unfold(" in line or ".diagonal(" in line:  # (views of x: windows of step 1 overlap)
            fl = dict(self.flags[x], fresh=False, overlap=self.flags[x].get("overlap") or ".unfold(" in line)
        return self.try_line(line, fl) is not None

    def op_reduce(self) -> bool:
        x = self.pick(self.floats())
        r, nd = self.r, self.env[x].dim()
        d, k = self.dim(x), r.choice([True, False])
        dims = f"dim={d}, keepdim={k}"
        perm = self.flags[x]["perm"]
        choices = [f"{x}.sum({dims})", f"{x}.mean({dims})", f"{x}.amax({dims})", f"{x}.amin({dims})",
                   f"{x}.var({dims}, correction={r.choice([0, 1])})", f"{x}.std({dims}, correction={r.choice([0, 1])})",
                   f"torch.logsumexp({x}, {dims})", f"(1 + 0.1 * torch.tanh({x})).prod({dims})",
                   f"torch.where({x} > 1.5, 0, 1 + 0.1 * torch.tanh({x})).prod({dims})",  # (some zeros)
                   f"torch.linalg.vector_norm({x}, {dims})", f"({x} > 0).any({dims})", f"({x} > -1).all({dims})",
                   f"torch.max({x}, {dims}).values", f"{x}.sum()", f"{x}.mean()", f"{x}.amax()",
                   f"torch.sort({x}, dim={d}).values", f"torch.cumsum({x}, {d})",
                   f"torch.cumprod(1 + 0.1 * torch.tanh({x}), {d})", f"torch.logcumsumexp({x}, {d})",
                   f"torch.cummax({x}, {d}).values",
                   f"torch.topk({x}, {min(3, self.env[x].shape[d]) if nd else 1}, dim={d}).values"]
        if perm:  # no ties: index outputs are well defined
            choices += [f"{x}.argmax({dims})", f"{x}.argmin({dims})", f"torch.argsort({x}, dim={d})"]
            if r.random() < 0.3:
                return self.try_line(f"torch.max({x}, {dims})", names=2) is not None
        if r.random() < 0.1 and nd:
            return self.try_line(f"{x}.amax(dim={list(range(nd))[-2:]}, keepdim={k})") is not None
        return self.try_line(r.choice(choices)) is not None

    def op_row(self) -> bool:
        x = self.pick(self.floats())
        r, t = self.r, self.env[x]
        if t.dim() == 0:
            return False
        d, last = self.dim(x), t.shape[-1]
        kind = r.choice(["softmax", "log_softmax", "layer_norm", "rms", "normalize", "ce"])
        if kind in ("softmax", "log_softmax"):
            return self.try_line(f"torch.{kind}({x}, dim={r.choice([-1, d])})") is not None
        if kind == "normalize":
            return self.try_line(f"F.normalize({x}, dim={d})") is not None
        if kind == "layer_norm":
            args = ""
            if r.random() < 0.6:  # (eager CPU refuses weights of another dtype: ember does not, see report)
                dt = str(t.dtype).replace("torch.", "")
                args = f", {self.add_input([last], dtype=dt, special=False)}" + (
                    f", {self.add_input([last], dtype=dt, special=False)}" if r.random() < 0.7 else "")
            return self.try_line(f"F.layer_norm({x}, ({last},){args})") is not None
        if kind == "rms":
            w = self.add_input([last])
            return self.try_line(f"{x} * torch.rsqrt({x}.pow(2).mean(-1, keepdim=True) + 1e-6) * {w}") is not None
        c = last
        rows = t.numel() // c if c else 0
        if c == 0 or rows == 0:
            return False
        tgt = self.add_input([rows], kind="target", classes=c)
        red = r.choice(["mean", "sum", "none"])
        ls = r.choice([0.0, 0.0, 0.1])
        return self.try_line(f"F.cross_entropy({x}.reshape(-1, {c}), {tgt}, reduction='{red}', "
                             f"label_smoothing={ls}, ignore_index=-100)") is not None

    def op_view(self) -> bool:
        names = list(self.env)
        x = self.pick(names)
        r, t = self.r, self.env[x]
        nd, d = t.dim(), self.dim(x)
        fl = dict(self.flags[x], fresh=False)
        if nd == 0:
            return self.try_line(f"{x}.unsqueeze(0)", fl) is not None
        sh = list(t.shape)
        n = sh[d]
        choices = [f"{x}.transpose({d}, {self.dim(x)})", f"{x}.permute({r.sample(range(nd), nd)})",
                   f"{x}.reshape(-1)", f"{x}[{':, ' * (d % nd)}{r.choice([1, 0])}::{r.choice([2, 3])}]",
                   f"{x}.narrow({d}, {min(1, n)}, {max(0, n - 2)})", f"{x}.unsqueeze({r.randrange(nd + 1)})",
                   f"{x}.flip({d})", f"{x}.contiguous()", f"torch.chunk({x}, 2, dim={d})[{r.choice([0, -1])}]",
                   f"{x}.split({max(1, n // 3)}, dim={d})[0]", f"torch.cat([{x}, {x} * 0.5], dim={d})",
                   f"torch.stack([{x}, {x}.flip({d})], dim={r.randrange(nd + 1)})",
                   f"{x}.contiguous().view({', '.join(map(str, sh[:-2] + [-1]))})"]
        if nd == 2:
            choices.append(f"{x}.t()")
        if 1 in sh:
            new = [s if s != 1 else r.choice([1, 3, 8]) for s in sh]
            choices.append(f"{x}.expand({new})")
            choices.append(f"{x}.squeeze({sh.index(1)})")
        if nd >= 2 and sh[0] > 0:
            choices.append(f"{x}.reshape(-1, {math.prod(sh[1:])})" if self.dynamic else
                           f"{x}.reshape({sh[0] * sh[1]}, {', '.join(map(str, sh[2:])) or 1})")
        line = r.choice(choices)
        if "cat" in line or "stack" in line or "* 0.5" in line:
            fl = {"perm": False, "input": None, "fresh": True}
        if "expand" in line:
            fl["overlap"] = True
        return self.try_line(line, fl) is not None

    def op_cast(self) -> bool:
        x = self.pick(self.floats())
        r = self.r
        half = ["float16"] + (["bfloat16"] if "bf16" in self.dtypes else [])
        choices = [f"{x}.to(torch.{r.choice(half)}).to({x}.dtype)", f"{x}.to(torch.float32)",
                   f"{x}.to(torch.{r.choice(half)})"]
        return self.try_line(r.choice(choices)) is not None

    def op_index(self) -> bool:
        x = self.pick(self.floats())
        r, t = self.r, self.env[x]
        if t.dim() == 0 or t.numel() == 0:
            return False
        d, sh = self.dim(x), list(t.shape)
        n, dev = sh[d], f"device={x}.device"
        kind = r.choice(["gather", "take", "select", "getitem", "scatter", "index_add", "argmax_take"])
        if kind in ("gather", "take", "scatter", "argmax_take"):
            p = self.add_input(sh, kind="perm")
            if kind == "gather":
                return self.try_line(f"torch.gather({x}, {d}, torch.argsort({p}, dim={d}))") is not None
            if kind == "take":
                return self.try_line(f"torch.take_along_dim({x}, torch.argsort({p}, dim={d}), dim={d})") is not None
            if kind == "argmax_take":
                return self.try_line(f"torch.take_along_dim({x}, {p}.argmax({d}, keepdim=True), dim={d})") is not None
            div = r.choice([1, 2, 3])
            return self.try_line(f"torch.zeros({sh}, {dev}, dtype={x}.dtype).scatter_add_({d}, "
                                 f"torch.argsort({p}, dim={d}) // {div}, {x})") is not None
        if kind == "select":
            step = r.choice([1, 2])
            return self.try_line(f"{x}.index_select({d}, torch.arange({n} - 1, -1, -{step}, {dev}))") is not None
        if kind == "getitem":
            return self.try_line(f"{x}[torch.arange(0, {sh[0]}, {r.choice([1, 2, 3])}, {dev})]") is not None
        m = max(1, sh[0] // r.choice([1, 2, 3]))
        return self.try_line(f"torch.zeros([{m}] + {sh[1:]}, {dev}, dtype={x}.dtype).index_add_(0, "
                             f"torch.arange({sh[0]}, {dev}) % {m}, {x})") is not None

    def op_matmul(self) -> bool:
        x = self.pick([n for n in self.floats() if 1 <= self.env[n].dim() <= 3] or self.floats())
        r, t = self.r, self.env[x]
        if t.dim() not in (2, 3) or t.shape[-1] > 1100:
            return False
        k = t.shape[-1]
        n = r.choice([1, 3, 8, 16, 17, 33, 64, 128, 129])
        kind = r.choice(["matmul", "linear", "bmm"] if t.dim() == 3 else ["matmul", "linear"])
        if kind == "matmul":
            w = self.add_input([k, n], dtype=str(t.dtype).replace("torch.", ""))
            return self.try_line(f"{x} @ {w}") is not None
        if kind == "bmm":
            w = self.add_input([t.shape[0], k, n], dtype=str(t.dtype).replace("torch.", ""))
            return self.try_line(f"torch.bmm({x}, {w})") is not None
        w = self.add_input([n, k], dtype=str(t.dtype).replace("torch.", ""))
        bias = f", {self.add_input([n], dtype=str(t.dtype).replace('torch.', ''))}" if r.random() < 0.5 else ""
        return self.try_line(f"F.linear({x}, {w}{bias})") is not None

    def op_nn(self) -> bool:
        """Layers over (N, C, L) or (N, C, H, W) values: pooling, normalization, resampling,
        padding and convolution."""
        x = self.pick([n for n in self.floats() if self.env[n].dim() in (3, 4)] or self.floats())
        r, t = self.r, self.env[x]
        if t.dim() not in (3, 4):  # (an image or a sequence of its own)
            x = self.add_input(self.shape(r.choice([3, 4])), dyn=True)
            t = self.env[x]
        nd, c, dt = t.dim() - 2, t.shape[1], str(t.dtype).replace("torch.", "")
        k = r.choice([1, 2, 3])
        kind = r.choice(["max_pool", "avg_pool", "adaptive", "batch_norm", "group_norm", "instance_norm",
                         "interpolate", "pad", "conv"])
        if kind in ("max_pool", "avg_pool"):
            args = f"{k}, stride={r.choice([None, 1, 2])}, padding={r.randrange(k // 2 + 1)}, " \
                   f"ceil_mode={r.choice([False, True])}"
            if kind == "avg_pool":
                args += f", count_include_pad={r.choice([False, True])}"
            return self.try_line(f"F.{kind}{nd}d({x}, {args})") is not None
        if kind == "adaptive":
            size = ", ".join(str(r.choice([1, 2, 3, 5])) for _ in range(nd))
            return self.try_line(f"F.adaptive_{r.choice(['avg', 'max'])}_pool{nd}d({x}, ({size},))") is not None
        if kind in ("batch_norm", "group_norm", "instance_norm"):
            return self._norm(x, kind, c, dt)
        if kind == "interpolate":
            mode = r.choice(["nearest", "nearest-exact"] + (["linear"] if nd == 1 else ["bilinear", "bicubic"]))
            corners = f", align_corners={r.choice([False, True])}" if mode[-6:] in ("linear", "bicubic") else ""
            how = "scale_factor=2" if r.random() < 0.5 else f"size={[r.choice([1, 3, 8]) for _ in range(nd)]}"
            # (weighted modes read finite values: which of an infinity's neighbours turn NaN (a zero
            # weight times it) follows eager's kernel's arithmetic, not a semantic; Inductor spreads more)
            src = x if mode.startswith("nearest") else f"torch.nan_to_num({x}, 0.0, 2.0, -2.0)"
            return self.try_line(f"F.interpolate({src}, {how}, mode='{mode}'{corners})") is not None
        if kind == "pad":
            mode = r.choice(["constant", "reflect", "replicate", "circular"])
            return self.try_line(f"F.pad({x}, {tuple(r.choice([0, 1, 2]) for _ in range(2 * nd))}, "
                                 f"mode='{mode}')") is not None
        out, groups = r.choice([1, 3, 8]), r.choice([1, c]) if 0 < c <= 8 else 1
        wc = self.add_input([out * groups, c // groups] + [k] * nd, dtype=dt)
        bias = self.add_input([out * groups], dtype=dt) if r.random() < 0.5 else None
        return self.try_line(f"F.conv{nd}d({x}, {wc}, {bias}, stride={r.choice([1, 2])}, "
                             f"padding={r.randrange(k)}, groups={groups})") is not None

    def _norm(self, x: str, kind: str, c: int, dt: str) -> bool:
        r = self.r
        # (finite affine parameters: an infinite weight gives eager's x * (w / std) + (b - mean * w /
        # std) NaN where ember's (x - mean) / std * w + b is the infinity, a known difference)
        w, b = (self.add_input([c], dtype=dt, special=False) for _ in range(2))
        if kind == "batch_norm":
            if r.random() < 0.5:
                return self.try_line(f"F.batch_norm({x}, None, None, {w}, {b}, training=True)") is not None
            m, v = (self.add_input([c], dtype=dt) for _ in range(2))
            return self.try_line(f"F.batch_norm({x}, {m}.detach(), {v}.detach().abs() + 0.5, {w}, {b})") is not None
        if kind == "group_norm":
            g = r.choice([d for d in range(1, c + 1) if c % d == 0] or [1])
            return self.try_line(f"F.group_norm({x}, {g}, {w}, {b})") is not None
        return self.try_line(f"F.instance_norm({x}, weight={w}, bias={b})") is not None

    def op_loss(self) -> bool:
        """Losses between a value and another of its shape."""
        x = self.pick(self.floats())
        r, t = self.r, self.env[x]
        y = self.add_input(list(t.shape), dtype=str(t.dtype).replace("torch.", ""))
        red = r.choice(["mean", "sum", "none"])
        kind = r.choice([f"F.mse_loss({x}, {y}, reduction='{red}')", f"F.l1_loss({x}, {y}, reduction='{red}')",
                         f"F.smooth_l1_loss({x}, {y}, reduction='{red}', beta={r.choice([0.0, 0.5, 1.0])})",
                         f"F.huber_loss({x}, {y}, reduction='{red}', delta=0.5)",
                         f"F.binary_cross_entropy_with_logits({x}, torch.sigmoid({y}), reduction='{red}')",
                         f"F.binary_cross_entropy(torch.sigmoid({x}), torch.sigmoid({y}), reduction='{red}')",
                         f"F.kl_div(F.log_softmax({x}, -1), F.softmax({y}, -1), "
                         f"reduction='{red.replace('mean', 'batchmean')}')"])
        return self.try_line(kind) is not None

    def op_inplace(self) -> bool:
        r = self.r
        writable = [n for n in self.floats() if not self.flags[n].get("overlap") and not self.flags[n]["perm"]]
        if self.train:  # (not on an input, a leaf that requires grad, nor on a view of one: eager refuses)
            writable = [n for n in writable if n.startswith("v") and self.flags[n]["input"] is None]
        cands = [n for n in writable if self.flags[n]["fresh"]]
        roll = r.random()
        if roll < 0.2 and not self.train:  # on an input: its final value is compared too
            cands = [n for n in writable if n.startswith("x")]
        elif roll < 0.45:  # on a view (of an input or of a computed value): the write reaches its base
            cands = [n for n in writable if n.startswith("v") and not self.flags[n]["fresh"]]
        if not cands:
            return False
        v = self.pick(cands)
        nd = self.env[v].dim()
        d = self.dim(v)
        # Right-hand sides are computed from v before the write and never alias it, so the order
        # of the elements' updates cannot matter (eager refuses or races on overlapping ones).
        ops = ["add_(0.5)", "mul_(1.5)", "clamp_(-0.5, 0.5)", "relu_()", "sigmoid_()", "zero_()",
               "fill_(2.0)", f"sub_({v}.mean())", f"masked_fill_({v} < 0, 0.25)",
               f"div_({v}.abs().amax(-1, keepdim=True) + 1)" if nd else "div_(2.0)"]
        if nd:
            n = self.env[v].shape[d]
            ops += [f"copy_({v}.flip({d}))", f"narrow({d}, {min(1, n)}, {max(0, n - 1) // 2}).mul_(-2.0)",
                    f"select({d}, {r.choice([0, -1])}).fill_(3.0)" if n else "neg_()"]
        op = r.choice(ops)
        fl = dict(self.flags[v], perm=False, fresh=self.flags[v]["fresh"] and not op.startswith(("narrow", "select")))
        return self.try_line(f"{v}.{op}", fl, disc="<" in op) is not None

    def build(self) -> Program:
        """Generate the whole program."""
        r = self.r
        nin = r.choice([1, 1, 2, 2, 3])
        first = self.shape()
        for i in range(nin):
            if i == 0 or r.random() < 0.5:
                shp = first if i == 0 else list(first)
            else:
                shp = first[r.randrange(len(first) + 1):] or []
            name = self.add_input(shp, kind="perm" if r.random() < 0.1 else "float", dyn=bool(shp) and i == 0 or
                                  (bool(shp) and len(shp) == len(first)))
            if i and not self.train:
                self.maybe_alias(name)
        ops = [(self.op_unary, 5), (self.op_binary, 5), (self.op_reduce, 4), (self.op_row, 3),
               (self.op_view, 4), (self.op_cast, 1), (self.op_index, 2), (self.op_matmul, 2),
               (self.op_inplace, 1), (self.op_nn, 2), (self.op_loss, 1), (self.op_more, 3),
               (self.op_int, 3), (self.op_bool, 2)]
        ops = [(o, w * 8 if o.__name__[3:] in self.favour else w) for o, w in ops]
        target, tries = r.randint(2, 8), 0
        while len(self.lines) < target and tries < 60:
            tries += 1
            op = r.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
            before = len(self.specs)
            if not op():
                del self.specs[before:]  # (inputs an op asked for, then dropped)
                for s in [n for n in self.env if n.startswith("x") and int(n[1:]) >= before]:
                    del self.env[s]
        computed = [n for n in self.env if n.startswith("v")] or list(self.env)
        src, outputs = self.source(computed)
        return Program(self.seed, src, self.specs, self.disc, outputs)

    def source(self, computed: list[str], header: str = "") -> tuple[str, int]:
        """``fn``'s source and its number of outputs: the lines, returning the sinks (values no
        later line reads, so that no op is dead code) and sometimes one more of ``computed``."""
        r = self.r
        used = set(re.findall(r"\bv\d+\b", " ".join(ln.split("=", 1)[1] for ln in self.lines)))
        outs = [n for n in computed if n not in used][-4:] or [computed[-1]]
        if len(computed) > len(outs) and r.random() < 0.3:
            outs.insert(0, r.choice([n for n in computed if n not in outs]))
        args = ", ".join(s["name"] for s in self.specs)
        body = "\n".join(f"    {ln}" for ln in self.lines) or "    pass"
        return f"{header}def fn({args}):\n{body}\n    return ({', '.join(outs)},)\n", len(outs)

