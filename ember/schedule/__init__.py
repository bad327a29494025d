"""Which nodes share a kernel (fusion.py), the steps they run as (steps.py), and the loop-level
kernel IR they become."""

from .fusion import plan
from .kernel_ir import Kernel, Value, format_kernel
from .steps import ExternStep, KernelStep, Schedule, ViewStep

__all__ = ["ExternStep", "Kernel", "KernelStep", "Schedule", "Value", "ViewStep", "format_kernel", "plan"]
