#!/usr/bin/env bash
# Scaling where HPC users run it: singa_mpi at 1-16 ranks on a 16-core machine, beside PyTorch DDP, the
# cost model's predictions beside the measurements, and one 16-rank convnet step profiled per layer.
# Made for the device tool's window (15 minutes of machine time, no network there, a call at most 10
# minutes, the machine warm for 30 s after each): `scaling` (4.5 minutes at most), then at once
# `SINGA_DEVICE_BUDGET=450 ... peer-cost` (its PyTorch stage alone took 3.5 minutes on 2026-11-30), then,
# if the window allows, `pipeline`.  The first call's start took about 30 s on 2026-11-30.
#
#   here, once:     bash scripts/device_wheels.sh                 (wheels/: what that machine lacks)
#   there:          bash scripts/device_scaling.sh scaling        (strong and weak scaling, auto)
#                   SINGA_DEVICE_BUDGET=450 bash scripts/device_scaling.sh peer-cost
#                                                                 (PyTorch DDP, predicted vs measured, both
#                                                                  nets' 16-rank profile beside the model's)
#                   bash scripts/device_scaling.sh pipeline       (pipelines of 2 and 4 stages, 1F1B, ZB and
#                                                                  GPipe over 4 and 8 micro-batches)
#                   (the device tool: run(command="bash scripts/device_scaling.sh scaling",
#                    carry=["wheels"]); the results come back from $OUT)
#   rehearsal here: SINGA_DEVICE_DRY_RUN=1 bash scripts/device_scaling.sh all   (1-2 ranks, ~1 minute)
#                   bash scripts/device_scaling.sh check-wheels   (are the carried wheels all there?)
#                   bash scripts/device_scaling.sh install        (check them and make the venv, no more)
#
# Environment:
#   SINGA_DEVICE_OUT     where the log, machine.json and each stage's JSON go (default: $OUT when the
#                        device tool runs it, else bench-results/device-TIME)
#   SINGA_DEVICE_BUDGET  whole seconds for this call (default 270); each stage gets at most what is left, and
#                        a stage cut short still prints and keeps what it measured (the bench scripts
#                        report on SIGTERM), the next stages are skipped and said so
#   SINGA_DEVICE_WHEELS  the carried wheels (default wheels/)
#   SINGA_DEVICE_VENV    the venv they go into, over the machine's python3 (default /tmp/singa-device-venv,
#                        kept while the machine stays warm: the second call reuses it)
#   SINGA_DEVICE_COMMIT  the commit measured, for machine.json (default: git's, where .git is there)
#   SINGA_DEVICE_DRY_RUN=1: ranks 1-2, two timed steps, the MLP only, in this environment (no install)
#
# One BLAS thread per rank; MPICH (the mpich wheel) launches the ranks.  Exit 0 when no stage failed
# (stages cut short by the budget are not failures), 1 otherwise, 2 when the wheels are missing.
set -uo pipefail  # not -e: a stage that fails is reported and the next one runs
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
part=${1:-all}
dry=${SINGA_DEVICE_DRY_RUN:-0}
wheels=${SINGA_DEVICE_WHEELS:-wheels}
venv=${SINGA_DEVICE_VENV:-/tmp/singa-device-venv}
out=${SINGA_DEVICE_OUT:-${OUT:-bench-results/device-$(date +%Y%m%d-%H%M%S)}}
budget=${SINGA_DEVICE_BUDGET:-270}
if ! [[ $budget =~ ^[1-9][0-9]*$ ]]; then  # bash arithmetic would garble 5m (or read 0270 as octal)
  echo "device_scaling: SINGA_DEVICE_BUDGET=$budget: expected whole seconds, e.g. 270" >&2
  exit 2
fi
deadline=$(( $(date +%s) + budget ))

if [ "$dry" = 1 ]; then
  ranks=(1 2) cost_ranks=(2) profile_ranks=2 nets=(mnist_mlp) steps=(--steps 2) pipe_ranks=(1 2)
  pipe_schemes=(1f1b-4)
else
  ranks=(1 2 4 8 16) cost_ranks=(4 8 16) profile_ranks=16 nets=(mnist_mlp cifar10_convnet) steps=(--steps 20)
  # a stage per rank (the nets have 13-14 layers); interleaved: two runs of layers per rank; last, the
  # fastest pipeline plan --auto prices (its search takes a while: cut short first by the budget)
  pipe_ranks=(1 2 4) pipe_schemes=(pipeline 1f1b-4 gpipe-4 zb-4 1f1b-8 interleaved-4 interleaved-8 auto-pipeline)
fi
weak_rows=64  # rows per rank in weak scaling

check_wheels() {  # every wheel this machine's Python needs from the carried folder (exit 2 otherwise)
  local tag missing=()
  tag=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  for pattern in "mpich-*.whl" "threadpoolctl-*.whl" "protobuf-*.whl" "mpi4py-*-$tag-*.whl"; do
    compgen -G "$wheels/$pattern" > /dev/null || missing+=("$pattern")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "device_scaling: missing in $wheels/ for this machine's Python ($tag): ${missing[*]}: expected" \
         "the wheels of bash scripts/device_wheels.sh, run where PyPI is reachable and carried here" >&2
    return 2
  fi
  echo "device_scaling: the wheels for $tag are all in $wheels/"
}

install_venv() {  # the venv over this machine's python3, with the carried wheels first (return 2 if that failed)
  [ -x "$venv/bin/mpiexec" ] && return  # made by an earlier call while the machine stayed warm
  # That machine's python3 is itself a venv (/opt/torch/.venv): a venv made from it sees its *base*
  # Python's packages, not numpy and PyTorch, so a .pth file adds python3's own site folders, after
  # the venv's (the carried mpi4py wins), as site folders: their own .pth files count too (a package
  # installed with pip install -e is only there).  A venv, not pip --target: mpi4py finds the mpich
  # wheel's libmpi under sys.prefix/lib, where --target does not put it (the system's would be loaded).
  local parents own
  if ! { parents=$(python3 -c 'import site
for folder in site.getsitepackages():
    print(f"import site; site.addsitedir({folder!r})")') &&
         python3 -m venv --system-site-packages "$venv" &&
         own=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])') &&
         printf '%s\n' "$parents" > "$own/zz-device-python.pth" &&
         "$venv/bin/python" -m pip install -q --no-index --find-links "$wheels" --no-deps \
           mpich mpi4py protobuf threadpoolctl; }; then
    echo "device_scaling: installing the wheels into $venv failed (above)" >&2
    return 2
  fi
  echo "device_scaling: $venv has the carried wheels, then $(python3 -c 'import sys; print(sys.executable)')'s packages"
}

case $part in
  check-wheels) check_wheels; exit $? ;;
  install) check_wheels && install_venv; exit $? ;;
  scaling|peer-cost|pipeline|all) ;;
  *) echo "device_scaling: unknown part '$part': expected scaling, peer-cost, pipeline, all, check-wheels or install" >&2
     exit 2 ;;
esac

mkdir -p "$out"
exec > >(tee -a "$out/device_scaling.log") 2>&1
echo "== device_scaling $part ($(date -u +%FT%TZ)), budget ${budget}s, results in $out"

# --- the environment: this one for a dry run; else a venv over the machine's Python with the wheels ---
if [ "$dry" != 1 ]; then
  { check_wheels && install_venv; } || exit 2
  # shellcheck disable=SC1091
  source "$venv/bin/activate"
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} SINGA_MPI_FLAVOR=mpich PYTHONUNBUFFERED=1 \
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
commit=${SINGA_DEVICE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
python3 - "$out/machine.json" "$commit" <<'EOF' || { echo "device_scaling: this Python cannot run singa_mpi (above)" >&2; exit 2; }
import importlib.metadata as metadata, json, os, platform, sys
need = {"numpy": (1, 25), "scipy": (1, 10), "h5py": (3, 8), "scikit-learn": (1, 2), "mpi4py": (4, 0)}
cpuinfo = {}  # the first processor's entries: every core of the machine is the same model
for line in open("/proc/cpuinfo"):
    if not line.strip():
        break
    key, _, value = line.partition(":")
    cpuinfo[key.strip()] = value.strip()
facts = {"commit": sys.argv[2], "python": platform.python_version(), "cores": os.cpu_count(),
         "cpu": cpuinfo.get("model name", platform.processor())}
for name, least in need.items():
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        sys.exit(f"{name} is not installed in this Python: singa_mpi needs it (the wheels carry only mpich, "
                 f"mpi4py, protobuf and threadpoolctl)")
    facts[name] = version
    if tuple(int(p) for p in version.split(".")[:2]) < least:
        sys.exit(f"{name} {version} is older than singa_mpi needs ({'.'.join(map(str, least))})")
from mpi4py import MPI
facts["mpi"] = " ".join(MPI.Get_library_version().split("\n")[0].split())
# numpy's BLAS and the kernels it chose for this CPU: OpenBLAS 0.3.31 takes AMD's Zen 5 (family 26)
# for Haswell (AVX2) although it has AVX-512, whose kernels ran the MLP's GEMMs 1.7x faster there; a
# Zen 4 (family 25, model 17) it gives the AVX-512 kernels, which ran them 1.1-1.2x slower there than
# OPENBLAS_CORETYPE=Haswell.  A VM's model name may say only "AMD EPYC": family and model tell which.
facts["cpu_family_model"] = f"{cpuinfo.get('cpu family', '?')}/{cpuinfo.get('model', '?')}"
import numpy
from threadpoolctl import threadpool_info
blas = next((lib for lib in threadpool_info() if lib["user_api"] == "blas"), None)
facts["blas"] = f"{blas['internal_api']} {blas.get('version')} {blas.get('architecture')} kernels" if blas else None
facts["avx512"] = "avx512f" in cpuinfo.get("flags", "").split()
# Hardware threads per core, as the (virtual) machine reports them: 16 "cores" that are 8 cores' two
# hyperthreads would cap a BLAS-bound step's speed-up near 8 (the 2026-11-30 run had no record of it).
siblings, per_package = cpuinfo.get("siblings"), cpuinfo.get("cpu cores")
facts["threads_per_core"] = (int(siblings) // int(per_package) if siblings and per_package
                             and int(per_package) else None)
facts["usable_cpus"] = len(os.sched_getaffinity(0))
try:
    import torch
    facts["torch"] = torch.__version__
    facts["torch_cpu"] = torch.backends.cpu.get_cpu_capability()
except ImportError:
    facts["torch"] = None
json.dump(facts, open(sys.argv[1], "w"), indent=1)
print("machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
EOF

# --- the stages ---
done_stages=() cut=() failed=() skipped=()
stage() {  # NAME CAP COMMAND...: run COMMAND for at most CAP seconds and what is left of the budget
  local name=$1 cap=$2 left code
  shift 2
  left=$(( deadline - $(date +%s) ))
  (( left > cap )) && left=$cap
  if (( left < 20 )); then
    echo "== $name: skipped: the call's budget is spent"
    skipped+=("$name")
    return
  fi
  echo "== $name ($(date +%T), at most ${left}s): $*"
  timeout --signal=TERM --kill-after=15 "$left" "$@"
  code=$?
  case $code in
    0) done_stages+=("$name") ;;
    124|137) echo "== $name: cut short after ${left}s (the table above has what it measured)"; cut+=("$name") ;;
    *) echo "== $name: failed (exit $code)"; failed+=("$name") ;;
  esac
}

if [ "$part" = scaling ] || [ "$part" = all ]; then
  stage strong 130 python3 scripts/bench_scaling.py --ranks "${ranks[@]}" --nets "${nets[@]}" --schemes data feature hybrid \
    --repeat 1 "${steps[@]}" --json "$out/strong.json"
  stage weak 50 python3 scripts/bench_scaling.py --weak "$weak_rows" --ranks "${ranks[@]}" --nets "${nets[@]}" --schemes data \
    --repeat 1 "${steps[@]}" --json "$out/weak.json"
  stage auto 140 python3 scripts/bench_scaling.py --ranks "${ranks[@]}" --nets "${nets[@]}" --schemes auto \
    --repeat 1 "${steps[@]}" --json "$out/auto.json"
fi
if [ "$part" = peer-cost ] || [ "$part" = all ]; then
  stage calibrate 30 mpiexec -n 2 python3 -m singa_mpi calibrate
  # per layer at the most ranks, measured beside the cost model's prediction (--beside): which layers
  # the model misses at scale (on 2026-11-30 it was 0.5-0.7x the convnet's step, 2.8x the MLP's)
  stage profile 60 mpiexec -n "$profile_ranks" python3 scripts/profile_step.py --net "${nets[-1]}" --scheme data \
    --steps 10 --beside
  if [ "${#nets[@]}" -gt 1 ]; then
    stage profile-mlp 45 mpiexec -n "$profile_ranks" python3 scripts/profile_step.py --net "${nets[0]}" --scheme data \
      --steps 10 --beside
  fi
  if python3 -c "import torch" 2> /dev/null; then
    stage peer 220 python3 scripts/bench_peer.py --ranks "${ranks[@]}" --nets "${nets[@]}" --repeat 1 "${steps[@]}" \
      --json "$out/peer.json"
  else
    echo "== peer: skipped: PyTorch is not importable here (pip install -e '.[bench]')"
    skipped+=(peer)
  fi
  stage cost 90 python3 scripts/bench_cost.py --ranks "${cost_ranks[@]}" --nets "${nets[@]}" --schemes data feature hybrid \
    --repeat 1 "${steps[@]}" --json "$out/cost.json"
fi
if [ "$part" = pipeline ] || [ "$part" = all ]; then
  stage pipelines 200 python3 scripts/bench_scaling.py --ranks "${pipe_ranks[@]}" --nets "${nets[@]}" \
    --schemes "${pipe_schemes[@]}" --repeat 1 "${steps[@]}" --json "$out/pipelines.json"
  stage pipeline-cost 60 python3 scripts/bench_cost.py --ranks "${pipe_ranks[@]:1}" --nets "${nets[@]}" \
    --schemes "${pipe_schemes[@]}" --repeat 1 "${steps[@]}" --json "$out/pipeline-cost.json"
fi

echo "== device_scaling $part: done [${done_stages[*]}], cut short [${cut[*]}], failed [${failed[*]}]," \
     "skipped [${skipped[*]}]; files: $(cd "$out" && echo *)"
[ "${#failed[@]}" -eq 0 ]
