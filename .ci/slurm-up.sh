#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine (munged, slurmctld, slurmd) for the
# `mgbench slurm --submit` test. Needs root and Debian's slurm-wlm and munge packages.
set -euo pipefail
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))

mkdir -p /etc/munge /var/log/munge /run/munge /var/lib/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /etc/munge /var/log/munge /run/munge /var/lib/munge 2>/dev/null || true
chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged || /usr/sbin/munged --force

mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=mgbench-ci
SlurmctldHost=${host}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=${host} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
CONF
rm -f /etc/slurm/cgroup.conf  # Slurm 22.05 has no "disabled" cgroup plugin; the defaults work here
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 1 30); do
  if sinfo -h -o %T 2>/dev/null | grep -Eq '^(idle|mix)'; then
    sinfo
    exit 0
  fi
  scontrol update nodename="${host}" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm-up: no idle node after 30 s" >&2
sinfo || true
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log 2>/dev/null || true
exit 1
