"""Element types of ember's IR.

ember keeps its own small dtype objects so the IR reads the same whatever the backend; the mapping
to and from ``torch.dtype`` lives here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    kind: str  # 'f' floating, 'i' signed integer, 'u' unsigned integer, 'b' bool

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def is_low_precision(self) -> bool:
        """16-bit floats: stored narrow, computed in float32 by every backend."""
        return self.kind == "f" and self.itemsize == 2

    @property
    def short(self) -> str:
        return _SHORT[self.name]

    def __repr__(self) -> str:
        return self.name


float16 = DType("float16", 2, "f")
bfloat16 = DType("bfloat16", 2, "f")
float32 = DType("float32", 4, "f")
float64 = DType("float64", 8, "f")
int8 = DType("int8", 1, "i")
int16 = DType("int16", 2, "i")
int32 = DType("int32", 4, "i")
int64 = DType("int64", 8, "i")
uint8 = DType("uint8", 1, "u")
bool_ = DType("bool", 1, "b")

ALL: tuple[DType, ...] = (float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8, bool_)

_SHORT = {
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "int8": "i8",
    "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "b8",
}

_TO_TORCH = {
    float16: torch.float16, bfloat16: torch.bfloat16, float32: torch.float32,
    float64: torch.float64, int8: torch.int8, int16: torch.int16, int32: torch.int32,
    int64: torch.int64, uint8: torch.uint8, bool_: torch.bool,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}


class UnsupportedDType(TypeError):
    """A torch dtype ember does not generate code for (complex, float8, ...): such ops run in ATen."""


def from_torch(dtype: torch.dtype) -> DType:
    try:
        return _FROM_TORCH[dtype]
    except KeyError:
        raise UnsupportedDType(f"ember does not generate code for {dtype}") from None


def is_supported_torch(dtype: torch.dtype) -> bool:
    return dtype in _FROM_TORCH


def to_torch(dtype: DType) -> torch.dtype:
    return _TO_TORCH[dtype]


def compute_dtype(dtype: DType) -> DType:
    """The type arithmetic happens in: 16-bit floats widen to float32, as eager does per op."""
    return float32 if dtype.is_low_precision else dtype


def promote(a: DType, b: DType) -> DType:
    return from_torch(torch.promote_types(to_torch(a), to_torch(b)))
