"""`mgbench comm`: launch the collective sweep through torchrun and store it as a run."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from .. import catalog, store
from ..collectives import DTYPES, NAMES
from ..store import load_comm_fits, load_comm_rows
from ..errors import MgbenchError
from ..launching import SHARED_FS_WAIT_S, Cluster, child_env, torchrun_argv
from ..procs import die_with_parent, kill_tree, sigterm_raises
from ..store import RunDir
from ..telemetry.interconnect import detect
from ..telemetry.machine import fingerprint
from . import copies
from .fit import fit

JOB_TAG = "comm"  # the one torchrun job of a comm run: jobs/comm.json, logs/comm.log, logs/comm/

# Defaults sized for the backend: loopback gloo moves a few GB/s, NVLink hundreds.
DEFAULTS = {
    "cpu": {"min_bytes": 4 * 1024, "max_bytes": 4 * 2**20, "factor": 2, "warmup": 5, "iters": 50},
    "cuda": {"min_bytes": 8 * 1024, "max_bytes": 1 * 2**30, "factor": 4, "warmup": 5, "iters": 20},
}



CPU_DEFAULT_NPROC = 2  # gloo over loopback: two ranks show every collective at work


def default_nproc(device: str, count: int) -> int:
    """Ranks when --nproc is not given: every GPU present (one GPU: copies only), or two
    CPU ranks (at most ``count``)."""
    return count if device == "cuda" else min(CPU_DEFAULT_NPROC, count)


def run_comm(nproc: int, device: str, collectives: list[str], dtypes: list[str], results_dir: str,
             run_id: str | None = None, timeout_s: int = 600, progress: Callable[[str], None] = print,
             cluster: Cluster | None = None, **overrides: Any) -> Path:
    """Run the sweep; returns the run folder holding comm.jsonl and comm_fit.json. With
    ``cluster`` (every node calls this), measurements are also split into intra-node and
    inter-node groups."""
    for c in collectives:
        if c not in NAMES:
            raise MgbenchError(f"--collectives: unknown {c!r}; choose from {', '.join(NAMES)}")
    for d in dtypes:  # a name the worker does not know is said as such, before what gloo can reduce
        if d not in DTYPES:
            raise MgbenchError(f"--dtype: unknown dtype {d!r}; one of {', '.join(DTYPES)}")
    if device == "cpu" and any(d != "float32" for d in dtypes):
        raise MgbenchError("--dtype: gloo reduces only float32 on CPU; use --dtype float32")
    sweep = {**DEFAULTS[device], **{k: v for k, v in overrides.items() if v is not None}}
    if sweep["min_bytes"] < 1 or sweep["max_bytes"] < sweep["min_bytes"] or sweep["factor"] < 2:
        raise MgbenchError("need 1 <= --min-bytes <= --max-bytes and --factor >= 2")
    world = nproc if cluster is None else cluster.world
    if device == "cpu" and world < 2:
        raise MgbenchError(f"--nproc {nproc}: on CPU, collectives need 2 or more ranks and copy bandwidth needs a "
                           "GPU, so one rank measures nothing; use --nproc 2")
    if cluster is not None and not cluster.leader:
        return _follow_comm(cluster, RunDir(Path(results_dir) / str(run_id)), device, timeout_s)
    run_id = run_id or store.new_run_id(f"comm-n{nproc}")
    run_dir = RunDir.create(results_dir, run_id)
    manifest = {"run_id": run_id, "kind": "comm", "status": "running",
                "started_at": dt.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv,
                "pid": os.getpid(),  # `mgbench status` tells a killed sweep from a running one
                "suite": {"name": "comm", "description": "collective microbenchmarks", "text": "", "sha256": ""},
                "machine": fingerprint(), "interconnect": detect(),
                "comm": {"nproc": world, "device": device, "collectives": collectives if world > 1 else [],
                         "dtypes": dtypes, "copies": list(copies.COPIES) if device == "cuda" else [], **sweep}}
    if world < 2:
        manifest["comm"]["collectives_reason"] = ("one rank: a collective moves nothing between devices (its busbw "
                                                  "would read 0); run on 2 or more GPUs to measure them")
    if device != "cuda":
        manifest["comm"]["copies_reason"] = copies.NOT_APPLICABLE
    if cluster is not None:
        manifest["cluster"] = cluster.manifest_entry()
    store.write_manifest(run_dir, manifest)
    job = run_dir.job(JOB_TAG)
    store.write_json_atomic(job, {"run_dir": str(run_dir.path.resolve()), "device": device,
                                  "collectives": manifest["comm"]["collectives"], "dtypes": dtypes,
                                  "copies": manifest["comm"]["copies"], **sweep})
    what = manifest["comm"]["collectives"] + (["copies"] if manifest["comm"]["copies"] else [])
    progress(f"{', '.join(what)} on {nproc} {device} rank(s), {sweep['min_bytes']} to {sweep['max_bytes']} bytes")
    log = run_dir.job_log(JOB_TAG)
    with open(log, "w") as f:
        proc = subprocess.Popen(torchrun_argv(nproc, job, run_dir.rank_logs(JOB_TAG), "mgbench.comm.worker",
                                              cluster=cluster, rdzv_id=f"{run_id}-comm"),
                                stdout=f, stderr=subprocess.STDOUT, env=child_env(nproc, device, "comm"),
                                start_new_session=True, preexec_fn=die_with_parent)
        interrupted = False
        with sigterm_raises(KeyboardInterrupt):  # a terminated sweep is recorded as interrupted
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid)
                rc = None
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the rows so far are kept, the run says so
                kill_tree(proc.pid)
                rc, interrupted = None, True
    rows = load_comm_rows(run_dir)
    fits = {}
    for key in sorted({(r["collective"], r["dtype"], r.get("scope", "all")) for r in rows}):
        fits[":".join(key)] = fit([r for r in rows if (r["collective"], r["dtype"], r.get("scope", "all")) == key])
    store.write_json_atomic(run_dir.comm_fit, fits)
    status = "interrupted" if interrupted else "complete" if rc == 0 else ("timeout" if rc is None else "error")
    manifest.update(status=status, finished_at=dt.datetime.now().isoformat(timespec="seconds"),
                    counts={"rows": len(rows), "wrong": sum(r["wrong"] for r in rows)})
    store.write_manifest(run_dir, manifest)
    if interrupted:
        raise KeyboardInterrupt  # `mgbench: interrupted`, exit 130, as `mgbench run`
    if status != "complete":
        why = rank_error(run_dir.rank_stderrs(JOB_TAG)) or " | ".join(log.read_text(errors="replace").splitlines()[-3:])
        raise MgbenchError(f"mgbench comm {status} (results so far in {run_dir}; logs in {log.parent}): {why[-400:]}")
    return run_dir.path


def rank_error(stderrs: dict[int, Path]) -> str | None:
    """The exception a rank died of (torchrun's own summary names no cause: "error_file:
    <N/A>"): the first traceback's closing exception line in a rank's stderr (``stderrs``:
    RunDir.rank_stderrs, by rank); teardown noise ("Exception ignored in ...") after it
    is not the cause. None where no rank wrote a traceback."""
    from ..runner.command import EXCEPTION_LINE

    for rank, f in sorted(stderrs.items()):
        in_tb = False
        for ln in f.read_text(errors="replace").splitlines():
            if ln.startswith("Traceback (most recent call last)"):
                in_tb = True
            elif in_tb and not ln.startswith((" ", "\t")) and EXCEPTION_LINE.search(ln):
                return f"rank {rank}: {ln.strip()}"
    return None


def _follow_comm(cluster: Cluster, run_dir: RunDir, device: str, timeout_s: int) -> Path:
    """A follower node: wait for the leader's job file on the shared filesystem, then run
    this node's torchrun agent."""
    import time

    job = run_dir.job(JOB_TAG)
    t0 = time.monotonic()
    while not job.exists():
        if time.monotonic() - t0 > SHARED_FS_WAIT_S:
            raise MgbenchError(f"node {cluster.node_rank}: {job} did not appear: --results-dir must be shared")
        time.sleep(1)
    tag = f"{JOB_TAG}-node{cluster.node_rank}"  # this node's own logs beside the leader's
    log = run_dir.job_log(tag)
    with open(log, "w") as f:
        rc = subprocess.run(torchrun_argv(cluster.nproc_per_node, job, run_dir.rank_logs(tag),
                                          "mgbench.comm.worker", cluster=cluster, rdzv_id=f"{run_dir.name}-comm"),
                            stdout=f, stderr=subprocess.STDOUT, env=child_env(cluster.nproc_per_node, device, "comm"),
                            preexec_fn=die_with_parent, timeout=timeout_s).returncode
    if rc != 0:
        raise MgbenchError(f"node {cluster.node_rank}: torchrun exited with {rc}; see {log}")
    return run_dir.path


def check_link(link: str) -> str:
    """A catalog link name for --link (MgbenchError listing the known ones otherwise):
    checked before the sweep, so a typo costs no measuring."""
    if link not in catalog.links():
        raise MgbenchError(f"--link {link!r}: known links are {', '.join(catalog.links())}")
    return link


def link_peak(manifest: dict[str, Any], link: str | None) -> tuple[float | None, str]:
    """Peak GB/s of the named catalog link, or of the detected one; None with the reason."""
    if link:
        check_link(link)
        return float(catalog.links()[link]["peak_gbps"]), f"{link} peak from the catalog"
    ic = manifest.get("interconnect", {})
    gpus = ic.get("gpus") or []
    if not gpus:
        return None, "no GPU link detected (CPU ranks over loopback): name one with --link to compare"
    acc = catalog.match_accelerator(gpus[0]["name"])
    if gpus[0].get("nvlinks_active"):
        sysname = next((k for k, s in catalog.systems().items()
                        if s["gpu"] == acc and s["intra_link"].startswith("nvlink")), None)
        if sysname:
            name = catalog.systems()[sysname]["intra_link"]
            return float(catalog.links()[name]["peak_gbps"]), f"{name} (detected NVLink on {acc})"
    return pcie_peak(gpus[0])


def pcie_peak(gpu: dict[str, Any]) -> tuple[float | None, str]:
    """Peak GB/s per direction of a GPU's PCIe link at its maximum generation and width
    (the current ones idle low: Gen1 on an idle H100), scaled from the catalog's x16
    figure; None with the reason."""
    gen, width = gpu.get("pcie_gen_max"), gpu.get("pcie_width_max")
    if gen is None or width is None:
        return None, ("no maximum PCIe generation and width recorded (a run folder from before they were kept "
                      "has only the current link, which idles at Gen1): name one with --link")
    name = {4: "pcie4", 5: "pcie5"}.get(gen)
    if name is None:
        return None, f"detected PCIe gen {gen} x{width} is not in the catalog; name a link with --link"
    return (float(catalog.links()[name]["peak_gbps"]) * width / 16,
            f"{name} at x{width} (the link's maximum; detected PCIe gen {gen} x{width})")


def render(run_dir: Path, link: str | None = None) -> str:
    """nccl-tests-like table per collective, the fits, and % of the link's peak."""
    from tabulate import tabulate

    manifest = store.read_manifest(run_dir)
    rows = load_comm_rows(run_dir)
    fits = load_comm_fits(run_dir)
    peak, why = link_peak(manifest, link)
    out = [f"# {manifest['interconnect']['summary']}", f"# link peak: {peak if peak else '-'} GB/s ({why})"]
    sweep = manifest.get("comm") or {}
    if sweep.get("collectives_reason"):
        out.append(f"# collectives: none measured ({sweep['collectives_reason']})")
    copy_names = set(copies.COPIES)
    for key in fits:
        coll, dtype, scope = key.split(":")
        if coll in copy_names:
            continue
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
    out.extend(render_copies(manifest, [r for r in rows if copies.is_copy(r)], fits))
    out.append(f"\n# out of bounds values: {sum(r['wrong'] for r in rows)} (must be 0)")
    return "\n".join(out)


def render_copies(manifest: dict[str, Any], rows: list[dict[str, Any]], fits: dict[str, Any]) -> list[str]:
    """The copy bandwidth table (rank 0's GPU), host copies against the PCIe link's peak;
    or why there is none."""
    from tabulate import tabulate

    reason = (manifest.get("comm") or {}).get("copies_reason")
    if not rows:
        return [f"\n# copy bandwidth: {reason or 'not measured in this run'}"]
    gpus = (manifest.get("interconnect") or {}).get("gpus") or []
    peak, why = pcie_peak(gpus[0]) if gpus else (None, "no GPU recorded")
    out = [f"\ncopy bandwidth (rank 0's GPU; GB/s = bytes copied / s; host copies against PCIe peak "
           f"{f'{peak:.1f} GB/s' if peak else '-'}: {why})"]
    table = []
    for name in copies.COPIES:
        for r in sorted((r for r in rows if r["collective"] == name), key=lambda r: r["size_bytes"]):
            host = copies.COPIES[name].src != copies.COPIES[name].dst
            table.append([name, r["size_bytes"], f"{r['time_s'] * 1e6:.1f}", f"{r['algbw_gbps']:.3f}", r["wrong"],
                          f"{100 * r['algbw_gbps'] / peak:.1f}" if host and peak else "-"])
    out.append(tabulate(table, headers=["copy", "size(B)", "time(us)", "GB/s", "#wrong", "% of PCIe"]))
    for name in copies.COPIES:
        f = fits.get(f"{name}:uint8:local")
        if f and f.get("bw_gbps"):
            out.append(f"{name}: alpha-beta fit alpha {f['alpha_s'] * 1e6:.1f} us, bandwidth {f['bw_gbps']:.3f} GB/s")
    return out
