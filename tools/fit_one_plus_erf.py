"""Derive the polynomial of ember's float32 ``one_plus_erf`` (passes/erf.py; its kernels in
codegen/c_prelude.py and runtime/triton_helpers.py).

For t = |z| in [0, 4]: log2(erfc(t)) = t * R(t), R of degree 10. The kernels compute
E = 2^(t * R(t)) in float32 (Horner with FMAs, then exp2), and 1 + erf(z) = E for z < 0, 2 - E
for z >= 0. R is fitted by iteratively reweighted least squares on Chebyshev nodes (towards the
minimax error of log2(erfc)), against mpmath's erfc. The script prints R's coefficients as float32
(highest degree first) and the float32 evaluation's error in ulps against math.erfc, next to eager's
float32 ``1 + erf(z)`` (a correctly rounded erf).

    python tools/fit_one_plus_erf.py
"""

from __future__ import annotations

import math

import numpy as np
from mpmath import erfc as mp_erfc
from mpmath import log as mp_log
from mpmath import mp

CUTOFF = 4.0
TERMS = 11


def fit() -> list[float]:
    mp.dps = 30
    k = np.arange(4000)
    t = np.sort(CUTOFF / 2 + CUTOFF / 2 * np.cos((2 * k + 1) * np.pi / (2 * len(k))))
    r = np.array([float(mp_log(mp_erfc(v), 2)) for v in t]) / t
    a = np.vander(t, TERMS, increasing=True)
    w = t.copy()  # an error in R weighs t times in the exponent
    for _ in range(60):
        coef, *_ = np.linalg.lstsq(a * w[:, None], r * w, rcond=None)
        err = np.abs((a @ coef - r) * t)
        w = np.maximum(w * (err / err.max()) ** 0.3, 1e-30)
    return [float(np.float32(c)) for c in coef[::-1]]


def evaluate(z: np.ndarray, coef: list[float]) -> np.ndarray:
    """The kernels' float32 steps (an FMA as a float64 product and sum, rounded once to float32)."""
    f = np.float32
    z = z.astype(f)
    t = np.abs(z)
    r = np.full_like(t, f(coef[0]))
    for c in coef[1:]:
        r = (r.astype(np.float64) * t + np.float64(c)).astype(f)
    e = np.exp2((t * r).astype(f).astype(np.float64)).astype(f)
    e = np.where(t > CUTOFF, f(0), e)
    return np.where(z < 0, e, (f(2) - e).astype(f))


def main() -> None:
    coef = fit()
    print("R, highest degree first:", ", ".join(f"{c!r}" for c in coef))
    z = np.linspace(-6, 6, 1_200_001).astype(np.float32)
    exact = np.array([math.erfc(-float(v)) for v in z])
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    ours = np.abs(evaluate(z, coef) - exact) / ulp
    eager = np.abs((np.float32(1) + np.array([math.erf(float(v)) for v in z]).astype(np.float32)) - exact) / ulp
    for lo, hi in ((-4, -3), (-3, -2), (-2, -1), (-1, 0), (0, 1), (1, 6)):
        m = (z >= lo) & (z < hi)
        print(f"z in [{lo}, {hi}): max error {ours[m].max():.1f} ulp (eager's float32 1 + erf: {eager[m].max():.1f})")


if __name__ == "__main__":
    main()
