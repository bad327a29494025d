"""A ptxas bug worked around: packed 16-bit adds in a Triton kernel's PTX, assembled again as
two 16-bit adds each.

Where LLVM knows a kernel's index arithmetic stays small (the whole blocks of a tensor of under
32768 elements, an arange of a few hundred), it narrows that arithmetic to 16 bits and pairs it
into packed instructions (``add.s16x2``). ptxas 12.8, 12.9 and 13.0 (sm_90) fold a constant
operand into such an add and, where two of them share it, drop it from the second:
``VIADD.16x2 R4, R4, 0x0`` for ``+ 0x10001`` (triton-lang/triton#11581). On an H200, Triton
3.6: ``(x + w).narrow(-1, 1, 15).contiguous()`` of a 127 x 7 x 17 ``x`` read, in half its
positions, the element before the one it should (the ``+ 1`` of the narrow's offset lost).

The PTX Triton made is kept, so the fix is exactly the instructions it names: each packed add
or subtract becomes its two halves, unpacked and packed again by moves, which ptxas leaves as
16-bit adds. Only kernels whose PTX holds such instructions are assembled again (with the
ptxas and flags Triton used); their cubins are kept in the cache directory by the PTX's hash.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from . import cache_dirs

# (a predicate guard, packed add/sub, destination, two operands)
_PACKED = re.compile(r"^(?P<indent>[ \t]*)(?P<guard>@!?%p\d+[ \t]+)?(?P<op>add|sub)\.(?P<sign>[su])16x2[ \t]+"
                     r"(?P<d>%r\d+),[ \t]*(?P<a>%r\d+),[ \t]*(?P<b>%r\d+);", re.M)
_lock = threading.Lock()


def split_packed_adds(ptx: str) -> tuple[str, int]:
    """``ptx`` with each packed 16-bit add or subtract written as its two halves; and how many."""
    def halves(m: re.Match[str]) -> str:
        i, guard, op, s = m["indent"], m["guard"] or "", m["op"], m["sign"]
        return (f"{i}{{ .reg .b16 %ember_a<2>, %ember_b<2>;  // {op}.{s}16x2, split (ptxas: ember/runtime/"
                "ptxas_packed_adds.py)\n"
                f"{i}mov.b32 {{%ember_a0, %ember_a1}}, {m['a']};\n"
                f"{i}mov.b32 {{%ember_b0, %ember_b1}}, {m['b']};\n"
                f"{i}{op}.{s}16 %ember_a0, %ember_a0, %ember_b0;\n"
                f"{i}{op}.{s}16 %ember_a1, %ember_a1, %ember_b1;\n"
                f"{i}{guard}mov.b32 {m['d']}, {{%ember_a0, %ember_a1}}; }}")
    return _PACKED.subn(halves, ptx)


def repair(binary: Any, cache_dir: Path | str) -> bool:
    """Give a compiled Triton kernel (``JITFunction.run(..., warmup=True)``) a cubin assembled
    from its PTX with packed 16-bit adds split, where it has any; True where it did. Raises
    where ptxas fails (the caller's build fails, and the kernel's ops run through ATen)."""
    asm = getattr(binary, "asm", None)
    ptx = asm.get("ptx") if isinstance(asm, dict) else None
    if getattr(binary, "ember_split16", False) or not isinstance(ptx, str) or not _PACKED.search(ptx):
        return False
    fixed, _ = split_packed_adds(ptx)
    meta = binary.metadata
    arch = int(meta.target.arch)
    flags = ["-lineinfo", *([] if meta.enable_fp_fusion else ["--fmad=false"]),
             *(meta.ptx_options.split() if getattr(meta, "ptx_options", None) else [])]
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(arch).path
    key = hashlib.sha256("\0".join([fixed, ptxas, *flags, str(arch)]).encode()).hexdigest()[:32]
    path = Path(cache_dir) / "triton" / f"split16-{key}.cubin"
    if not path.is_file():
        path = cache_dirs.writable_part(cache_dir, "triton") / path.name
    if not path.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
            src.write_text(fixed)
            proc = subprocess.run([ptxas, *flags, f"--gpu-name={sm_arch_from_capability(arch)}", str(src), "-o",
                                   str(out)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"ptxas on {binary.name}'s PTX with packed adds split: {proc.stderr[-2000:]}")
            with _lock:
                tmp_path = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp_path.write_bytes(out.read_bytes())
                tmp_path.replace(path)
    cubin = path.read_bytes()
    asm["cubin"] = cubin
    binary.kernel = cubin
    binary.ember_split16 = True
    if getattr(binary, "module", None) is not None:  # (loaded already: Triton's launcher loads it again)
        binary.module = binary.function = None
    return True
