"""Which nodes share a kernel (fusion.py), and the loop-level kernel IR they become."""

from .fusion import ExternStep, KernelStep, Schedule, ViewStep, plan
from .kernel_ir import Kernel, Value, format_kernel

__all__ = ["ExternStep", "Kernel", "KernelStep", "Schedule", "Value", "ViewStep", "format_kernel", "plan"]
