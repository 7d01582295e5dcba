"""Alpha-beta model of a collective: t(S) = alpha + S / bw, fitted per collective.

The fit minimises the mean |relative error| (iteratively reweighted least squares), so
small and large messages count alike and one size that hits a transport's buffer
threshold does not drag the line away from the rest; that same mean |relative error|
over the fitted sizes is what the fit reports.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FIT_MIN_BYTES = 64 * 1024  # below this, start-up effects the two-parameter model ignores dominate


def fit(rows: list[dict[str, Any]], min_bytes: int = FIT_MIN_BYTES) -> dict[str, Any] | None:
    pts = sorted((r["size_bytes"], r["time_s"]) for r in rows if r["size_bytes"] >= min_bytes)
    if len(pts) < 2:
        return None
    S = np.array([p[0] for p in pts], dtype=float)
    t = np.array([p[1] for p in pts], dtype=float)
    A = np.column_stack([np.ones_like(S), S]) / t[:, None]  # rows: relative error per point
    w = np.ones_like(t)
    for _ in range(50):  # IRLS for the L1 norm: weights 1 / |residual|
        (alpha, beta), *_ = np.linalg.lstsq(A * w[:, None], w, rcond=None)
        resid = np.abs(A @ np.array([alpha, beta]) - 1.0)
        w = 1.0 / np.sqrt(np.maximum(resid, 1e-6))
    alpha, beta = max(alpha, 0.0), max(beta, 0.0)
    pred = alpha + beta * S
    err = np.abs(pred - t) / t
    # No positive slope: time did not grow with size over these points, so no bandwidth
    # can be read from them (null, not an infinite figure).
    bw = float(1.0 / beta / 1e9) if beta > 0 else None
    return {"alpha_s": float(alpha), "bw_gbps": bw, "fit_mean_abs_error_pct": float(100 * err.mean()),
            "fit_max_abs_error_pct": float(100 * err.max()), "fit_min_bytes": min_bytes, "num_points": len(pts)}
