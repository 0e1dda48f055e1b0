#!/usr/bin/env bash
# Copied from the project's shared notes (../shared/notes/slurm_localhost.sh, the script issue 22's SLURM trial used);
# .ci/run starts it before the tests (tests/test_slurm_*.py, marker slurm).
# A one-node SLURM cluster on localhost, for tests of a SLURM launcher (CI, a laptop, a container).
#
#   bash slurm_localhost.sh          install (Debian's packages), configure, start, check with a test job
#   bash slurm_localhost.sh stop     cancel every job, then stop the daemons this script started (pid files)
#   bash slurm_localhost.sh status   daemons, sinfo, squeue
#
# Run as root on Debian 12 (bookworm; slurm-wlm 22.05) or later. Idempotent: a second run leaves a working
# cluster as it is, starts daemons that died, and restarts them when the slurm.conf it writes has changed.
# Needs no systemd, no cgroups and no network but the package mirror: the daemons are started by hand,
# processes are tracked by /proc (proctrack/linuxproc) and CPUs bound by sched_setaffinity (task/affinity).
#
# Knobs (environment): SLURM_CPUS (default: nproc), SLURM_PARTITION (default: debug),
#   SLURM_ACCOUNTING=1 (also install MariaDB + slurmdbd so that sacct works; off by default: jobs are still
#   recorded one line each in /var/log/slurm/jobcomp.log),
#   SLURM_CRED_EXPIRE (seconds; AuthInfo=cred_expire, which is also how long a requeued job waits before it
#   may start again: SLURM's default 120 when unset; .ci/run sets 10 so that the self-requeue test is quick).
#   This knob is the one change from the shared notes' copy.
set -euo pipefail

CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm
PARTITION=${SLURM_PARTITION:-debug}
ACCOUNTING=${SLURM_ACCOUNTING:-0}
CRED_EXPIRE=${SLURM_CRED_EXPIRE:-}

log() { echo "[slurm_localhost] $*" >&2; }

alive() {  # alive PIDFILE: the pid in it is a running process
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

stop_one() {  # stop_one NAME PIDFILE
    if alive "$2"; then
        local pid; pid=$(cat "$2")
        log "stopping $1 (pid $pid)"
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
    rm -f "$2"
}

case "${1:-start}" in
stop)
    if alive /run/slurmctld.pid; then  # a throwaway cluster: its jobs go with it
        jobs=$(squeue -h -o %A 2>/dev/null | sort -u)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: $(echo $jobs)"
            scancel $jobs || true
            for _ in $(seq 60); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 1; done
        fi
    fi
    stop_one slurmd /run/slurmd.pid
    stop_one slurmctld /run/slurmctld.pid
    stop_one slurmdbd /run/slurmdbd.pid
    stop_one munged /run/munge/munged.pid
    # MariaDB (SLURM_ACCOUNTING=1) is left running only if this script did not start it
    if [[ -s /run/mysqld/slurm_localhost.pid ]]; then stop_one mariadbd /run/mysqld/slurm_localhost.pid; fi
    exit 0 ;;
status)
    for d in munged:/run/munge/munged.pid slurmdbd:/run/slurmdbd.pid slurmctld:/run/slurmctld.pid \
             slurmd:/run/slurmd.pid; do
        alive "${d#*:}" && echo "${d%%:*}: running (pid $(cat "${d#*:}"))" || echo "${d%%:*}: not running"
    done
    sinfo 2>&1 || true; squeue 2>&1 || true
    exit 0 ;;
start) ;;
*) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac

[[ $(id -u) == 0 ]] || { echo "run as root" >&2; exit 1; }

# 1. Packages: the daemons, the client commands and munge (8 packages on a Debian image with Python;
#    the slurm-wlm metapackage would add ~35 more: plugins for IPMI, HDF5, InfluxDB, ... not needed here).
pkgs=(slurmctld slurmd slurm-client munge)
[[ $ACCOUNTING == 1 ]] && pkgs+=(slurmdbd mariadb-server)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if (( ${#missing[@]} )); then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# 2. Munge: a key (the package's postinst makes one; make it if absent) and the daemon, as user munge.
if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null
fi

# 3. slurm.conf: node "localhost" (slurmd is started with -N localhost, so the machine's hostname does not
#    matter), one partition, cons_tres over cores and memory.
CPUS=${SLURM_CPUS:-$(nproc)}
MEM=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
DEFMEM=$(( MEM / CPUS / 2 ))  # per CPU for a job that asks for no memory: half an even share, never the whole node
if [[ $ACCOUNTING == 1 ]]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=10"
else
    acct="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
install -d -o slurm -g slurm -m 0755 "$LOG_DIR" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd"
new_conf=$(cat <<EOF
# One-node cluster on localhost, written by slurm_localhost.sh
ClusterName=localhost
SlurmctldHost=localhost
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge${CRED_EXPIRE:+
AuthInfo=cred_expire=$CRED_EXPIRE}
MpiDefault=none
# no cgroups: processes tracked through /proc, CPUs bound with sched_setaffinity
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$DEFMEM
ReturnToService=2
# completed jobs stay visible in squeue/scontrol for 5 minutes
MinJobAge=300
$acct
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
StateSaveLocation=$STATE_DIR/slurmctld
SlurmdSpoolDir=$STATE_DIR/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=$PARTITION Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
)
changed=0
if [[ ! -f $CONF_DIR/slurm.conf ]] || [[ "$(cat $CONF_DIR/slurm.conf)" != "$new_conf" ]]; then
    printf '%s\n' "$new_conf" > "$CONF_DIR/slurm.conf"
    chmod 0644 "$CONF_DIR/slurm.conf"
    changed=1
fi

# 4. Accounting (optional): MariaDB + slurmdbd, so that sacct answers.
if [[ $ACCOUNTING == 1 ]]; then
    if ! mysqladmin ping >/dev/null 2>&1; then
        log "starting mariadbd"
        install -d -o mysql -g mysql /run/mysqld
        setsid -f mariadbd --user=mysql --pid-file=/run/mysqld/slurm_localhost.pid </dev/null >>"$LOG_DIR/mariadb.log" 2>&1
        for _ in $(seq 100); do mysqladmin ping >/dev/null 2>&1 && break; sleep 0.2; done
    fi
    mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
    cat > "$CONF_DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=/run/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
EOF
    chown slurm:slurm "$CONF_DIR/slurmdbd.conf"; chmod 0600 "$CONF_DIR/slurmdbd.conf"
    if ! alive /run/slurmdbd.pid; then
        log "starting slurmdbd"
        slurmdbd
        for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
    fi
    sacctmgr -i -n list cluster format=cluster | grep -qw localhost || sacctmgr -i add cluster localhost >/dev/null
fi

# 5. The daemons. slurmctld drops to SlurmUser itself; slurmd runs as root.
if (( changed )) && { alive /run/slurmctld.pid || alive /run/slurmd.pid; }; then
    # some settings (accounting, plugins) take effect only at a start: restart rather than `scontrol reconfigure`
    log "slurm.conf changed: restarting the daemons (running jobs survive)"
    stop_one slurmd /run/slurmd.pid
    stop_one slurmctld /run/slurmctld.pid
fi
if ! alive /run/slurmctld.pid; then
    log "starting slurmctld"
    slurmctld
fi
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.2; done
scontrol ping | grep -q "is UP" || { tail -20 "$LOG_DIR/slurmctld.log" >&2; exit 1; }
if ! alive /run/slurmd.pid; then
    log "starting slurmd"
    slurmd -N localhost
fi
for _ in $(seq 100); do
    state=$(sinfo -h -n localhost -o %T 2>/dev/null | head -1)
    [[ $state == idle* || $state == mixed* || $state == allocated* ]] && break
    sleep 0.2
done
case $state in
    down*|drain*) log "node is $state: resuming it"; scontrol update nodename=localhost state=resume ;;
esac

# 6. Check: a job runs and finishes.
out=$(timeout 120 srun -N1 -n1 -t 1 -J slurm_localhost_check hostname 2>&1) || { echo "$out" >&2; tail -20 "$LOG_DIR/slurmd.log" >&2; exit 1; }
log "ready: partition $PARTITION, node localhost ($CPUS CPUs, $MEM MB); srun ran on '$out'"
sinfo
