#!/usr/bin/env bash
# One short GPU lease's program, run from the repository root on the GPU machine:
#
#   bash tests/gpu/lease.sh OUTDIR            # about 5 minutes on one H200 (2026-11-27)
#   DEVICE=cpu bash tests/gpu/lease.sh /tmp/x # the same steps on CPU ranks: the plumbing
#
# Steps, each under its own time cap and all under one deadline (LEASE_S, default 520 s),
# so that one that hangs or fails costs only its own figures and the archive is still
# written: the machine's facts; kernel rates (tests/gpu/kernel_rates.py); the selftest
# (python -m mgbench.selftest: NCCL at one rank, NVML energy, CUDA memory peaks, MFU,
# compile, fp16 scaling, FSDP2, comm copies); the gpu-quick suite (Llama-1B shape, the
# best MFU); `mgbench probe` (a hardware profile for predict --hardware). Everything lands
# in OUTDIR: lease.log, env.txt, kernels.json, probe.json and results.tgz (the run
# folders). mgbench need not be installed: the repository is put on PYTHONPATH, so the
# machine's own python3 and torch run it (no plotly needed: no report is written there).
set -u
out=${1:?usage: bash tests/gpu/lease.sh OUTDIR}
mkdir -p "$out"
device=${DEVICE:-cuda}
py=${PYTHON:-python3}
results=${LEASE_RESULTS:-/tmp/lease-results}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${LEASE_S:-520}))
log="$out/lease.log"

step() {  # step NAME CAP_S COMMAND...: run under min(CAP_S, what the deadline leaves), logged
    local name=$1 cap=$2 left
    shift 2
    left=$((deadline - SECONDS - 15))  # 15 s kept for the archive
    [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 10 ]; then
        echo "=== $name: skipped, the lease's deadline is near" | tee -a "$log"
        return
    fi
    echo "=== $name (cap ${cap} s) at $(date +%T)" | tee -a "$log"
    local t0=$SECONDS
    timeout -k 10 "$cap" "$@" 2>&1 | tee -a "$log"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$log"
}

{ date -u; echo "commit ${LEASE_SHA:-unknown}"; nvidia-smi 2>&1 | head -20
  "$py" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda,
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no cuda")'
  "$py" -m pip list 2>/dev/null | grep -i -E '^(torch|pandas|click|tabulate|nvidia-ml-py|plotly|numpy|triton) '
} > "$out/env.txt" 2>&1
cat "$out/env.txt" >> "$log"
if [ "$device" = cpu ]; then
    step kernels 60 "$py" tests/gpu/kernel_rates.py --device cpu --small -o "$out/kernels.json"
    step selftest 200 "$py" -m mgbench.selftest --device cpu --results-dir "$results"
    step mfu 120 "$py" -m mgbench.cli run suites/gpu-quick.toml --device cpu --set model=tiny --set seq_len=32 \
        --set micro_batch=2 --set precision=fp32 --set measured_steps=4 --run-id "lease-quick-$(date +%Y%m%d-%H%M%S)" \
        --results-dir "$results" --no-report --no-projection
    step probe 120 "$py" -m mgbench.cli probe --device cpu --max-ranks 1 --no-comm -o "$out/probe.json"
else
    step kernels 100 "$py" tests/gpu/kernel_rates.py -o "$out/kernels.json"
    step selftest 260 "$py" -m mgbench.selftest --results-dir "$results"
    step mfu 200 "$py" -m mgbench.cli run suites/gpu-quick.toml --run-id "lease-quick-$(date +%Y%m%d-%H%M%S)" --results-dir "$results" \
        --no-report --no-projection
    step probe 90 "$py" -m mgbench.cli probe --no-comm -o "$out/probe.json"
fi
tar czf "$out/results.tgz" -C "$(dirname "$results")" "$(basename "$results")" 2>&1 | tee -a "$log"
ls -la "$out" | tee -a "$log"
