"""Derive the coefficients of ember's vectorizable float32 expm1 and log1p (codegen/cpp_prelude.py,
``ember_expm1`` and ``ember_log1p``); glibc's expm1f and log1pf have no vector forms, so a
loop calling them ran one element at a time (ELU, softplus, Mish, log-sigmoid, BCE with logits
on 2 cores: 3-6x eager).

* expm1: x = k ln2 + r, |r| <= ln2 / 2, and expm1(r) = r + r^2 (1/2 + r P(r)) with P of degree 4
  (fitted to (expm1(r) - r - r^2/2) / r^3); expm1(x) = 2^k expm1(r) + (2^k - 1).
* log1p: 1 + x = 2^k m with m in [sqrt(1/2), sqrt(2)), f = m - 1, s = f / (2 + f), z = s^2;
  log(1 + f) = f - f^2/2 + s (f^2/2 + R(z)), R(z) = z Q(z) with Q of degree 2 (fitted to R).

Least squares on Chebyshev nodes against mpmath at 40 digits (relative error for P, absolute
for R, whose error enters the result times s); prints the coefficients as float32 literals and
the max error of a float64 evaluation, in units of float32's 2^-24.

    python tools/fit_log1p_expm1.py
"""

from __future__ import annotations

import mpmath
import numpy as np

mpmath.mp.dps = 40


def cheb_nodes(a: float, b: float, n: int) -> np.ndarray:
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos((2 * k + 1) * np.pi / (2 * n))


def fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, degree: int) -> np.ndarray:
    a = np.vander(x, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    return coef.astype(np.float32).astype(np.float64)  # as the kernel holds them


def fit_expm1() -> np.ndarray:
    half = float(mpmath.log(2)) / 2 * 1.001
    r = cheb_nodes(-half, half, 600)
    r = r[np.abs(r) > 1e-4]
    exact = [mpmath.expm1(mpmath.mpf(v)) for v in r]
    target = np.array([float((e - v - mpmath.mpf(v) ** 2 / 2) / mpmath.mpf(v) ** 3) for e, v in zip(exact, r)])
    weight = r ** 3 / np.array([float(e) for e in exact])  # P's error, relative to expm1(r)
    coef = fit(r, target, np.abs(weight), 4)
    got = r + r * r * (0.5 + r * np.polyval(coef[::-1], r))
    err = np.max(np.abs(got / np.array([float(e) for e in exact]) - 1)) / 2.0 ** -24
    print(f"expm1: P = {', '.join(f'{c:.10e}f' for c in coef)}   (max error {err:.3f} x 2^-24)")
    return coef


def fit_log1p() -> np.ndarray:
    smax = float((mpmath.sqrt(2) - 1) / (mpmath.sqrt(2) + 1)) * 1.001
    s = cheb_nodes(1e-4, smax, 600)
    z = s * s
    target = []
    for v in s:
        sv = mpmath.mpf(v)
        f = 2 * sv / (1 - sv)
        target.append(float((mpmath.log1p(f) - f + f * f / 2) / sv - f * f / 2))
    target = np.array(target)
    coef = fit(z, target / z, z, 2)  # R = z Q(z): Q's error times z
    got = z * np.polyval(coef[::-1], z)
    # the result's error is s * (R's error), against log1p(f) ~ 2 s
    err = np.max(np.abs(got - target) / 2) / 2.0 ** -24
    print(f"log1p: Q = {', '.join(f'{c:.10e}f' for c in coef)}   (max error {err:.3f} x 2^-24)")
    return coef


if __name__ == "__main__":
    fit_expm1()
    fit_log1p()
