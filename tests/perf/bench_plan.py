"""Search speed of `mgbench plan`: candidate layouts evaluated per second.

    python tests/perf/bench_plan.py [--model llama3-70b] [--max-gpus 4096] [--repeats 3]

Target (issue "The planner"): >= 1,000,000 candidates in under 10 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mgbench import catalog  # noqa: E402
from mgbench.planner.search import PlanOptions, plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--tokens", type=float, default=1.5e13)
    ap.add_argument("--max-gpus", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    shape = catalog.model_shape(a.model)
    runs = [plan(shape, PlanOptions(tokens=a.tokens, max_gpus=a.max_gpus)) for _ in range(a.repeats)]
    elapsed = [r["elapsed_s"] for r in runs]
    result = {"model": a.model, "max_gpus": a.max_gpus, "num_candidates": runs[0]["num_candidates"],
              "num_feasible": runs[0]["num_feasible"], "elapsed_s_median": statistics.median(elapsed),
              "candidates_per_s": runs[0]["num_candidates"] / statistics.median(elapsed)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
