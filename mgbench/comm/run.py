"""`mgbench comm`: launch the collective sweep through torchrun and store it as a run."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from .. import store
from ..errors import MgbenchError
from ..runner.launch import SHARED_FS_WAIT_S, Cluster, child_env, torchrun_argv
from ..runner.procs import die_with_parent, kill_tree
from ..telemetry.interconnect import detect
from ..telemetry.machine import fingerprint
from .collectives import COLLECTIVES
from .fit import fit

# Defaults sized for the backend: loopback gloo moves a few GB/s, NVLink hundreds.
DEFAULTS = {
    "cpu": {"min_bytes": 4 * 1024, "max_bytes": 4 * 2**20, "factor": 2, "warmup": 5, "iters": 50},
    "cuda": {"min_bytes": 8 * 1024, "max_bytes": 1 * 2**30, "factor": 4, "warmup": 5, "iters": 20},
}


def run_comm(nproc: int, device: str, collectives: list[str], dtypes: list[str], results_dir: str,
             run_id: str | None = None, timeout_s: int = 600, progress: Callable[[str], None] = print,
             cluster: Cluster | None = None, **overrides: Any) -> Path:
    """Run the sweep; returns the run folder holding comm.jsonl and comm_fit.json. With
    ``cluster`` (every node calls this), measurements are also split into intra-node and
    inter-node groups."""
    for c in collectives:
        if c not in COLLECTIVES:
            raise MgbenchError(f"--collectives: unknown {c!r}; choose from {', '.join(COLLECTIVES)}")
    if device == "cpu" and any(d != "float32" for d in dtypes):
        raise MgbenchError("--dtype: gloo reduces only float32 on CPU; use --dtype float32")
    plan = {**DEFAULTS[device], **{k: v for k, v in overrides.items() if v is not None}}
    if plan["min_bytes"] < 1 or plan["max_bytes"] < plan["min_bytes"] or plan["factor"] < 2:
        raise MgbenchError("need 1 <= --min-bytes <= --max-bytes and --factor >= 2")
    if cluster is not None and not cluster.leader:
        return _follow_comm(cluster, Path(results_dir) / str(run_id), device, timeout_s)
    run_id = run_id or store.new_run_id(f"comm-n{nproc}")
    run_dir = store.create_run_dir(results_dir, run_id)
    manifest = {"run_id": run_id, "kind": "comm", "status": "running",
                "started_at": dt.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv,
                "suite": {"name": "comm", "description": "collective microbenchmarks", "text": "", "sha256": ""},
                "machine": fingerprint(), "interconnect": detect(), "schema_version": store.SCHEMA_VERSION,
                "comm": {"nproc": nproc if cluster is None else cluster.world, "device": device,
                         "collectives": collectives, "dtypes": dtypes, **plan}}
    if cluster is not None:
        manifest["cluster"] = {"nnodes": cluster.nnodes, "nproc_per_node": cluster.nproc_per_node,
                               "world_size": cluster.world, "rdzv_endpoint": cluster.rdzv_endpoint}
    store.write_json_atomic(run_dir / "manifest.json", manifest)
    plan_path = run_dir / "plans" / "comm.json"
    plan_path.parent.mkdir(exist_ok=True)
    store.write_json_atomic(plan_path, {"run_dir": str(run_dir.resolve()), "device": device,
                                        "collectives": collectives, "dtypes": dtypes, **plan})
    progress(f"{', '.join(collectives)} on {nproc} {device} rank(s), {plan['min_bytes']} to {plan['max_bytes']} bytes")
    log = run_dir / "logs" / "comm.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(torchrun_argv(nproc, plan_path, run_dir / "logs" / "ranks", "mgbench.comm.worker",
                                              cluster=cluster, rdzv_id=f"{run_id}-comm"),
                                stdout=f, stderr=subprocess.STDOUT, env=child_env(nproc, device, "comm"),
                                start_new_session=True, preexec_fn=die_with_parent)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            rc = None
    rows = load_rows(run_dir)
    fits = {}
    for key in sorted({(r["collective"], r["dtype"], r.get("scope", "all")) for r in rows}):
        fits[":".join(key)] = fit([r for r in rows if (r["collective"], r["dtype"], r.get("scope", "all")) == key])
    store.write_json_atomic(run_dir / "comm_fit.json", fits)
    status = "complete" if rc == 0 else ("timeout" if rc is None else "error")
    manifest.update(status=status, finished_at=dt.datetime.now().isoformat(timespec="seconds"),
                    counts={"rows": len(rows), "wrong": sum(r["wrong"] for r in rows)})
    store.write_json_atomic(run_dir / "manifest.json", manifest)
    if status != "complete":
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-3:])
        raise MgbenchError(f"mgbench comm {status} (results so far in {run_dir}): {tail[-400:]}")
    return run_dir


def _follow_comm(cluster: Cluster, run_dir: Path, device: str, timeout_s: int) -> Path:
    """A follower node: wait for the leader's plan on the shared filesystem, then run
    this node's torchrun agent."""
    import time

    plan_path = run_dir / "plans" / "comm.json"
    t0 = time.monotonic()
    while not plan_path.exists():
        if time.monotonic() - t0 > SHARED_FS_WAIT_S:
            raise MgbenchError(f"node {cluster.node_rank}: {plan_path} did not appear: --results-dir must be shared")
        time.sleep(1)
    log = run_dir / "logs" / f"comm-node{cluster.node_rank}.log"
    with open(log, "w") as f:
        rc = subprocess.run(torchrun_argv(cluster.nproc_per_node, plan_path, run_dir / "logs" / f"ranks-node{cluster.node_rank}",
                                          "mgbench.comm.worker", cluster=cluster, rdzv_id=f"{run_dir.name}-comm"),
                            stdout=f, stderr=subprocess.STDOUT, env=child_env(cluster.nproc_per_node, device, "comm"),
                            preexec_fn=die_with_parent, timeout=timeout_s).returncode
    if rc != 0:
        raise MgbenchError(f"node {cluster.node_rank}: torchrun exited with {rc}; see {log}")
    return run_dir


def load_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "comm.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def link_peak(manifest: dict[str, Any], link: str | None) -> tuple[float | None, str]:
    """Peak GB/s of the named catalog link, or of the detected one; None with the reason."""
    from ..planner.hardware import links

    if link:
        if link not in links():
            raise MgbenchError(f"--link {link!r}: known links are {', '.join(links())}")
        return float(links()[link]["peak_gbps"]), f"{link} peak from the catalog"
    ic = manifest.get("interconnect", {})
    gpus = ic.get("gpus") or []
    if not gpus:
        return None, "no GPU link detected (CPU ranks over loopback): name one with --link to compare"
    from ..catalog import match_accelerator
    from ..planner.hardware import systems

    acc = match_accelerator(gpus[0]["name"])
    if gpus[0].get("nvlinks_active"):
        sysname = next((k for k, s in systems().items() if s["gpu"] == acc and s["intra_link"].startswith("nvlink")), None)
        if sysname:
            name = systems()[sysname]["intra_link"]
            return float(links()[name]["peak_gbps"]), f"{name} (detected NVLink on {acc})"
    gen = gpus[0].get("pcie_gen")
    name = {4: "pcie4", 5: "pcie5"}.get(gen)
    if name:
        return float(links()[name]["peak_gbps"]), f"{name} (detected PCIe gen {gen})"
    return None, "detected link not in the catalog; name one with --link"


def render(run_dir: Path, link: str | None = None) -> str:
    """nccl-tests-like table per collective, the fits, and % of the link's peak."""
    from tabulate import tabulate

    manifest = store.read_manifest(run_dir)
    rows = load_rows(run_dir)
    fits = json.loads((run_dir / "comm_fit.json").read_text()) if (run_dir / "comm_fit.json").exists() else {}
    peak, why = link_peak(manifest, link)
    out = [f"# {manifest['interconnect']['summary']}", f"# link peak: {peak if peak else '-'} GB/s ({why})"]
    for key in fits:
        coll, dtype, scope = key.split(":")
        sel = [r for r in rows if r["collective"] == coll and r["dtype"] == dtype and r.get("scope", "all") == scope]
        table = [[r["size_bytes"], r["count"], dtype, f"{r['time_s'] * 1e6:.1f}", f"{r['algbw_gbps']:.3f}",
                  f"{r['busbw_gbps']:.3f}", r["wrong"],
                  "-" if not peak else f"{100 * r['busbw_gbps'] / peak:.1f}"] for r in sel]
        where = {"all": "all ranks", "intra": "intra-node groups", "inter": "inter-node groups"}[scope]
        out.append(f"\n{coll} ({sel[0]['nproc'] if sel else '?'} ranks per group, {where})")
        out.append(tabulate(table, headers=["size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                                            "#wrong", "% of link"]))
        f = fits[key]
        if f:
            bw = "not resolvable (time did not grow with size)" if f["bw_gbps"] is None else f"{f['bw_gbps']:.3f} GB/s"
            out.append(f"alpha-beta fit (sizes >= {f['fit_min_bytes']} B): alpha {f['alpha_s'] * 1e6:.1f} us, "
                       f"bandwidth {bw}, mean error {f['fit_mean_abs_error_pct']:.1f}%")
    out.append(f"\n# out of bounds values: {sum(r['wrong'] for r in rows)} (must be 0)")
    return "\n".join(out)
