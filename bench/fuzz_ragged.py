"""bench/fuzz.py --ragged: random programs over an ``ember.ragged.Ragged``.

Each program takes one Ragged (values (T, F) or (T,), int32 or int64 offsets of random lengths:
empty rows, sometimes all of them, B = 1, rows of up to a few hundred), sometimes a second one
with the same lengths, a dense partner (B, N, F) with N >= the longest row, per-row tensors
(B, F) and a weight (F, K), and chains pointwise ops on the packed values, gathers
``partner[r.row_ids(), r.positions()]``, per-row values spread back to the tokens
``rows[r.row_ids()]``, ``ragged.segment_sum/mean/max``, ``ragged.jagged_softmax``, Raggeds
rebuilt from the input's offsets, ``to_padded``, ``index_add`` by row ids and reductions. Every
candidate line is run eagerly on the real inputs and dropped if it raises or grows past the
element budget.

--dynamic calls the compiled function three more times: twice with other lengths (and T) at the
same B, then at another B. The README promises no recompile for the first two, except once
where the program reads the host-side ``max_length`` (``to_padded``, ``Ragged(.., r.max_length,
..)``); at a new B, once more for a dense partner or per-row tensor unless compiled with
``dynamic=True``. Sizes 0 and 1 are specialized by Dynamo: no promise where T, B or the
longest row is 0 or 1. A compile past the promise is a ``recompile`` finding.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F  # noqa: N812
from fuzz_programs import DTYPES, Generator, Program

from ember import ragged
from ember.ragged import Ragged

HEADER = "from ember import ragged\nfrom ember.ragged import Ragged\n\n\n"
VARIANTS = [None, 1, 2, 3]  # --dynamic: the calls' batches (1, 2: same B as the first; 3: another B)


# ---------------------------------------------------------------- inputs (copied into reproducers)

def make_inputs(specs: list[dict], device: str, train: bool = False, variant: int | None = None) -> list:
    """Build the program's inputs from their specs (each seeded) for batch ``variant`` (None: the
    first; --dynamic calls the others). Partners and per-row tensors take B from their Ragged."""
    out, batch = [], {}
    for s in specs:
        v = variant or 0
        g = torch.Generator().manual_seed(s["seed"] + 7919 * v)
        dtype = getattr(torch, s["dtype"])
        if s["kind"] == "ragged":
            lengths = s["lengths"][v]
            batch[s["name"]] = len(lengths)
            total, feat = sum(lengths), list(s["feat"])
            alloc = [total, *feat]
            if s["layout"] == "t" and feat:
                alloc = [feat[0], total]
            elif s["layout"] == "slice":
                alloc = [total, 2 * feat[0]] if feat else [2 * total]
            elif s["layout"] == "offset":
                alloc = [total + 1, *feat]
            base = torch.randn(alloc, generator=g) * s["scale"]
            if s["special"] and base.numel():
                flat = base.view(-1)
                picks = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=g)
                flat[picks] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])[
                    torch.randint(0, 4, picks.shape, generator=g)]
            base = base.to(dtype).to(device)
            if s["layout"] == "t" and feat:
                base = base.t()
            elif s["layout"] == "slice":
                base = base[..., ::2]
            elif s["layout"] == "offset":
                base = base[1:]
            if train:
                base = base.detach().requires_grad_(True)
            odt = getattr(torch, s["offsets_dtype"])
            offsets = torch.zeros(len(lengths) + 2, dtype=odt)
            offsets[2:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0).to(odt)
            offsets = offsets.to(device)[1:] if s["offsets_view"] else offsets[1:].clone().to(device)
            out.append(Ragged(base, offsets, max(lengths, default=0) + s["slack"]))
            continue
        shape = list(s["shape"])
        if s["kind"] in ("partner", "rows"):
            shape = [batch[s["of"]], *shape]
        t = (torch.randn(shape, generator=g) * s["scale"]).to(dtype).to(device)
        out.append(t.requires_grad_(True) if train else t)
    return out


def widen(xs: list) -> list:
    """The inputs as float64 (the reference run), each Ragged rebuilt around its float64 values."""
    out = []
    for x in xs:
        t = x.values if isinstance(x, Ragged) else x
        if t.is_floating_point():
            t = t.detach().double().requires_grad_(t.requires_grad)
        out.append(Ragged(t, x.offsets, x.max_length) if isinstance(x, Ragged) else t)
    return out


def run_program(fn, inputs: list, upstream_seed: int | None) -> dict:
    """Run fn on inputs: outputs (a Ragged's values), the inputs' final tensors (a Ragged's values
    and offsets) and, when upstream_seed is not None, the gradients of every input tensor that
    requires grad for a seeded random upstream gradient."""
    outs = fn(*inputs)
    outs = [o.values if isinstance(o, Ragged) else o for o in (outs if isinstance(outs, tuple) else (outs,))]
    flat = [t for i in inputs for t in ((i.values, i.offsets) if isinstance(i, Ragged) else (i,))]
    grads = None
    if upstream_seed is not None:
        g = torch.Generator().manual_seed(upstream_seed)
        loss = None
        for o in outs:
            if isinstance(o, torch.Tensor) and o.requires_grad:
                up = torch.randn(o.shape, generator=g).to(o.device, torch.float64)
                term = (o.to(torch.float64) * up).sum()
                loss = term if loss is None else loss + term
        leaves = [t for t in flat if t.requires_grad]
        if loss is not None and leaves:
            gs = torch.autograd.grad(loss, leaves, allow_unused=True)
            grads = [None if x is None else x.detach().clone() for x in gs]
    return {"outs": [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs],
            "inputs": [t.detach().clone() for t in flat], "grads": grads}


# ---------------------------------------------------------------- programs

class RaggedProgram(Program):
    """A ragged program: fuzz.py runs it through these functions instead of the dense ones."""

    make_inputs = staticmethod(make_inputs)
    run_program = staticmethod(run_program)
    widen = staticmethod(widen)

    def __init__(self, seed: int, source: str, specs: list[dict], disc: bool, outputs: int,
                 compile_dynamic: bool | None) -> None:
        super().__init__(seed, source, specs, disc, outputs)
        self.compile_dynamic = compile_dynamic

    def leads(self, dynamic: bool) -> list[int | None]:
        return VARIANTS if dynamic else [None]

    def allowed_compiles(self, variant: int | None, seen: dict) -> int | None:
        """How many compiles after the first call the README allows up to call ``variant``, given
        ``seen``, the frames compiled by each call so far; None where it promises nothing. With
        graph breaks (the first call compiled several frames: a Ragged built without max_length
        and then read, a host sync) the frames after the break are Dynamo's own, and each may
        recompile once (automatic dynamic): then only the third call must compile nothing new."""
        if variant is None or None not in seen:
            return None
        strict = self._promised(variant)
        after = {v: n - seen[None] for v, n in seen.items()}
        if strict is None:
            return None
        if seen[None] > 1:
            return after[1] if variant == 2 and 1 in after else None
        return min(strict, after[1]) if variant == 2 and 1 in after else strict

    def _promised(self, variant: int) -> int | None:
        """The README's promise without graph breaks (None for a size 0 or 1: Dynamo specializes)."""
        rag = [s for s in self.specs if s["kind"] == "ragged"]
        reads_length = bool(re.search(r"max_length|to_padded|jagged_softmax", self.source))
        for s in rag:
            for lengths in s["lengths"][:variant + 1]:
                if sum(lengths) < 2 or len(lengths) < 2 and variant == 3 or (
                        reads_length and max(lengths) + s["slack"] < 2):
                    return None
        # Dynamo's duck sizing: symbolic sizes equal in the first call share a symbol, and a later
        # call where they differ recompiles (T and B + 1; with dynamic=True every size, e.g. B and F)
        # (and the sizes and strides of the buffers the inputs are views of: a sliced (T, F) is a
        # (T, 2F) buffer's, and T = 2F shared a symbol too)
        lengths = rag[0]["lengths"][0]
        total, b = sum(lengths), len(lengths)
        mine = [total, b + 1] + [b] * (self.compile_dynamic is True)
        others = [d for s in self.specs for d in s.get("feat", s.get("shape", []))] if self.compile_dynamic else []
        for s in rag:
            mine += [total + 1] * (s["layout"] == "offset") + [2 * total] * (s["layout"] == "slice" and not s["feat"])
            mine += [b + 2] * bool(s["offsets_view"])
            if s["layout"] == "slice" and self.compile_dynamic:  # (strides too: B = 2 met the step)
                others += [2] + ([2 * s["feat"][0]] if s["feat"] else [])
        if len(set(mine)) < len(mine) or set(mine) & set(others):
            return None
        allowed = int(reads_length)
        if variant == 3 and self.compile_dynamic is not True and any(
                s["kind"] in ("partner", "rows") for s in self.specs):
            allowed += 1
        sizes = {len(rag[0]["lengths"][0]), len(rag[0]["lengths"][-1])}
        if variant == 3 and self.compile_dynamic is True and any(
                s["kind"] in ("partner", "rows") and (sizes | set(s["shape"])) & {0, 1} for s in self.specs):
            return None  # (a dense input's size 0 or 1 is specialized)
        return allowed

    def describe(self, variant: int) -> str:
        s = next(s for s in self.specs if s["kind"] == "ragged")
        a, b = s["lengths"][0], s["lengths"][variant]
        return f"B {len(a)}->{len(b)}, T {sum(a)}->{sum(b)}, longest {max(a)}->{max(b)}"


class RaggedGenerator(Generator):
    """Builds one random ragged program (see the module's docstring)."""

    SEGMENTS = ["segment_sum", "segment_mean", "segment_max"]

    def __init__(self, seed: int, device: str, backend: str, dtypes: list[str], train: bool,
                 dynamic: bool) -> None:
        super().__init__(seed, device, backend, dtypes, train, dynamic)
        self.small = backend == "triton" and device == "cpu"
        self.budget = 20_000 if self.small else 300_000
        self.kind: dict[str, str] = {}  # name -> tok (T rows), row (B rows), pad (B, N, ..), feat, scalar
        self.width: dict[str, str] = {}  # a pad's dim 1: "N" (the partner's) or "ml" (to_padded's max_length)

    # -- inputs
    def lengths(self, batch: int) -> list[int]:
        r, (mid, longest) = self.r, (12, 24) if self.small else (40, 300)
        if r.random() < 0.06:
            return [0] * batch
        mix = [(0, 0), (1, 4), (5, mid), (mid + 1, longest)][:4 if batch <= 8 else 3]
        weights = [2, 3, 3, 1][:len(mix)]
        return [r.randint(*r.choices(mix, weights=weights)[0]) for _ in range(batch)]

    def dtype(self) -> str:
        return str(DTYPES[self.r.choice(self.dtypes)]).replace("torch.", "")

    def add_spec(self, kind: str, **spec: object) -> str:
        name = f"x{len(self.specs)}" if kind != "ragged" else f"r{len(self.specs)}"
        spec = {"name": name, "kind": kind, "seed": self.r.randrange(2**31), "dtype": self.dtype(),
                "scale": self.r.choice([1.0, 1.0, 3.0]), **spec}
        self.specs.append(spec)
        return name

    def make_batches(self, slack: int) -> tuple[list[list[int]], list[int] | None, int]:
        r = self.r
        while True:
            batch = r.choice([1, 1, 2, 3, 5, 8, 16] + ([] if self.small else [33]))
            runs = [self.lengths(batch)]
            for _ in range(40):  # (other lengths, T and longest row than the earlier calls': each recompiles)
                if len(runs) == 3:
                    break
                new = self.lengths(batch)
                if all(sum(new) != sum(x) and max(new) != max(x) for x in runs):
                    runs.append(new)
            runs += [self.lengths(batch) for _ in range(3 - len(runs))]
            runs.append(self.lengths(r.choice([b for b in (1, 2, 4, 7, 12) if b != batch])))
            feat = r.choice([None, None, 1, 3, 4, 17] + ([] if self.small else [128, 8]))
            f = feat or 1
            width = max(max(x, default=0) for x in runs) + slack + r.choice([0, 0, 1, 5])
            big = max(len(x) for x in runs) * max(width, 1) * f
            if max(sum(x) for x in runs) * f <= self.budget // 4 and big <= self.budget // 2:
                return runs if self.dynamic else runs[:1], None if feat is None else [feat], width

    # -- emission
    def try_line(self, expr: str, flags: dict | None = None, disc: bool = False, names: int = 1,
                 kind: str = "tok", width: str = "") -> str | None:
        """Emit ``v = expr`` if it runs eagerly on the inputs within budget; returns the new name."""
        name = f"v{self.count}"
        scope = dict(self.env)
        try:
            with torch.no_grad():
                exec(f"{name} = {expr}", {"torch": torch, "F": F, "ragged": ragged, "Ragged": Ragged}, scope)
        except Exception:  # noqa: BLE001 -- an invalid combination: try another op
            return None
        v = scope[name]
        if not isinstance(v, torch.Tensor) or v.numel() > self.budget:
            return None
        lead = {"tok": self.total, "row": self.batch, "pad": self.batch}.get(kind)
        if lead is not None and (v.dim() == 0 or v.shape[0] != lead) or kind == "pad" and v.dim() < 2 or (
                kind == "feat" and v.dim() > 1):
            return None
        self.count += 1
        self.lines.append(f"{name} = {expr}")
        self.env[name], self.kind[name] = v, kind
        self.width[name] = width or next((self.width[n] for n in re.findall(r"\b[vx]\d+\b", expr)
                                          if n in self.width), "")
        self.flags[name] = {"perm": False, "input": None, "fresh": True}
        self.disc |= disc
        return name

    def of(self, *kinds: str, floats: bool = True) -> list[str]:
        return [n for n, k in self.kind.items() if k in kinds and (not floats or self.env[n].is_floating_point())]

    def wrap(self, tok: str) -> str:
        """A Ragged of per-token values ``tok`` with the input's offsets."""
        r, ml = self.rag, self.r.choice([f", {self.rag}.max_length"] * 4 + [""])
        if tok == f"{r}.values":
            return r
        return f"Ragged({tok}, {r}.offsets{ml}, validate=False)"

    def feature_dims(self, x: str) -> str:
        return "[:, None]" * (self.env[x].dim() - 1)

    # -- ops, each returns True when it emitted something
    def op_unary(self) -> bool:
        x = self.pick(self.of("tok", "row", "pad", "feat"))
        if self.r.random() < 0.1:
            return self.try_line(self.r.choice(self.DISC_UNARY).format(x=x), disc=True, kind=self.kind[x]) is not None
        return self.try_line(self.r.choice(self.UNARY).format(x=x), kind=self.kind[x]) is not None

    def compatible(self, a: str, b: str) -> bool:
        """Do a and b broadcast in every batch (never a batch dim against a feature dim)?"""
        ka, kb, ta, tb = self.kind[a], self.kind[b], self.env[a], self.env[b]
        if kb == "scalar" or tb.dim() == 0:
            return True
        if kb == "feat":
            return tb.dim() <= ta.dim() - {"feat": 0, "tok": 1, "row": 1, "pad": 2}[ka]
        return ka == kb and ta.dim() == tb.dim() and self.width.get(a) == self.width.get(b)

    def op_binary(self) -> bool:
        a = self.pick(self.of("tok", "row", "pad", "feat"))
        k = self.kind[a]
        others = [n for n in self.of(k, "feat", "scalar") if n != a and self.compatible(a, n)]
        others += [a + ".flip(0)"] if k != "tok" else []
        if k == "pad":
            others += [f"{n}.unsqueeze(1)" for n in self.of("row") if self.env[n].dim() == self.env[a].dim() - 1]
        if not others:
            return False
        b = self.r.choice(others)
        if self.r.random() < 0.1:
            return self.try_line(self.r.choice(self.DISC_BINARY).format(a=a, b=b), disc=True, kind=k) is not None
        return self.try_line(self.r.choice(self.BINARY).format(a=a, b=b), kind=k) is not None

    def op_gather(self) -> bool:
        cands = self.of("pad")
        if not cands:
            return False
        p = self.pick(cands)
        return self.try_line(f"{p}[{self.rag}.row_ids(), {self.rag}.positions()]") is not None

    def op_spread(self) -> bool:
        cands = self.of("row")
        if not cands:
            return False
        x = self.pick(cands)
        if self.r.random() < 0.3:
            return self.try_line(f"{x}.index_select(0, {self.rag}.row_ids())") is not None
        return self.try_line(f"{x}[{self.rag}.row_ids()]") is not None

    def op_segment(self) -> bool:
        x = self.pick(self.of("tok"))
        seg = self.r.choice(self.SEGMENTS)
        return self.try_line(f"ragged.{seg}({self.wrap(x)})", kind="row") is not None

    def op_index_add(self) -> bool:
        x = self.pick(self.of("tok"))
        rows = [n for n in self.of("row") if self.env[n].shape[1:] == self.env[x].shape[1:]]
        base = self.r.choice(rows) if rows and self.r.random() < 0.5 else (
            f"{x}.new_zeros(({self.rag}.offsets.shape[0] - 1, *{x}.shape[1:]))")
        return self.try_line(f"{base}.index_add(0, {self.rag}.row_ids(), {x})", kind="row") is not None

    def op_softmax(self) -> bool:
        x = self.pick(self.of("tok"))
        return self.try_line(f"ragged.jagged_softmax({self.wrap(x)}).values") is not None

    def op_pad(self) -> bool:
        x = self.pick(self.of("tok"))
        value = self.r.choice(["", "", "-1.5", "float('-inf')"])
        partners = [n for n in self.of("pad") if n.startswith("x")]
        if partners and self.r.random() < 0.3:
            value = f"{value or 0}, max_length={partners[0]}.shape[1]"
        return self.try_line(f"{self.wrap(x)}.to_padded({value})", kind="pad",
                             width="N" if "max_length=" in value else "ml") is not None

    def op_position(self) -> bool:
        r, rag = self.r, self.rag
        if r.random() < 0.3:
            if r.random() < 0.5:
                return self.try_line(f"{rag}.positions().to(torch.float32) * 0.1") is not None
            return self.try_line(f"{rag}.lengths().to(torch.float32)", kind="row") is not None
        x = self.pick(self.of("tok"))
        cond = r.choice([f"{rag}.positions() < 3", f"{rag}.positions() % 2 == 0", f"{rag}.positions() > 0"])
        if r.random() < 0.5:
            return self.try_line(f"{x}.masked_fill(({cond}){self.feature_dims(x)}, 0.25)") is not None
        return self.try_line(f"{x} / ({rag}.lengths().clamp(min=1)[{rag}.row_ids()]{self.feature_dims(x)})") \
            is not None

    def op_reduce(self) -> bool:
        x = self.pick(self.of("tok", "row", "pad"))
        r, k, t = self.r, self.kind[x], self.env[x]
        choices = [(f"{x}.sum()", "scalar"), (f"{x}.mean()", "scalar"), (f"{x}.sum(0)", "feat"),
                   (f"{x}.amax(0)", "feat"), (f"torch.logsumexp({x}, 0)", "feat")]
        if t.dim() >= 2:
            choices += [(f"{x}.sum(-1)", k), (f"{x}.amax(-1)", k), (f"torch.softmax({x}, -1)", k),
                        (f"F.normalize({x}, dim=-1)", k)]
            if t.shape[-1] > 1:  # (over one feature it is 0 up to rounding: noise a normalize makes +-1)
                choices.append((f"F.layer_norm({x}, ({t.shape[-1]},))", k))
        if k == "pad":  # (over dim 0, N or max_length rows remain: nothing else lines up with them)
            choices = [(f"{x}.sum(1)", "row"), (f"{x}.amax(1)", "row"), (f"torch.softmax({x}, 1)", "pad"),
                       (f"{x}.mean(1)", "row")] + [(e, "other" if kd == "feat" else kd) for e, kd in choices]
        if k == "tok":
            choices += [(f"torch.cumsum({x}, 0)", "tok")]
        expr, kind = r.choice(choices)
        return self.try_line(expr, kind=kind) is not None

    def op_loss(self) -> bool:
        x = self.pick(self.of("tok", "row"))
        others = [n for n in self.of(self.kind[x]) if n != x and self.env[n].shape == self.env[x].shape]
        if not others:
            return False
        y = self.r.choice(others)
        return self.try_line(self.r.choice([f"F.mse_loss({x}, {y})", f"F.smooth_l1_loss({x}, {y})",
                                            f"(({x} - {y}) ** 2).sum(-1).mean()"]), kind="scalar") is not None

    def op_cast(self) -> bool:
        x = self.pick(self.of("tok", "row", "pad", "feat"))
        half = ["float16"] + (["bfloat16"] if "bf16" in self.dtypes else [])
        expr = self.r.choice([f"{x}.to(torch.{self.r.choice(half)}).to({x}.dtype)", f"{x}.to(torch.float32)",
                              f"{x}.to(torch.{self.r.choice(half)})"])
        return self.try_line(expr, kind=self.kind[x]) is not None

    def op_matmul(self) -> bool:
        x = self.pick([n for n in self.of("tok", "row") if self.env[n].dim() == 2])
        if not x:
            return False
        w = self.add_spec("weight", shape=[self.env[x].shape[1], self.r.choice([1, 3, 16, 33])],
                          dtype=str(self.env[x].dtype).replace("torch.", ""))
        self.env[w] = make_inputs([self.specs[-1]], "cpu")[0]
        return self.try_line(f"{x} @ {w}", kind=self.kind[x]) is not None

    def pick(self, names: list[str]) -> str:
        return super().pick(names) if names else ""

    def build(self) -> RaggedProgram:
        """Generate the whole program."""
        r = self.r
        slack = r.choice([0, 0, 0, 2])  # (max_length past the longest row)
        runs, feat, width = self.make_batches(slack)
        self.rag = self.add_spec("ragged", lengths=runs, feat=feat or [], offsets_dtype=r.choice(["int32", "int64"]),
                                 offsets_view=r.random() < 0.2, slack=slack,
                                 layout=r.choice(["contig"] * 4 + ["t", "slice", "offset"]),
                                 special=r.random() < 0.08)
        inputs = make_inputs(self.specs, "cpu")
        self.env[self.rag] = inputs[0]
        self.total, self.batch, self.kind[f"{self.rag}.values"] = sum(runs[0]), len(runs[0]), "tok"
        self.env[f"{self.rag}.values"] = inputs[0].values
        fshape = feat or []
        if r.random() < 0.2:  # a second Ragged of the same lengths (per-token targets)
            name = self.add_spec("ragged", lengths=runs, feat=r.choice([fshape, fshape, []]),
                                 offsets_dtype=self.specs[0]["offsets_dtype"], offsets_view=False, slack=0,
                                 layout="contig", special=False)
            self.env[f"{name}.values"], self.kind[f"{name}.values"] = make_inputs(self.specs, "cpu")[-1].values, "tok"
        if r.random() < 0.5:
            name = self.add_spec("partner", of=self.rag, shape=[width, *fshape])
            self.env[name], self.kind[name], self.width[name] = make_inputs(self.specs, "cpu")[-1], "pad", "N"
        if r.random() < 0.4:
            name = self.add_spec("rows", of=self.rag, shape=r.choice([fshape, fshape, []]))
            self.env[name], self.kind[name] = make_inputs(self.specs, "cpu")[-1], "row"
        ops = [(self.op_unary, 4), (self.op_binary, 4), (self.op_gather, 3), (self.op_spread, 3),
               (self.op_segment, 4), (self.op_index_add, 1), (self.op_softmax, 2), (self.op_pad, 2),
               (self.op_position, 2), (self.op_reduce, 3), (self.op_loss, 1), (self.op_cast, 1),
               (self.op_matmul, 1)]
        ops = [(o, w * 8 if o.__name__[3:] in self.favour else w) for o, w in ops]
        target, tries = r.randint(2, 8), 0
        while len(self.lines) < target and tries < 80:
            tries += 1
            op = r.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
            before = len(self.specs)
            try:
                done = op()
            except (IndexError, ValueError, KeyError):  # (nothing of the kind to pick yet)
                done = False
            if not done:
                del self.specs[before:]
        computed = [n for n in self.env if n.startswith("v")] or [f"{self.rag}.values"]
        src, outputs = self.source(computed, HEADER)
        dyn = r.choice([None, True]) if self.dynamic else None
        return RaggedProgram(self.seed, src, self.specs, self.disc, outputs, dyn)


# ---------------------------------------------------------------- reproducers

REPRO = '''"""ember fuzz reproducer (--ragged): {kind}: {msg}"""
import os
{env}import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
import ember
from ember.ragged import Ragged

DEVICE = {device!r}
OPTIONS = {options!r}
SPECS = {specs!r}
TRAIN = {train!r}
VARIANTS = {variants!r}  # the calls' batches (--dynamic: other lengths at the same B, then another B)
torch._dynamo.config.recompile_limit = 1000


{make_inputs}

{widen}

{run_program}

{source}
compiled = ember.compile(fn, options=OPTIONS, dynamic={dynamic!r})
up = {up!r}
for v in VARIANTS:
    eager = run_program(fn, make_inputs(SPECS, DEVICE, TRAIN, v), up)
    got = run_program(compiled, make_inputs(SPECS, DEVICE, TRAIN, v), up)
    ref = run_program(fn, widen(make_inputs(SPECS, DEVICE, TRAIN, v)), up)
    print("batch", v, make_inputs(SPECS, "cpu", False, v)[0], "frames compiled so far:", counters["frames"]["ok"])
    for part in ("outs", "inputs", "grads"):
        for i, (e, g, r) in enumerate(zip(got[part] or [], eager[part] or [], ref[part] or [])):
            if e is None or g is None:
                continue
            print(part, i, "ember", e.dtype, tuple(e.shape), "eager", g.dtype, tuple(g.shape))
            if e.shape == g.shape:
                d = (e.double() - g.double()).abs()
                print("   max |ember-eager|", d.nan_to_num(float("inf")).max().item() if d.numel() else 0,
                      " max |eager-f64|", (g.double() - r.double()).abs().max().item() if g.numel() else 0,
                      " max |ember-f64|", (e.double() - r.double()).abs().max().item() if e.numel() else 0)
                print("   eager", g.flatten()[:8].tolist(), "\\n   ember", e.flatten()[:8].tolist())
'''


def repro_source(prog: RaggedProgram, args: object, options: dict, kind: str, msg: str, env: str) -> str:
    """A self-contained script that rebuilds the program's inputs and prints eager vs ember."""
    import inspect
    return REPRO.format(kind=kind, msg=msg.replace('"""', "'''").replace("\\", "/")[:500], env=env,
                        device=args.device, options=options, specs=prog.specs, train=args.train,
                        variants=prog.leads(args.dynamic), make_inputs=inspect.getsource(make_inputs),
                        widen=inspect.getsource(widen), run_program=inspect.getsource(run_program),
                        source=prog.source.replace(HEADER, "from ember import ragged\n\n\n"),
                        dynamic=prog.compile_dynamic, up=prog.seed + 1 if args.train else None)
