"""CUDA C++: a pointwise kernel's lanes (codegen/triton_lanes.py) that are one computation over
different tensors run one body. A foreach step's lanes are its parameters: GPT-2's Adam step has
a kernel of 12 lanes (a layer's weight each) and one of 74 (its LayerNorms' weights and biases),
every lane the same statements over its own buffers. Rendered a copy a lane, that code was 12
and 74 times the size: nvcc took seconds for each kernel, and on an H200 the 12-lane kernel's
warps waited on instruction fetches a third of the time (Nsight Compute), 218 us against
Triton's 187 for the same bytes. Here each lane picks its buffers in a switch, and one body
runs over them: 196 us, and nvcc 3.8 s on the step's kernels, not 28.3. (The picked pointers
take registers, 46 a thread rather than 32: capping them at 32 spills.) Lanes that differ in
any statement (or in a buffer's type) keep a copy each. Functions of the kernel's renderer
(codegen/cuda.py), as cuda_groups.py's.
"""

from __future__ import annotations

import re
from typing import Any

# a value's name in a rendered body (v12, v12_vec, v12_e): the number differs between lanes
_VALUE = re.compile(r"v\d+")
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def _pointer(i: int) -> str:
    return f"ember_lane_p{i}"


def _form(lines: list[str], params: set[str]) -> tuple[str, list[str]]:
    """A lane's code (its comments left out) with its buffers and values renamed in order of first
    use, and its buffers in that order."""
    buffers: dict[str, int] = {}
    values: dict[str, int] = {}

    def rename(m: re.Match[str]) -> str:
        name = m.group(0)
        if name in params:
            return f"P{buffers.setdefault(name, len(buffers))}"
        head = _VALUE.match(name)
        if head:
            return f"V{values.setdefault(head.group(0), len(values))}{name[head.end():]}"
        return name

    code = "\n".join(line.split("//")[0] for line in lines)  # (a comment may list buffers sorted by name)
    return _IDENT.sub(rename, code), list(buffers)


def shared_buffers(r: Any, bodies: list[list[str]]) -> list[list[str]] | None:
    """Each lane's buffers in the order its body uses them, where every body is the first but for
    its buffers' and values' names and each buffer has the type of the first lane's at its place;
    else None."""
    params = {p.name: p for p in r.k.params}
    forms = [_form(lines, set(params)) for lines in bodies]
    text, first = forms[0]
    for other, buffers in forms[1:]:
        if other != text or len(buffers) != len(first):
            return None
        for a, b in zip(first, buffers):
            if (params[a].dtype, params[a].is_output) != (params[b].dtype, params[b].is_output):
                return None
    return [buffers for _, buffers in forms]


def render_lanes(r: Any, bodies: list[list[str]], lane: str, storage: dict[Any, str]) -> None:
    """The lanes' bodies (rendered two levels deeper than here, as in a switch's cases): one body
    over pointers each lane picks where their forms are the same, else a case a lane."""
    shared = shared_buffers(r, bodies) if len(bodies) > 1 else None
    if shared is None:
        r.open(f"switch ({lane}) {{")
        for i, lines in enumerate(bodies):
            r.open(f"case {i}: {{")
            r.lines += lines
            r.emit("break;")
            r.close()
        r.close()
        return
    params = {p.name: p for p in r.k.params}
    r.emit(f"// the lanes are one computation over their own tensors (codegen/cuda_lanes.py): lane {lane}")
    r.emit("// picks its tensors, then runs the one body")
    for i, name in enumerate(shared[0]):
        p = params[name]
        r.emit(f"{'' if p.is_output else 'const '}{storage[p.dtype]}* __restrict__ {_pointer(i)};")
    r.open(f"switch ({lane}) {{")
    for i, buffers in enumerate(shared):
        r.emit(f"case {i}: " + " ".join(f"{_pointer(k)} = {name};" for k, name in enumerate(buffers)) + " break;")
    r.emit("default: return;")
    r.close()
    rename = {name: _pointer(k) for k, name in enumerate(shared[0])}
    for line in bodies[0]:
        line = line[4:] if line.startswith("    ") else line.lstrip()  # (two levels out)
        r.lines.append(_IDENT.sub(lambda m: rename.get(m.group(0), m.group(0)), line))
