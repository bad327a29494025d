"""Derive the coefficients of ember's vectorizable float32 atan, asin, sinh and exp2
(codegen/cpp_math.py: ``ember_atan_reduced``, ``ember_asin_poly``, ``ember_sinh``, ``ember_exp2``).

atan, asin and sinh are odd: f(u) = u + u^3 P(u^2) on [0, b], atan on [0, 1/2] (its range
reduction's interval), asin on [0, 1/2] (beyond it asin works from sqrt((1 - x) / 2) <= 1/2), sinh
on [0, 1] (beyond it exp); P is fitted to (f(u) - u) / u^3. exp2 is 2^r = 1 + r Q(r) on
[-1/2, 1/2] (r = x - round(x)); Q is fitted to (2^r - 1) / r. Least squares on Chebyshev nodes
against mpmath at 40 digits, weighted so that the error counts relative to f; the script prints
the coefficients as float32 literals and the max error of a float64 evaluation in units of
float32's 2^-24 (each well under 1/8 ulp, so the float32 evaluation's roundings decide the error).

    python tools/fit_cpu_math.py
"""

from __future__ import annotations

import mpmath
import numpy as np

mpmath.mp.dps = 40

# function, interval end, P's degree
FITS = [("atan", mpmath.atan, 0.5, 4), ("asin", mpmath.asin, 0.5, 4), ("sinh", mpmath.sinh, 1.0, 3)]


def cheb_nodes(a: float, b: float, n: int) -> np.ndarray:
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos((2 * k + 1) * np.pi / (2 * n))


def fit_odd(fn, end: float, degree: int) -> tuple[np.ndarray, float]:
    u = cheb_nodes(1e-3, end * 1.001, 800)
    z = u * u
    exact = np.array([float(fn(mpmath.mpf(v))) for v in u])
    target = np.array([float((fn(mpmath.mpf(v)) - mpmath.mpf(v)) / mpmath.mpf(v) ** 3) for v in u])
    weight = z * u / exact
    a = np.vander(z, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(a * weight[:, None], target * weight, rcond=None)
    coef = coef.astype(np.float32).astype(np.float64)  # as the kernel holds them
    got = u + u * z * np.polyval(coef[::-1], z)
    return coef, float(np.max(np.abs(got / exact - 1)) / 2.0 ** -24)


def fit_exp2(degree: int = 6) -> tuple[np.ndarray, float]:
    r = cheb_nodes(-0.5 * 1.001, 0.5 * 1.001, 800)
    r = r[np.abs(r) > 1e-6]
    exact = np.array([float(mpmath.power(2, mpmath.mpf(v))) for v in r])
    target = np.array([float((mpmath.power(2, mpmath.mpf(v)) - 1) / mpmath.mpf(v)) for v in r])
    weight = np.abs(r / exact)
    a = np.vander(r, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(a * weight[:, None], target * weight, rcond=None)
    coef = coef.astype(np.float32).astype(np.float64)
    got = 1 + r * np.polyval(coef[::-1], r)
    return coef, float(np.max(np.abs(got / exact - 1)) / 2.0 ** -24)


if __name__ == "__main__":
    for name, fn, end, degree in FITS:
        coef, err = fit_odd(fn, end, degree)
        print(f"{name}: P = {', '.join(f'{c:.10e}f' for c in coef)}   (max error {err:.3f} x 2^-24)")
    coef, err = fit_exp2()
    print(f"exp2: Q = {', '.join(f'{c:.10e}f' for c in coef)}   (max error {err:.3f} x 2^-24)")
