"""Kernel-by-kernel difference of two ``bench/gpt_step.py --profile N`` outputs (old tree, new tree).

    python bench/profile_diff.py old.txt new.txt [--variant ember-triton] [--top 30]

Reads each file's table of the variant's costliest kernels of a step and prints the kernels whose
device µs changed most, with both totals (of the listed kernels only).
"""

from __future__ import annotations

import argparse
import re


def kernel_times(path: str, variant: str) -> dict[str, float]:
    """kernel -> µs, from the ``{variant}: the costliest kernels`` table of a gpt_step output."""
    times: dict[str, float] = {}
    inside = False
    with open(path) as f:
        for line in f:
            if line.startswith(f"{variant}: the costliest"):
                inside = True
            elif inside and line.startswith("|"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) == 2 and re.fullmatch(r"[0-9.]+", cells[1]):
                    times[cells[0]] = float(cells[1])
            elif inside:
                inside = False
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--variant", default="ember-triton")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    old, new = kernel_times(args.old, args.variant), kernel_times(args.new, args.variant)
    print(f"listed kernels: old {sum(old.values()):.0f} µs, new {sum(new.values()):.0f} µs")
    nan = float("nan")
    for name in sorted(old.keys() | new.keys(), key=lambda k: -abs(new.get(k, 0) - old.get(k, 0)))[:args.top]:
        print(f"{name[:70]:70s} {old.get(name, nan):8.1f} {new.get(name, nan):8.1f} "
              f"{new.get(name, 0) - old.get(name, 0):+8.1f}")


if __name__ == "__main__":
    main()
