"""What ember did with a program: the IR after each pass, the kernels, and what ran as ATen."""

from __future__ import annotations

from dataclasses import dataclass, field

from .passes.pipeline import PassRecord


@dataclass
class KernelReport:
    name: str
    backend: str             # 'cpp', later 'cuda' / 'triton'
    source: str
    aten_ops: list[str]      # the ATen ops fused into it
    kernel_ir: str = ""
    built: bool = True       # False: not built, its ops run through ATen (see not_built)
    not_built: str = ""      # why: "failed to build", or rendered for a target this machine lacks


@dataclass
class GraphReport:
    name: str
    kind: str                 # 'inference', 'forward' or 'backward'
    passes: list[PassRecord] = field(default_factory=list)
    kernels: list[KernelReport] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    wrapper: str = ""
    compile_ms: float = 0.0
    error: str | None = None  # set when the whole graph ran through ATen
    target: str = ""          # the backend its kernels were rendered for

    def __str__(self) -> str:
        head = f"== graph {self.name} ({self.kind}), compiled in {self.compile_ms:.0f} ms"
        lines = [head]
        if self.error:
            lines.append(f"   not compiled, runs through ATen: {self.error}")
        for p in self.passes:
            lines.append(f"-- after {p.name} ({p.nodes} nodes, {p.ms:.2f} ms)")
            lines.append(p.ir)
        for k in self.kernels:
            state = "" if k.built else f"  [{k.not_built or 'failed to build'}: runs through ATen]"
            lines.append(f"-- kernel {k.name} [{k.backend}] fuses {', '.join(k.aten_ops)}{state}")
            lines.append(k.source)
        lines.append("-- ATen calls: " + (", ".join(self.fallbacks) or "none"))
        if self.wrapper:
            lines.append("-- host program")
            lines.append(self.wrapper)
        return "\n".join(lines)


@dataclass
class Report:
    graphs: list[GraphReport] = field(default_factory=list)

    @property
    def kernels(self) -> list[KernelReport]:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def fallbacks(self) -> list[str]:
        return [f for g in self.graphs for f in g.fallbacks]

    @property
    def passes(self) -> list[str]:
        """The IR after each pass, in order (every graph's pipeline, one after another)."""
        return [f"# {g.name}: {p.name}\n{p.ir}" for g in self.graphs for p in g.passes]

    def summary(self) -> str:
        lines = []
        for g in self.graphs:
            ops = sum(len(k.aten_ops) for k in g.kernels)
            lines.append(f"{g.name} ({g.kind}): {len(g.kernels)} kernel(s) fusing {ops} op(s), "
                         f"{len(g.fallbacks)} ATen call(s), {g.compile_ms:.0f} ms"
                         + (f" -- not compiled: {g.error}" if g.error else ""))
            for k in g.kernels:
                lines.append(f"  {k.name} [{k.backend}]: {', '.join(k.aten_ops)}")
            if g.fallbacks:
                lines.append(f"  ATen: {', '.join(g.fallbacks)}")
        return "\n".join(lines) if lines else "(nothing was compiled)"

    def __str__(self) -> str:
        return "\n\n".join(str(g) for g in self.graphs) if self.graphs else "(nothing was compiled)"
