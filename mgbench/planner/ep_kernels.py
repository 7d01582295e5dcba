"""Published bandwidths of DeepEP-style expert-parallel kernels across AWS EFA nodes
(data/published_ep_kernels.toml) and the share of the network rate a backend reaches.

DeepEP's own InfiniBand kernels reach the links' rates from 4 nodes up (moe.DEEPEP_H800), so
the planner prices DeepEP-style dispatch at them. Its drop-ins over EFA (UCCL-EP, DeepEP on NVSHMEM's
libfabric transport: moe.DISPATCHER_BACKENDS) publish their own figures. A backend's share
(:func:`backend_share`) is the mean, over its fit rows, of the published figure put in
the bytes the planner counts as crossing nodes (:func:`network_gbps`) and taken net of
the latency the planner adds on its own (:func:`row_share`), over the catalog's per-GPU
network rate of the row's system; the held-out rows check it (:func:`report`).
layout_time passes it (:func:`priced_share`) to moe.a2a_seconds, which moves the bytes a
DeepEP-style exchange sends across EFA nodes at it.

    python -m mgbench.planner.ep_kernels   # prints each row against the share
"""

from __future__ import annotations

from functools import lru_cache
from statistics import mean
from types import SimpleNamespace
from typing import Any

from .. import catalog
from ..errors import MgbenchError
from . import moe
from .hardware import catalog_system, on_efa, resolve
from .splits import SPLITS, alternating

PHASES = ("dispatch", "combine")
DTYPES = ("fp8", "bf16")
REQUIRED = ("id", "backend", "system", "nodes", "ep", "phase", "gbps", "counts_own_node", "tokens", "hidden",
            "top_k", "experts", "dispatch_dtype", "split", "source", "date")
INTS = ("nodes", "ep", "tokens", "hidden", "top_k", "experts")
# The nodes a token's experts may span in the benchmarks' routing: DeepEP's
# tests/test_internode.py (and UCCL's copy) route through min(nodes, 4) groups of one node
# (its --num-topk-groups default, DeepEP @567632dd line 376). It picks the groups by each
# node's best expert score, so above 4 nodes a token's top-8 fill all 4 chosen nodes (a
# review's simulation of that routing: 3.98 to 4.0 nodes, where drawing the 8 evenly
# among the 4 nodes' experts gives 3.63): taken as 4 there. Up to 4 nodes every node is
# a group and the experts are drawn evenly (moe.distinct_reached).
BENCH_NODE_GROUPS = 4


@lru_cache(maxsize=1)
def rows() -> tuple[dict[str, Any], ...]:
    """The file's rows, checked (:func:`check`)."""
    return tuple(check(list(catalog.load("published_ep_kernels.toml").get("rows", []))))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, or MgbenchError naming each that lacks a field, repeats an id, names an
    unknown backend, phase, dispatch dtype, split or system, a system not on EFA, gives a
    bandwidth that is not a positive number, a count that is not a whole number, a
    counts_own_node that is not true or false, EP ranks that do not fill ``nodes`` whole
    nodes of more than one, or breaks the file's rule: within a backend, rows alternate
    fit / held out in file order, fit first."""
    bad = [f"{r.get('id', '?')}: missing {', '.join(k for k in REQUIRED if k not in r)}" for r in rows
           if any(k not in r for k in REQUIRED)]
    seen: set[str] = set()
    turn: dict[str, int] = {}
    for r in rows:
        if any(k not in r for k in REQUIRED):
            continue
        if r["id"] in seen:
            bad.append(f"{r['id']}: the id is used twice")
        seen.add(r["id"])
        if r["backend"] not in moe.DISPATCHER_BACKENDS:
            bad.append(f"{r['id']}: backend {r['backend']!r} (one of {', '.join(moe.DISPATCHER_BACKENDS)})")
        if r["phase"] not in PHASES:
            bad.append(f"{r['id']}: phase {r['phase']!r} (one of {', '.join(PHASES)})")
        if r["dispatch_dtype"] not in DTYPES:
            bad.append(f"{r['id']}: dispatch_dtype {r['dispatch_dtype']!r} (one of {', '.join(DTYPES)})")
        if r["split"] not in SPLITS:
            bad.append(f"{r['id']}: split {r['split']!r}")
        if isinstance(r["gbps"], bool) or not isinstance(r["gbps"], (int, float)) or not r["gbps"] > 0:
            bad.append(f"{r['id']}: gbps {r['gbps']!r} is not a positive number")
        if not isinstance(r["counts_own_node"], bool):
            bad.append(f"{r['id']}: counts_own_node {r['counts_own_node']!r} is not true or false")
        ints = [k for k in INTS if not _is_int(r[k]) or r[k] < 1]
        if ints:
            bad.append(f"{r['id']}: {', '.join(ints)} must be whole numbers of 1 or more")
        j = turn.get(r["backend"], 0)
        turn[r["backend"]] = j + 1
        if r["split"] != alternating(j, "fit"):
            bad.append(f"{r['id']}: split {r['split']!r}, but the rule makes the {r['backend']} row number {j + 1} "
                       f"{alternating(j, 'fit')} (alternating in file order, fit first)")
        system = catalog.systems().get(r["system"])
        if system is None:
            bad.append(f"{r['id']}: no catalog system {r['system']!r}")
            continue
        if not on_efa(r["system"]):
            bad.append(f"{r['id']}: {r['system']} does not talk over EFA (the shares are EFA's)")
        g = system["gpus_per_node"]
        if not ints and (r["nodes"] < 2 or r["ep"] != r["nodes"] * g):
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


def kernel_seconds(row: dict[str, Any]) -> float:
    """The row's kernel time, from the bytes its benchmark counts over its published rate:
    tokens x the distinct nodes a token reaches (moe.distinct_reached up to
    :data:`BENCH_NODE_GROUPS` nodes, that many above; its own node among them where it
    counts it, else the others) x hidden x bytes an element (FP8 dispatch: 1 + 4 / 128, with
    its scales; else 2)."""
    shape = SimpleNamespace(experts=row["experts"], top_k=row["top_k"])
    n = row["nodes"]
    if n > BENCH_NODE_GROUPS:
        d_n = float(BENCH_NODE_GROUPS)
    else:
        d_n = float(moe.distinct_reached(shape, row["ep"], row["ep"] // n)[0])
    nodes = d_n if row["counts_own_node"] else d_n * (n - 1.0) / n
    elem = moe.FP8_DISPATCH_BYTES if row["phase"] == "dispatch" and row["dispatch_dtype"] == "fp8" else 2.0
    return row["tokens"] * nodes * row["hidden"] * elem / (float(row["gbps"]) * 1e9)


def latency_seconds(row: dict[str, Any]) -> float:
    """What the planner adds to an exchange on the row's system and ranks besides its
    bytes: a latency per peer GPU of the node and a cost per peer node
    (moe.exchange_seconds with no bytes)."""
    return float(moe.exchange_seconds(resolve(row["system"]), row["ep"], 0.0, 0.0))


def catalog_gbps(system: str) -> float:
    """The catalog's per-GPU network rate of ``system``, GB/s (its link's peak x bw_eff x
    NICs a GPU: Hardware.inter_bw)."""
    return resolve(system).inter_bw / 1e9


def row_share(row: dict[str, Any]) -> float:
    """The share of its system's network rate the row's kernel reached, net of the latency
    the planner adds on its own (:func:`latency_seconds`): its bytes across nodes over the
    rest of its time."""
    t, lat = kernel_seconds(row), latency_seconds(row)
    if not t > lat:
        raise MgbenchError(f"published_ep_kernels.toml: {row['id']}: its kernel time ({t * 1e6:.0f} us) is not above "
                           f"the latency the planner adds ({lat * 1e6:.0f} us)")
    return network_gbps(row) * t / ((t - lat) * catalog_gbps(row["system"]))


def configuration(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a row measured (backend, system, nodes, phase and the benchmark's settings):
    two rows alike are one configuration measured twice."""
    return tuple(row[k] for k in ("backend", "system", "nodes", "phase", "tokens", "hidden", "top_k", "experts",
                                  "dispatch_dtype"))


@lru_cache(maxsize=None)
def backend_share(backend: str) -> float | None:
    """The mean :func:`row_share` of ``backend``'s fit rows; None where it has none (then
    the planner prices it at the links' rates, as DeepEP's own kernels)."""
    fit = [row_share(r) for r in rows() if r["backend"] == backend and r["split"] == "fit"]
    return mean(fit) if fit else None


def talks_over_efa(hw: Any) -> bool:
    """Whether ``hw``'s nodes talk over AWS EFA: a catalog system on EFA (a probed machine's
    fabric is not known: False)."""
    return bool(on_efa(catalog_system(hw)))


def priced_share(hw: Any, opts: Any) -> float:
    """The share of the network rate the planner moves a run's bytes across ``hw``'s nodes
    at (moe.a2a_seconds' ``across_share``): its backend's (:func:`backend_share`) where the
    run names one and its system talks over EFA, where the figures were measured; else 1
    (DeepEP's own kernels, and a backend with no fit row, at the links' rates)."""
    if getattr(opts, "backend", None) is None or not talks_over_efa(hw):
        return 1.0
    share = backend_share(opts.backend)
    return 1.0 if share is None else share


def error_pct(row: dict[str, Any]) -> float | None:
    """How far the planner's price of the row's exchange (its latency, and its bytes across
    at the backend's share) is from the published time, as a rate in % (positive: the
    planner's kernel is faster than published); None without a share."""
    share = backend_share(row["backend"])
    if share is None:
        return None
    t = kernel_seconds(row)
    across = network_gbps(row) * 1e9 * t  # the bytes across nodes, as the planner counts them
    predicted = float(moe.exchange_seconds(resolve(row["system"]), row["ep"], 0.0, across / share))
    return 100.0 * (t / predicted - 1.0)


def backend_note(backend: str | None, across_efa: bool | None, dispatcher: str = "deepep") -> str | None:
    """One line of predict's and plan's notes on a run's DeepEP-style backend: with one
    named whose EP crosses EFA nodes (``across_efa``), the share its bytes across were
    priced at and how that share did on the backend's held-out kernel rows; named where it
    does not (False) or where the fabric is not known (None: not a catalog system), that
    the links' rates stand; none named with DeepEP across EFA nodes, that DeepEP's own
    kernels do not run there. None where there is nothing to say."""
    if backend is None:
        if dispatcher != "deepep" or not across_efa:
            return None
        return ("--moe-dispatcher deepep across AWS EFA nodes with no --moe-backend: priced at the links' "
                "rates, as DeepEP's InfiniBand kernels, which do not run over EFA (they need InfiniBand's GPU-initiated "
                "RDMA); the published runs over EFA, whose interval this one takes, name theirs: give --moe-backend "
                f"{' or '.join(moe.DISPATCHER_BACKENDS)}")
    if across_efa is None:
        return (f"--moe-backend {backend}: not applied (the system's fabric is not known, and its published kernel "
                "figures are over AWS EFA): the links' rates")
    if not across_efa:
        return (f"--moe-backend {backend}: not applied (its published kernel figures are over AWS EFA, and this "
                "run's expert parallelism does not cross EFA nodes): the links' rates, as DeepEP's own kernels")
    share = backend_share(backend)
    if share is None:
        return (f"--moe-backend {backend}: no published kernel figure to fit (data/published_ep_kernels.toml): "
                "priced at the links' rates, as DeepEP's own kernels")
    s = summary(backend)
    h, new = s["held_out"], s["held_out_new"]
    check = "no held-out kernel row checks it"
    if h["rows"]:
        check = f"on its {h['rows']} held-out kernel rows mean |error| {h['mean']:.1f}%, worst {h['worst']:.1f}%"
        if new["rows"] != h["rows"]:
            check += (f"; on the {new['rows']} of a configuration no fit row holds {new['mean']:.1f}%" if new["rows"]
                      else "; every one repeats a fit row's configuration")
    return (f"--moe-backend {backend}: its bytes across EFA nodes priced at {share:.3f} of the network rate, the mean "
            f"of its {s['fit']['rows']} fit kernel benchmark rows net of the planner's latency ({check}; python -m "
            f"mgbench.planner.ep_kernels){proxy_note(backend)}; what the published training runs over EFA with "
            "DeepEP-style dispatch took against their predictions is the interval's")


def proxy_note(backend: str) -> str:
    """The clause a backend note adds where the backend's traffic across EFA goes through a
    CPU proxy (moe.PROXY_BACKENDS): the host wait each forward dispatch pays for its token
    counts (moe.efa_notify_seconds); empty otherwise."""
    if backend not in moe.PROXY_BACKENDS:
        return ""
    ms = float(moe.host_constants()["efa_proxy_notify_ms"])
    return (f"; and {ms:g} ms more host wait a forward dispatch (a recomputed one too) for the token counts it "
            "exchanges through the CPU proxy, beyond the per-layer host wait already priced, which the kernel "
            "benchmarks' cached dispatch leaves out (solved from the one fit row through a CPU proxy, NVSHMEM on "
            "libfabric with Kimi-K2 on 32 p6-b200, and applied to both proxy backends: python -m "
            "mgbench.planner.moe_validation --efa-notify)")


def summary(backend: str) -> dict[str, dict[str, Any]]:
    """Per split (and "held_out_new": held-out rows whose configuration no fit row holds)
    of ``backend``'s rows: rows, mean and worst |error| %."""
    mine = [r for r in rows() if r["backend"] == backend]
    fit_configs = {configuration(r) for r in mine if r["split"] == "fit"}
    parts = {split: [r for r in mine if r["split"] == split] for split in SPLITS}
    parts["held_out_new"] = [r for r in parts["held_out"] if configuration(r) not in fit_configs]
    out = {}
    for name, part in parts.items():
        errs = [abs(e) for r in part if (e := error_pct(r)) is not None]
        out[name] = {"rows": len(errs), "mean": mean(errs) if errs else None, "worst": max(errs) if errs else None}
    return out


def report() -> str:
    """Each row's share and error, and the mean |error| by backend and split."""
    from tabulate import tabulate

    table = []
    for r in rows():
        e = error_pct(r)
        table.append([r["id"], r["backend"], r["split"], r["system"], r["ep"], r["phase"], f"{r['gbps']:g}",
                      f"{kernel_seconds(r) * 1e6:.0f}", f"{latency_seconds(r) * 1e6:.0f}",
                      f"{catalog_gbps(r['system']):.1f}", f"{row_share(r):.3f}", "-" if e is None else f"{e:+.1f}%"])
    lines = [tabulate(table, headers=["row", "backend", "split", "system", "ep", "phase", "published GB/s",
                                      "kernel us", "planner latency us", "catalog GB/s", "share", "error"])]
    for backend in sorted({r["backend"] for r in rows()}):
        share = backend_share(backend)
        lines.append(f"{backend}: share {share:.3f} of the network rate" if share is not None
                     else f"{backend}: no fit row, priced at the links' rates")
        words = {"fit": "fit", "held_out": "held out",
                 "held_out_new": "held out, configurations no fit row holds"}
        for name, s in summary(backend).items():
            if s["rows"]:
                lines.append(f"  {words[name]}: {s['rows']} rows, mean |error| {s['mean']:.1f}%, worst {s['worst']:.1f}%")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
