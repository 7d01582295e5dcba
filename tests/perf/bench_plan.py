"""Search speed of `mgbench plan`: candidate layouts evaluated per second, and what
sharing the layout rules' verdicts across systems saves (search.kept_layouts): every
system searched with a shared verdict cache and with none, alternating, in one run.

    python tests/perf/bench_plan.py [--model llama3-70b] [--max-gpus 4096] [--repeats 3]
    python tests/perf/bench_plan.py --pairs [--repeats 3]

--pairs times perf.distinct_pairs's counting path against the sort it replaced (np.unique of
a complex key) on arrays shaped like a plan's (pipeline degrees by micro-batch counts),
alternating, and checks both give the same pairs and indices.

Target (issue "The planner"): >= 1,000,000 candidates in under 10 s on 2 cores. Sharing:
a ratio (unshared / shared seconds) above 1, the same candidates either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mgbench import catalog  # noqa: E402
from mgbench.errors import MgbenchError  # noqa: E402
from mgbench.planner import cost, hardware  # noqa: E402
from mgbench.planner.search import PlanOptions, evaluate_system, plan  # noqa: E402


def systems_seconds(shape, opts: PlanOptions, shared: bool) -> tuple[float, list]:  # type: ignore[no-untyped-def]
    """Seconds to search every catalog system as plan does, sharing the verdicts or not,
    and each system's feasible candidates (its columns)."""
    prices, kept, found = cost.Prices(), ({} if shared else None), []
    t0 = time.perf_counter()
    for system in hardware.systems():
        try:
            found.append(evaluate_system(shape, system, opts, prices, kept)[0])
        except MgbenchError:  # a system plan leaves out (e.g. fp8 on a GPU without it)
            continue
    return time.perf_counter() - t0, found


def same_candidates(a: list, b: list) -> bool:
    """Whether two searches found the same feasible candidates with the same figures."""
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k], equal_nan=True) for k in x if k != "_meta")
        for x, y in zip(a, b))


def pairs_ratio(n: int, repeats: int) -> dict[str, float]:
    """Seconds of np.unique on the complex key and of perf.distinct_pairs (its counting
    path, perf._counted_pairs) on ``n`` (pipeline degree, micro-batch count) pairs,
    alternating ``repeats`` times; the same answer either way is asserted."""
    from mgbench.planner.perf import distinct_pairs

    rng = np.random.default_rng(0)
    a = rng.choice([1, 2, 4, 8, 16, 32], n).astype(float)
    b = rng.integers(1, 2049, n).astype(float)
    sort_s, count_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pairs, inverse = np.unique(a + 1j * b, return_inverse=True)
        t1 = time.perf_counter()
        pa, pb, index = distinct_pairs(a, b)
        t2 = time.perf_counter()
        assert np.array_equal(pairs.real, pa) and np.array_equal(pairs.imag, pb) and np.array_equal(inverse, index)
        sort_s.append(t1 - t0)
        count_s.append(t2 - t1)
    return {"elements": n, "sort_s_median": statistics.median(sort_s), "count_s_median": statistics.median(count_s),
            "ratio_median": statistics.median(s / c for s, c in zip(sort_s, count_s))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--tokens", type=float, default=1.5e13)
    ap.add_argument("--max-gpus", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pairs", action="store_true", help="time distinct_pairs's counting against a sort, and stop")
    ap.add_argument("--elements", type=int, default=3_000_000, help="with --pairs: pairs a call")
    a = ap.parse_args()
    if a.pairs:
        print(json.dumps(pairs_ratio(a.elements, a.repeats), indent=2))
        return
    shape = catalog.model_shape(a.model)
    runs = [plan(shape, PlanOptions(tokens=a.tokens, max_gpus=a.max_gpus)) for _ in range(a.repeats)]
    elapsed = [r["elapsed_s"] for r in runs]
    result = {"model": a.model, "max_gpus": a.max_gpus, "num_candidates": runs[0]["num_candidates"],
              "num_feasible": runs[0]["num_feasible"], "elapsed_s_median": statistics.median(elapsed),
              "candidates_per_s": runs[0]["num_candidates"] / statistics.median(elapsed)}
    opts = PlanOptions(tokens=a.tokens, max_gpus=a.max_gpus)
    pairs = [(systems_seconds(shape, opts, False), systems_seconds(shape, opts, True)) for _ in range(a.repeats)]
    assert all(same_candidates(u[1], s[1]) for u, s in pairs), "sharing changed the candidates found"
    result["sharing"] = {"unshared_s_median": statistics.median(u[0] for u, _ in pairs),
                         "shared_s_median": statistics.median(s[0] for _, s in pairs),
                         "ratio_median": statistics.median(u[0] / s[0] for u, s in pairs)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
