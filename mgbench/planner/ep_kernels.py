"""Published bandwidths of DeepEP-style expert-parallel kernels across AWS EFA nodes
(data/published_ep_kernels.toml) and the share of the network rate a backend reaches.

DeepEP's own InfiniBand kernels reach the links' rates (moe.DEEPEP_H800), so the planner
prices DeepEP-style dispatch at them. Its drop-ins over EFA (UCCL-EP, DeepEP on NVSHMEM's
libfabric transport: :data:`DISPATCHER_BACKENDS`) publish lower figures. A backend's share
(:func:`backend_share`) is the mean, over its fit rows, of the published figure, put in
the bytes the planner counts as crossing nodes (:func:`network_gbps`), over the catalog's
per-GPU network rate of the row's system; the held-out rows check it (:func:`report`).
moe.a2a_seconds divides the bytes a DeepEP-style exchange sends across EFA nodes by it.

    python -m mgbench.planner.ep_kernels   # prints each row against the share
"""

from __future__ import annotations

from functools import lru_cache
from statistics import mean
from typing import Any

from .. import catalog
from ..errors import MgbenchError

# The implementations a DeepEP-style dispatch may name where it does not run DeepEP's
# InfiniBand kernels (moe.MoeOptions.backend, a published MoE row's dispatcher_backend):
# UCCL's EFA drop-in for DeepEP, and DeepEP over NVSHMEM on libfabric.
DISPATCHER_BACKENDS = ("uccl-ep", "nvshmem-libfabric")
SPLITS = ("fit", "held_out")
PHASES = ("dispatch", "combine")
REQUIRED = ("id", "backend", "system", "nodes", "ep", "phase", "gbps", "counts_own_node", "split", "source", "date")


@lru_cache(maxsize=1)
def rows() -> tuple[dict[str, Any], ...]:
    """The file's rows, checked (:func:`check`)."""
    return tuple(check(list(catalog.load("published_ep_kernels.toml").get("rows", []))))


def check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, or MgbenchError naming each that lacks a field, names an unknown backend,
    phase, split or system, a system not on EFA, EP ranks that do not fill ``nodes`` whole
    nodes of more than one, or breaks the file's rule: within a backend, rows alternate
    fit / held out in file order, fit first."""
    from .hardware import on_efa

    bad = [f"{r.get('id', '?')}: missing {', '.join(k for k in REQUIRED if k not in r)}" for r in rows
           if any(k not in r for k in REQUIRED)]
    turn: dict[str, int] = {}
    for r in rows:
        if any(k not in r for k in REQUIRED):
            continue
        if r["backend"] not in DISPATCHER_BACKENDS:
            bad.append(f"{r['id']}: backend {r['backend']!r} (one of {', '.join(DISPATCHER_BACKENDS)})")
        if r["phase"] not in PHASES:
            bad.append(f"{r['id']}: phase {r['phase']!r} (one of {', '.join(PHASES)})")
        if r["split"] not in SPLITS:
            bad.append(f"{r['id']}: split {r['split']!r}")
        j = turn.get(r["backend"], 0)
        turn[r["backend"]] = j + 1
        if r["split"] != SPLITS[j % 2]:
            bad.append(f"{r['id']}: split {r['split']!r}, but the rule makes the {r['backend']} row number {j + 1} "
                       f"{SPLITS[j % 2]} (alternating in file order, fit first)")
        system = catalog.systems().get(r["system"])
        if system is None:
            bad.append(f"{r['id']}: no catalog system {r['system']!r}")
            continue
        if not on_efa(r["system"]):
            bad.append(f"{r['id']}: {r['system']} does not talk over EFA (the shares are EFA's)")
        g = system["gpus_per_node"]
        if r["nodes"] < 2 or r["ep"] != r["nodes"] * g:
            bad.append(f"{r['id']}: ep {r['ep']} on {r['nodes']} nodes of {g} GPUs: the rows are whole nodes, "
                       "two or more")
    if bad:
        raise MgbenchError("published_ep_kernels.toml: " + "; ".join(bad))
    return rows


def network_gbps(row: dict[str, Any]) -> float:
    """The row's published GB/s a GPU in the bytes the planner counts as crossing nodes
    (moe.rows_sent: a token once for each other node it reaches): where the benchmark
    counts its own node too, x (N - 1) / N on N nodes."""
    n = float(row["nodes"])
    return float(row["gbps"]) * ((n - 1.0) / n if row["counts_own_node"] else 1.0)


def catalog_gbps(system: str) -> float:
    """The catalog's per-GPU network rate of ``system``, GB/s (its link's peak x bw_eff x
    NICs a GPU: Hardware.inter_bw)."""
    from .hardware import resolve

    return resolve(system).inter_bw / 1e9


def row_share(row: dict[str, Any]) -> float:
    """The share of its system's network rate the row's kernel reached."""
    return network_gbps(row) / catalog_gbps(row["system"])


@lru_cache(maxsize=None)
def backend_share(backend: str) -> float | None:
    """The mean :func:`row_share` of ``backend``'s fit rows; None where it has none (then
    the planner prices it at the links' rates, as DeepEP's own kernels)."""
    fit = [row_share(r) for r in rows() if r["backend"] == backend and r["split"] == "fit"]
    return mean(fit) if fit else None


def error_pct(row: dict[str, Any]) -> float | None:
    """How far the backend's share prices the row's bandwidth from the published figure,
    % (positive: the share gives a faster kernel than published); None without a share."""
    share = backend_share(row["backend"])
    if share is None:
        return None
    return 100.0 * (share * catalog_gbps(row["system"]) / network_gbps(row) - 1.0)


def backend_note(backend: str, across_efa: bool | None) -> str:
    """One line of predict's and plan's notes on a run that names ``backend``: the share of
    the network rate its bytes across EFA nodes were priced at and how that share did on
    the backend's held-out kernel rows; or, where its expert parallelism does not cross EFA
    nodes (``across_efa`` False, or None: not a catalog system), that nothing was changed."""
    share = backend_share(backend)
    if not across_efa:
        return (f"--moe-backend {backend}: not priced here (its published kernel figures are over AWS EFA, and this "
                "run's expert parallelism does not cross EFA nodes): the links' rates, as DeepEP's own kernels")
    if share is None:
        return (f"--moe-backend {backend}: no published kernel figure to fit (data/published_ep_kernels.toml): "
                "priced at the links' rates, as DeepEP's own kernels")
    held = [abs(e) for r in rows() if r["backend"] == backend and r["split"] == "held_out"
            and (e := error_pct(r)) is not None]
    fit = sum(r["backend"] == backend and r["split"] == "fit" for r in rows())
    check = (f"on its {len(held)} held-out kernel rows mean |error| {mean(held):.1f}%, worst {max(held):.1f}%"
             if held else "no held-out kernel row checks it")
    return (f"--moe-backend {backend}: its bytes across EFA nodes priced at {share:.3f} of the network rate, the mean "
            f"of its {fit} fit kernel benchmark rows ({check}; python -m mgbench.planner.ep_kernels); what the published "
            "training runs over EFA with DeepEP-style dispatch took against their predictions is the interval's")


def report() -> str:
    """Each row's share and error, and the mean |error| by backend and split."""
    from tabulate import tabulate

    table = []
    for r in rows():
        e = error_pct(r)
        table.append([r["id"], r["backend"], r["split"], r["system"], r["ep"], r["phase"], f"{r['gbps']:g}",
                      f"{network_gbps(r):.1f}", f"{catalog_gbps(r['system']):.1f}", f"{row_share(r):.3f}",
                      "-" if e is None else f"{e:+.1f}%"])
    lines = [tabulate(table, headers=["row", "backend", "split", "system", "ep", "phase", "published GB/s",
                                      "across nodes", "catalog GB/s", "share", "error"])]
    for backend in sorted({r["backend"] for r in rows()}):
        share = backend_share(backend)
        lines.append(f"{backend}: share {share:.3f} of the network rate" if share is not None
                     else f"{backend}: no fit row, priced at the links' rates")
        for split in SPLITS:
            errs = [abs(e) for r in rows() if r["backend"] == backend and r["split"] == split
                    and (e := error_pct(r)) is not None]
            if errs:
                lines.append(f"  {split}: {len(errs)} rows, mean |error| {mean(errs):.1f}%, worst {max(errs):.1f}%")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
