"""nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md): busbw = algbw x factor(n),
which makes bandwidths comparable across collectives and rank counts. Kept free of torch
so the planner can convert measured links without importing it."""


def busbw_factor(name: str, n: int) -> float:
    """all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1."""
    if name == "all_reduce":
        return 2.0 * (n - 1) / n
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0
