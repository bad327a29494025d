"""Derive the coefficients of ember's vectorizable float32 erf (codegen/cpp.py, ember_erf).

Two pieces, both branch-free so a vectorized loop can compute both and select:
  |x| < 1 : erf(x) = x * P(x^2)              (P: degree 6)
  |x| >= 1: erf(x) = 1 - exp(-x^2) * R(1/|x|)  (R: degree 10, fitted to erfcx on [1, 4])
Beyond |x| = 4, erf rounds to 1 in float32. Fits are weighted least squares on Chebyshev
nodes (relative error); the script prints the coefficients and the max error in ulps of a
float32 evaluation against math.erf.

    python tools/fit_erf.py
"""

from __future__ import annotations

import math

import numpy as np


def cheb_nodes(a: float, b: float, n: int) -> np.ndarray:
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos((2 * k + 1) * np.pi / (2 * n))


def fit_small() -> np.ndarray:
    x = cheb_nodes(0.0, 1.0, 400)
    y = np.array([math.erf(v) / v for v in x])  # erf(x)/x as a polynomial in x^2
    A = np.vander(x * x, 7, increasing=True)
    w = 1 / y
    coef, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    return coef


def fit_large() -> np.ndarray:
    x = cheb_nodes(1.0, 4.0, 800)
    y = np.array([math.erfc(v) * math.exp(v * v) for v in x])  # erfcx, smooth in 1/x
    t = 1 / x
    A = np.vander(t, 11, increasing=True)
    w = 1 / y
    coef, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    return coef


def evaluate(x: np.ndarray, small: np.ndarray, large: np.ndarray) -> np.ndarray:
    f = np.float32
    x = x.astype(f)
    ax = np.abs(x)
    x2 = ax * ax
    p = np.zeros_like(x2)
    for c in small[::-1]:
        p = p * x2 + f(c)
    lo = ax * p
    t = f(1) / np.maximum(ax, f(1))
    r = np.zeros_like(t)
    for c in large[::-1]:
        r = r * t + f(c)
    hi = f(1) - np.exp(-x2).astype(f) * r
    y = np.where(ax < 1, lo, np.where(ax < 4, hi, f(1)))
    return np.copysign(y, x)


def main() -> None:
    small, large = fit_small(), fit_large()
    xs = np.concatenate([np.linspace(-5, 5, 200001), np.geomspace(1e-30, 1, 2000)]).astype(np.float32)
    ref = np.array([math.erf(float(v)) for v in xs])
    got = evaluate(xs, small, large).astype(np.float64)
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    ulp[ulp == 0] = np.finfo(np.float32).tiny
    print("small:", ", ".join(f"{c:.9e}f" for c in small))
    print("large:", ", ".join(f"{c:.9e}f" for c in large))
    print(f"max error {np.max(np.abs(got - ref) / ulp):.2f} ulp")


if __name__ == "__main__":
    main()
