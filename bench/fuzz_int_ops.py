"""bench/fuzz_programs.py's integer and boolean op families (``--favour int,bool``): a mixin of
its Generator, kept apart so that each file reads in one sitting."""

from __future__ import annotations

import torch


def broadcasts(a: torch.Size, b: torch.Size) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


class IntegerOps:
    """``op_int`` and ``op_bool`` for fuzz_programs.Generator (which supplies r, env, flags,
    add_input, try_line, pick, dim, floats and shape)."""

    INT_DTYPES = ["int32", "int64", "int16", "int8", "uint8"]
    # (divisors and shift counts through `& 7` and `& 3`: never 0, never -1, never past the width)
    INT_BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.div({a}, ({b} & 7) + 1, rounding_mode='floor')",
                  "torch.div({a}, ({b} & 7) + 1, rounding_mode='trunc')", "{a} // (({b} & 7) + 1)",
                  "{a} % (({b} & 7) + 1)", "torch.fmod({a}, ({b} & 7) + 1)", "torch.remainder({a}, -(({b} & 7) + 1))",
                  "{a} & {b}", "{a} | {b}", "{a} ^ {b}", "{a} << ({b} & 3)", "{a} >> ({b} & 3)",
                  "torch.maximum({a}, {b})", "torch.minimum({a}, {b})", "torch.where({a} > {b}, {a}, {b})",
                  "{a} / (({b} & 7) + 1)", "({a} == {b})", "({a} < {b}) | ({a} == 0)", "torch.clamp({a}, {b}, {b} + 5)"]
    INT_UNARY = ["-{a}", "{a}.abs()", "~{a}", "torch.sign({a})", "{a}.clamp(-7, 9)", "{a}.clamp_min(0)",
                 "{a} * 3 + 1", "{a} * 0.5", "{a}.to(torch.{dt})", "{a}.to(torch.float32).sqrt()", "{a}.square()",
                 "{a} - {a}.flip(-1)", "{a}.to(torch.{dt}) + {a}", "torch.where({a} > 0, {a}, 1)",
                 "torch.bitwise_and({a}, 0x55)", "{a} // -3", "{a} % 5", "torch.pow({a}, 2)"]
    INT_REDUCE = ["{a}.sum({dims})", "{a}.sum()", "{a}.amax({dims})", "{a}.amin({dims})", "torch.cumsum({a}, {d})",
                  "{a}.argmax({dims})", "{a}.argmin({dims})", "torch.max({a}, {dims}).values", "{a}.prod({dims})",
                  "{a}.float().mean({dims})", "({a} > 0).sum({dims})", "torch.sort({a}, dim={d}).values",
                  "torch.cummax({a}, {d}).indices", "{a}.sum({dims}, dtype=torch.int32)", "({a} != 0).any({dims})"]

    def ints(self) -> list[str]:
        return [n for n, t in self.env.items() if not t.is_floating_point() and t.dtype is not torch.bool]

    def op_int(self) -> bool:
        """Integer arithmetic: wrapping products and differences, floor and truncating division,
        remainders, bit operations and shifts, promotion between integer types, integer
        reductions (int64 sums, argmax's first index among ties), indices computed from integers,
        and conversions to and from floats."""
        r = self.r
        ints = self.ints()
        if not ints or r.random() < 0.25:
            if r.random() < 0.3:  # (of a float32 input: a computed value's ulp would move its truncation)
                x = self.add_input(list(self.shape()), dtype="float32", special=True)
                return self.try_line(f"torch.nan_to_num({x} * 8, 0.0, 0.0, 0.0).clamp(-100, 100)"
                                     f".to(torch.{r.choice(self.INT_DTYPES[:3])})") is not None
            like = self.env[self.pick(self.floats())].shape if self.floats() and r.random() < 0.7 else self.shape()
            ints = [self.add_input(list(like), kind="int", dtype=r.choice(self.INT_DTYPES), wide=r.random() < 0.3)]
        a = self.pick(ints)
        t = self.env[a]
        nd = t.dim()
        kind = r.choice(["binary", "binary", "unary", "unary", "reduce", "index"])
        if kind == "binary":
            compat = [n for n in self.ints() if n != a and broadcasts(t.shape, self.env[n].shape)]
            b = self.pick(compat) if compat and r.random() < 0.7 else (
                f"{a}.flip(-1)" if nd and r.random() < 0.5 else str(r.choice([3, -2, 100])))
            return self.try_line(r.choice(self.INT_BINARY).format(a=a, b=b)) is not None
        if kind == "unary":
            return self.try_line(r.choice(self.INT_UNARY).format(a=a, dt=r.choice(self.INT_DTYPES))) is not None
        d = self.dim(a)
        if kind == "reduce":
            dims = f"dim={d}, keepdim={r.choice([True, False])}"
            return self.try_line(r.choice(self.INT_REDUCE).format(a=a, d=d, dims=dims)) is not None
        x = self.pick(self.floats()) if self.floats() else None
        if x is None or self.env[x].dim() == 0 or self.env[x].shape[0] == 0:
            return False
        n, xd = self.env[x].shape[0], self.dim(x)
        m = self.env[x].shape[xd]
        if m == 0:
            return False
        choices = [f"{x}.index_select({xd}, {a}.reshape(-1).long() % {m})", f"{x}[{a}.long() % {n}]",
                   f"F.embedding({a}.long() % {n}, {x}.reshape({n}, -1))"]
        return self.try_line(r.choice(choices)) is not None

    BOOL_BINARY = ["{a} & {b}", "{a} | {b}", "{a} ^ {b}", "torch.logical_and({a}, {b})", "torch.logical_or({a}, {b})",
                   "torch.logical_xor({a}, {b})", "{a} == {b}", "{a} != {b}", "{a} > {b}", "{a} + {b}", "{a} * {b}",
                   "torch.maximum({a}, {b})", "torch.minimum({a}, {b})", "torch.where({a}, {b}, ~{b})",
                   "torch.where({a}, {b}, True)", "{a}.to(torch.int32) - {b}.to(torch.int32)"]
    BOOL_UNARY = ["~{a}", "torch.logical_not({a})", "{a}.flip(-1)", "{a}.to(torch.int8)", "{a}.to(torch.{ft})",
                  "{a}.to(torch.float32) * 2 - 1", "torch.cumsum({a}, {d})", "{a}.long().cumsum({d}) - 1",
                  "{a} == 0", "{a} + 1", "{a} * 3", "torch.where({a}, 2, -1)", "{a}.to(torch.uint8) << 2",
                  "torch.cummax({a}.to(torch.int32), {d}).values", "{a}.all()", "{a}.any()"]
    # (argmax of a bool tensor: eager refuses the dtype; of its uint8 the first set index)
    BOOL_REDUCE = ["{a}.any({dims})", "{a}.all({dims})", "{a}.sum({dims})", "torch.count_nonzero({a}, {d})",
                   "{a}.amax({dims})", "{a}.amin({dims})", "{a}.float().mean({dims})",
                   "{a}.to(torch.uint8).argmax({dims})", "{a}.sum({dims}, dtype=torch.int32)", "{a}.prod({dims})",
                   "{a}.to(torch.int16).sum({dims})"]
    # masks applied to floats ({x}: a float value its shape, {m}: a mask broadcasting against it)
    BOOL_MASKED = ["torch.where({m}, {x}, 0.0)", "torch.where({m}, {x}, {x}.flip(-1))", "{x} * {m}",
                   "{x} * {m}.to({x}.dtype)", "{x}.masked_fill({m}, -1.5)", "{x}.masked_fill(~{m}, 0.0)",
                   "torch.softmax({x}.masked_fill({m}, float('-inf')), {d})",
                   "({x} * {m}).sum({d}) / {m}.sum({d}).clamp_min(1)",
                   "torch.where({m}, {x}, float('-inf')).amax({d})", "torch.where({m}, {x}.abs().log(), 0.0)",
                   "torch.where({m}, {x}.abs().sqrt(), {x})", "{x}.masked_fill({m}, float('nan')).nansum({d})",
                   "torch.gather({x}, {d}, ({m}.long().cumsum({d}) - 1).clamp_min(0))",
                   "torch.where({m} & ({x} > 0), {x}, -{x})", "torch.where({m}, {x}.detach(), {x} * 2)"]
    # masks from floats and integers (near ties under 16-bit rounding: disc). (A NaN's sign is no
    # one's to match: computed NaNs, an instance norm's over an inf, differ in it.)
    BOOL_FROM = ["{x} > 0", "{x} >= {x}.mean()", "{x}.abs() < 0.5", "torch.isfinite({x})", "torch.isnan({x})",
                 "torch.signbit(torch.nan_to_num({x}, 0.0))", "{x}.bool()", "torch.logical_and({x}, {x}.flip(-1))",
                 "{x} == {x}.round()",
                 "torch.isclose({x}, {x}.flip(-1), atol=0.3)", "{x} != 0", "torch.logical_not({x})"]

    def bools(self) -> list[str]:
        return [n for n, t in self.env.items() if t.dtype is torch.bool]

    def op_bool(self) -> bool:
        """Masks: boolean inputs (none, some, all set), comparisons of floats and integers, logic
        between masks, bool arithmetic (promotion to int64, ``+`` as or), reductions over masks
        (counts, any/all, the first set index), and masks applied to floats (where, masked_fill,
        masked softmax and mean, compaction by a cumulative count)."""
        r = self.r
        masks = self.bools()
        if not masks or r.random() < 0.3:
            vals = self.floats() + self.ints()
            if vals and r.random() < 0.6:
                x = self.pick(vals)
                expr = r.choice(self.BOOL_FROM)
                # (a computed value, or a computed threshold: a perm input's mean is one of its values)
                disc = self.env[x].is_floating_point() and (self.flags[x]["input"] is None or "mean" in expr)
                return self.try_line(expr.format(x=x), disc=disc) is not None
            like = self.env[self.pick(self.floats())].shape if self.floats() and r.random() < 0.8 else self.shape()
            if like and r.random() < 0.3:  # (a mask broadcasting along the leading dims)
                like = [1] * (len(like) - 1) + [like[-1]] if r.random() < 0.5 else list(like[:-1]) + [1]
            masks = [self.add_input(list(like), kind="bool", dtype="bool",
                                    density=r.choice([0.0, 0.1, 0.5, 0.9, 1.0]))]
        a = self.pick(masks)
        t = self.env[a]
        nd = t.dim()
        d = self.dim(a)
        kind = r.choice(["binary", "unary", "reduce", "masked", "masked", "masked"])
        if kind == "binary":
            compat = [n for n in self.bools() if n != a and broadcasts(t.shape, self.env[n].shape)]
            b = self.pick(compat) if compat else (f"{a}.flip(-1)" if nd else "True")
            return self.try_line(r.choice(self.BOOL_BINARY).format(a=a, b=b)) is not None
        if kind == "unary":
            ft = r.choice(["float32", "float16", "bfloat16"] if "bf16" in self.dtypes else ["float32", "float16"])
            return self.try_line(r.choice(self.BOOL_UNARY).format(a=a, d=d, ft=ft)) is not None
        if kind == "reduce":
            dims = f"dim={d}, keepdim={r.choice([True, False])}"
            return self.try_line(r.choice(self.BOOL_REDUCE).format(a=a, d=d, dims=dims)) is not None
        xs = [n for n in self.floats() if broadcasts(self.env[n].shape, t.shape)
              and torch.broadcast_shapes(self.env[n].shape, t.shape) == self.env[n].shape]
        x = self.pick(xs) if xs else self.add_input(list(t.shape))
        xd = self.dim(x)
        return self.try_line(r.choice(self.BOOL_MASKED).format(x=x, m=a, d=xd)) is not None
