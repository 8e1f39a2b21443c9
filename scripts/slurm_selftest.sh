#!/usr/bin/env bash
# Submit slurm/train.sbatch to a real, throw-away one-node Slurm and check the result.
#
#   bash scripts/slurm_selftest.sh          (as root; installs slurm + munge from Debian if missing)
#
# 1. installs slurmctld/slurmd/munge if missing, writes a slurm.conf into a scratch folder,
#    starts munged, slurmctld and slurmd (foreground mode, pids kept);
# 2. submits a short 2-task training job with `sbatch --wait` under `timeout` and checks that
#    it succeeded and wrote metrics.jsonl and its per-job log into the workspace;
# 3. submits a job with a broken configuration and checks that it fails and that its error
#    output is reported;
#    with the mpich wheel, checks that SINGA_LAUNCHER=srun is refused in one line;
#    with Open MPI installed (Debian's openmpi-bin), runs the training job under its mpiexec and
#    under srun --mpi=pmix;
# 4. preemption: signals a running job with SIGUSR1 (what `#SBATCH --signal` sends before the
#    time limit), checks that it checkpoints, is requeued, resumes and finishes; with Open MPI, the
#    same with SIGTERM (which the script must pass on to Open MPI's mpiexec as SIGUSR1);
# 5. self-healing: a 3-task job under the supervisor (SINGA_ELASTIC=1), one rank killed with SIGKILL;
#    checks that it restarts once on the 2 survivors and completes within the allocation, and with
#    --min-ranks 3 that it requeues itself and resumes on 3 tasks;
# 6. runs the README's benchmark campaign (slurm/bench_campaign.sh --wait: the 1- and 2-rank arrays and
#    the collecting job) and checks that it prints speed-ups;
# 7. stops exactly the daemons it started (also on failure or Ctrl-C).
# Every wait is bounded; the whole run takes under three minutes (159-165 s on a 2-core VM, 2026-11-30;
# the Open MPI preemption takes 31 s of it: Open MPI's mpirun waits odls_base_sigkill_timeout, 10 s in
# slurm/train.sbatch, twice after the ranks exit 75, and the benchmark campaign 44 s).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${SINGA_PYTHON:-$(command -v python3)}
SCRATCH=$(mktemp -d /tmp/singa-slurm.XXXXXX)
PIDS=()
say() { echo "slurm-selftest: $*"; }

cleanup() {
  local code=$?
  if command -v scancel >/dev/null && [ -f "$SCRATCH/slurm.conf" ]; then
    export SLURM_CONF=$SCRATCH/slurm.conf
    timeout 10 scancel --user=root >/dev/null 2>&1 || true
    for _ in $(seq 1 50); do  # let job steps (slurmstepd) finish before their daemons go
      [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && ! pgrep -x slurmstepd >/dev/null && break
      sleep 0.2
    done
  fi
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.2
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$SCRATCH"
  exit "$code"
}
trap cleanup EXIT INT TERM

# --------------------------------------------------------------- install
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  say "installing slurm and munge from Debian"
  export DEBIAN_FRONTEND=noninteractive
  # refuse service starts during install (hosts with systemd would start the daemons)
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d.singa && chmod +x /usr/sbin/policy-rc.d.singa
  [ -e /usr/sbin/policy-rc.d ] || ln -s /usr/sbin/policy-rc.d.singa /usr/sbin/policy-rc.d
  timeout 300 apt-get update -qq
  timeout 300 apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  [ -L /usr/sbin/policy-rc.d ] && [ "$(readlink /usr/sbin/policy-rc.d)" = /usr/sbin/policy-rc.d.singa ] && rm -f /usr/sbin/policy-rc.d
  rm -f /usr/sbin/policy-rc.d.singa
fi

# Debian's Slurm pmix plugin dlopens the unversioned libpmix.so by its build-time path, which only
# libpmix-dev ships: without it `srun --mpi=pmix` fails with "can not load PMIx library" before any
# Python runs (Open MPI's ranks under SINGA_LAUNCHER=srun need that plugin)
PMIX_SO=/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so
if [ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] && [ ! -e "$PMIX_SO" ]; then
  say "installing libpmix-dev (Slurm's pmix plugin loads $PMIX_SO)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get install -y -qq --no-install-recommends libpmix-dev >/dev/null || \
    { timeout 300 apt-get update -qq && \
      timeout 300 apt-get install -y -qq --no-install-recommends libpmix-dev >/dev/null; }
fi

# --------------------------------------------------------------- configure
HOST=$(hostname -s)
getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >> /etc/hosts
# 4 CPUs on a 2-core machine (config_overrides) so that 2- and 4-task jobs can run
NODE_LINE="NodeName=$HOST CPUs=4 State=UNKNOWN"
mkdir -p "$SCRATCH/state" "$SCRATCH/spool"
cat > "$SCRATCH/slurm.conf" <<CONF
ClusterName=singaselftest
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$SCRATCH/state
SlurmdSpoolDir=$SCRATCH/spool
SlurmctldPidFile=$SCRATCH/slurmctld.pid
SlurmdPidFile=$SCRATCH/slurmd.pid
SlurmctldLogFile=$SCRATCH/slurmctld.log
SlurmdLogFile=$SCRATCH/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
MpiDefault=pmi2
EnforcePartLimits=ALL
ReturnToService=2
KillWait=5
SlurmdParameters=config_overrides
$NODE_LINE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$SCRATCH/slurm.conf

# --------------------------------------------------------------- start daemons
if ! (munge -n | unmunge) >/dev/null 2>&1; then
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
  # setpriv execs munged itself, so $! is the daemon's own pid
  setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground >"$SCRATCH/munged.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 50); do (munge -n | unmunge) >/dev/null 2>&1 && break; sleep 0.1; done
fi
(munge -n | unmunge) >/dev/null 2>&1 || { say "munged did not start"; exit 1; }
slurmctld -D -i -f "$SLURM_CONF" >"$SCRATCH/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" >"$SCRATCH/slurmd.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
  if timeout 5 scontrol ping 2>/dev/null | grep -q UP && [ "$(timeout 5 sinfo -h -N -o %T 2>/dev/null)" = idle ]; then
    break
  fi
  sleep 0.3
done
[ "$(timeout 5 sinfo -h -N -o %T 2>/dev/null)" = idle ] || { say "slurm did not come up"; tail -20 "$SCRATCH"/*.log; exit 1; }
say "slurm is up on $HOST (daemon pids ${PIDS[*]})"

# --------------------------------------------------------------- a short training job
WORK=$SCRATCH/work
mkdir -p "$WORK"
"$PY" - "$WORK" <<'PYTHON'
import sys
sys.path.insert(0, "tests")
import nets
work = sys.argv[1]
data = nets.make_data(f"{work}/data.h5", 256, (12,), 5)
text = nets.mlp(data, 32, "data").replace("train_steps: 20", "train_steps: 30").replace("disp_freq: 1", "disp_freq: 10")
open(f"{work}/good.conf", "w").write(text + "\ncluster { nworkers_per_group: 2 }\n")
open(f"{work}/bad.conf", "w").write(text.replace("num_output: 16", "num_output: 0"))
# wide enough that 2000 steps take several seconds: the signal must find the job running
long = (text.replace("train_steps: 30", "train_steps: 2000").replace("disp_freq: 10", "disp_freq: 20")
        .replace("num_output: 16", "num_output: 1024").replace("num_output: 10 ", "num_output: 512 "))
open(f"{work}/long.conf", "w").write(long + "\ncluster { nworkers_per_group: 2 }\n")
# the same with a checkpoint every 200 steps: what a healed job resumes from
open(f"{work}/elastic.conf", "w").write(long.replace("train_steps: 2000", "train_steps: 2000\ncheckpoint_freq: 200"))
PYTHON

wait_idle() {  # until the previous job's steps are gone: proctrack/linuxproc may otherwise
  # take a new job's processes for the old step's and kill them during its cleanup
  for _ in $(seq 1 100); do pgrep -x slurmstepd >/dev/null || return 0; sleep 0.2; done
}

# up to 30 s for COUNT train lines in WORK/ws-NAME/metrics.jsonl (the job is training: time to signal it)
wait_for_train_lines() {
  local name=$1 count=$2
  for _ in $(seq 1 300); do
    [ -f "$WORK/ws-$name/metrics.jsonl" ] && [ "$(grep -c train "$WORK/ws-$name/metrics.jsonl")" -ge "$count" ] && break
    sleep 0.1
  done
}

submit() {  # name conf -> prints the job's exit status line; output stays in $WORK
  wait_idle
  local name=$1 conf=$2
  (cd "$ROOT" && SINGA_PYTHON=$PY SINGA_WORKSPACE=$WORK/ws-$name timeout 150 \
     sbatch --wait --parsable --ntasks=2 --time=00:05:00 --job-name="selftest-$name" \
            --output="$WORK/$name-%j.out" slurm/train.sbatch "$conf")
}

say "submitting a 2-task training job"
set +e
JOBID=$(submit good "$WORK/good.conf"); status=$?
set -e
if [ "$status" -ne 0 ]; then
  say "FAILED: the training job (id ${JOBID:-?}) exited with status $status; its output:"
  cat "$WORK"/good-*.out "$WORK"/ws-good/slurm-*.log 2>/dev/null | tail -40
  exit 1
fi
grep -q '"phase": "train"' "$WORK/ws-good/metrics.jsonl" || { say "FAILED: no metrics written"; exit 1; }
ls "$WORK/ws-good/slurm-$JOBID.log" >/dev/null || { say "FAILED: no per-job log in the workspace"; exit 1; }
say "training job $JOBID succeeded: $(grep -c '"phase": "train"' "$WORK/ws-good/metrics.jsonl") metric lines"

say "submitting a job with a broken configuration (must fail, not hang)"
set +e
JOBID=$(submit bad "$WORK/bad.conf"); status=$?
set -e
if [ "$status" -eq 0 ]; then
  say "FAILED: the broken job $JOBID succeeded"
  exit 1
fi
say "broken job ${JOBID:-?} failed as it should (status $status); its error output:"
error=$(cat "$WORK"/bad-*.out "$WORK"/ws-bad/slurm-*.log 2>/dev/null | grep -m 1 "singa-mpi: error" || true)
echo "    $error"
case "$error" in
  *num_output*) ;;
  *) say "FAILED: the error output does not name the bad field"; exit 1 ;;
esac
if [ -z "${MPI4PY_LIBMPI:-}" ] && "$PY" -c "import importlib.metadata as m; m.version('mpich')" 2>/dev/null; then
  say "SINGA_LAUNCHER=srun with the mpich wheel (srun's PMI-2 fails with it): must be refused in one line"
  wait_idle
  set +e
  JOBID=$(cd "$ROOT" && SINGA_LAUNCHER=srun SINGA_PYTHON=$PY SINGA_WORKSPACE=$WORK/ws-srun timeout 150 \
    sbatch --wait --parsable --ntasks=2 --time=00:05:00 --job-name=selftest-srun \
           --output="$WORK/srun-%j.out" slurm/train.sbatch "$WORK/good.conf"); status=$?
  set -e
  refusal=$(grep -h "SINGA_LAUNCHER=srun" "$WORK"/srun-*.out 2>/dev/null || true)
  if [ "$status" -eq 0 ] || [ "$(grep -c . <<<"$refusal")" -ne 1 ] || [ -e "$WORK/ws-srun/metrics.jsonl" ]; then
    say "FAILED: SINGA_LAUNCHER=srun was not refused in one line (status $status):"
    cat "$WORK"/srun-*.out 2>/dev/null | tail -10
    exit 1
  fi
  say "srun job ${JOBID:-?} refused (status $status): $refusal"
fi
if command -v mpirun.openmpi >/dev/null 2>&1 && [ -z "${SELFTEST_NO_OPENMPI:-}" ]; then
  # the same job with Open MPI: its mpiexec first on PATH, mpi4py pointed at its library (as a site
  # module would set them), root and oversubscription allowed through Open MPI's own variables
  mkdir -p "$SCRATCH/openmpi-bin" && ln -sf "$(command -v mpirun.openmpi)" "$SCRATCH/openmpi-bin/mpiexec"
  OPENMPI_ENV=$("$PY" -c "from singa_mpi.communication.launchers import find_launcher
print(' '.join(f'{k}={v}' for k, v in find_launcher('openmpi').variables))")
  trains() {  # name what [VAR=value ...]: the good job with that environment must train
    local name=$1 what=$2 status
    shift 2
    say "submitting the 2-task training job $what"
    wait_idle
    set +e
    JOBID=$(cd "$ROOT" && env "$@" SINGA_PYTHON="$PY" SINGA_WORKSPACE="$WORK/ws-$name" timeout 150 \
      sbatch --wait --parsable --ntasks=2 --time=00:05:00 --job-name="selftest-$name" \
      --output="$WORK/$name-%j.out" slurm/train.sbatch "$WORK/good.conf"); status=$?
    set -e
    if [ "$status" -ne 0 ] || ! grep -q '"phase": "train"' "$WORK/ws-$name/metrics.jsonl" 2>/dev/null; then
      say "FAILED: the job $what (id ${JOBID:-?}) exited with status $status; its output:"
      cat "$WORK"/"$name"-*.out "$WORK"/ws-"$name"/slurm-*.log 2>/dev/null | tail -30
      exit 1
    fi
    say "job $JOBID $what succeeded: $(grep -c '"phase": "train"' "$WORK/ws-$name/metrics.jsonl") metric lines"
  }
  # shellcheck disable=SC2086
  trains openmpi "under Open MPI's mpiexec" $OPENMPI_ENV PATH="$SCRATCH/openmpi-bin:$PATH" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  # shellcheck disable=SC2086
  trains osrun "under Open MPI with SINGA_LAUNCHER=srun (srun --mpi=pmix)" $OPENMPI_ENV SINGA_LAUNCHER=srun
fi
follow_job() {  # seconds: until job $JOBID ends (bounded), setting the caller's `state` and `restarts`
  state="" restarts=0
  for _ in $(seq 1 $(($1 * 10))); do
    state=$(timeout 5 scontrol show job "$JOBID" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
    restarts=$(timeout 5 scontrol show job "$JOBID" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
    case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return ;; esac
    if [ "$state" = PENDING ] && [ "${restarts:-0}" -ge 1 ] && ! pgrep -x slurmstepd >/dev/null; then
      # Slurm holds a requeued job back (BeginTime) for a while; the test has no time to wait.  But not
      # before the last run's steps are gone (Open MPI's daemons run as a step of their own): with
      # proctrack/linuxproc their clean-up could take the new run's processes for theirs (wait_idle)
      timeout 5 scontrol update JobId="$JOBID" StartTime=now >/dev/null 2>&1 || true
    fi
    sleep 0.1
  done
}
preempt() {  # name signal [VAR=value ...]: a long job signalled (to its batch shell) while it trains
  local name=$1 sig=$2
  shift 2
  say "preemption ($name): submitting a long job, then signalling it with SIG$sig"
  wait_idle
  JOBID=$(cd "$ROOT" && env "$@" SINGA_PYTHON="$PY" SINGA_WORKSPACE="$WORK/ws-$name" timeout 30 \
    sbatch --parsable --ntasks=2 --time=00:05:00 --job-name="selftest-$name" --output="$WORK/$name-%j.out" \
           slurm/train.sbatch "$WORK/long.conf")
  wait_for_train_lines "$name" 5
  timeout 10 scancel --signal="$sig" --batch "$JOBID" || {
    say "FAILED: could not signal job $JOBID (it ended before training got going?)"
    cat "$WORK"/"$name"-*.out "$WORK"/ws-"$name"/slurm-*.log 2>/dev/null | tail -20
    exit 1
  }
  local state restarts
  follow_job 60
  local log
  log=$(cat "$WORK"/ws-"$name"/slurm-*.log 2>/dev/null)
  if [ "$state" != COMPLETED ] || [ "${restarts:-0}" -lt 1 ]; then
    say "FAILED: the preempted job ended in state '${state:-unknown}' after ${restarts:-0} restart(s); its log:"
    echo "$log" | tail -30
    say "its Slurm output:"
    tail -30 "$WORK"/"$name"-*.out 2>/dev/null
    timeout 10 scancel "$JOBID" 2>/dev/null || true
    exit 1
  fi
  grep -q "stopped on a signal after [0-9]* steps" <<<"$log" || { say "FAILED: no checkpoint on the signal"; exit 1; }
  grep -q "resuming from" <<<"$log" || { say "FAILED: the requeued job did not resume"; exit 1; }
  say "preempted job $JOBID ($name) checkpointed, was requeued ($restarts restart), resumed and completed"
}

preempt long USR1 SINGA_LAUNCHER=mpiexec  # what `#SBATCH --signal=B:USR1@120` sends before the time limit
if [ -n "${OPENMPI_ENV:-}" ]; then
  # Open MPI's mpiexec kills the ranks a second after a SIGTERM: the script must pass it on as SIGUSR1
  # shellcheck disable=SC2086
  preempt long-openmpi TERM $OPENMPI_ENV PATH="$SCRATCH/openmpi-bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  # and under srun, which forwards a SIGTERM to the tasks itself
  # shellcheck disable=SC2086
  preempt long-osrun TERM $OPENMPI_ENV SINGA_LAUNCHER=srun
fi
# --------------------------------------------------------------- a killed rank heals (SINGA_ELASTIC)
elastic() {  # name "supervisor options" expectation: a 3-task elastic job whose rank 1 is SIGKILLed as it trains
  local name=$1 options=$2 expect=$3
  say "self-healing ($name): a 3-task job under the supervisor (SINGA_ELASTIC_OPTIONS=\"$options\"), rank 1 killed"
  wait_idle
  JOBID=$(cd "$ROOT" && env SINGA_PYTHON="$PY" SINGA_WORKSPACE="$WORK/ws-$name" SINGA_ELASTIC=1 \
    SINGA_ELASTIC_OPTIONS="$options" timeout 30 \
    sbatch --parsable --ntasks=3 --time=00:05:00 --job-name="selftest-$name" --output="$WORK/$name-%j.out" \
           slurm/train.sbatch "$WORK/elastic.conf")
  wait_for_train_lines "$name" 15
  (cd "$ROOT" && "$PY" - "$WORK/ws-$name" <<'PYTHON'
import os, signal, sys
sys.path.insert(0, "tests")
from mpi_jobs import rank_pids
os.kill(rank_pids(sys.argv[1])[1], signal.SIGKILL)
PYTHON
  ) || { say "FAILED: could not find rank 1 of the elastic job to kill"; exit 1; }
  local state restarts
  follow_job 90
  local log ok=1
  log=$(cat "$WORK"/ws-"$name"/slurm-*.log 2>/dev/null)
  [ "$state" = COMPLETED ] && grep -q "vanished" <<<"$log" || ok=0
  case "$expect" in
    healed) grep -q "^  restarts        1" <<<"$log" && grep -q "finished on 2 ranks" <<<"$log" \
              && [ "${restarts:-0}" -eq 0 ] || ok=0 ;;
    requeued) grep -q "requeueing job" <<<"$log" && grep -q "resuming from" <<<"$log" \
                && [ "${restarts:-0}" -ge 1 ] || ok=0 ;;
  esac
  if [ "$ok" -ne 1 ]; then
    say "FAILED: the elastic job ($name) ended in state '${state:-unknown}' after ${restarts:-0} requeue(s), not $expect; its log:"
    echo "$log" | grep -v "^step" | tail -30
    timeout 10 scancel "$JOBID" 2>/dev/null || true
    exit 1
  fi
  say "elastic job $JOBID ($name): rank 1 killed; $expect and completed"
}
elastic elastic "--shrink --min-ranks 2" healed   # restarted on the 2 survivors inside the allocation
elastic elastic-requeue "--shrink --min-ranks 3" requeued   # too few left: requeued, resumed on 3 tasks
# --------------------------------------------------------------- the README's benchmark campaign
say "benchmark campaign: bash slurm/bench_campaign.sh --wait (1 and 2 ranks, 2 timed steps per task)"
wait_idle
set +e
table=$(cd "$ROOT" && SINGA_PYTHON=$PY RESULTS=$WORK/bench STEPS=2 timeout 600 bash slurm/bench_campaign.sh --wait)
status=$?
set -e
if [ "$status" -ne 0 ] || ! grep -Eq 'n=2.* x[0-9]+\.[0-9]{2} ' <<<"$table" || grep -q 'x n/a\|nan' <<<"$table"; then
  say "FAILED: the campaign (status $status) printed no speed-ups for 2 ranks; its table:"
  echo "$table" | tail -20
  tail -20 "$WORK"/bench/campaign-*/slurm-*.out 2>/dev/null  # (each campaign has its own folder)
  exit 1
fi
say "campaign table: $(grep -c ' n=2' <<<"$table") rows at 2 ranks with speed-ups over their 1-rank baselines"
say "PASSED"
