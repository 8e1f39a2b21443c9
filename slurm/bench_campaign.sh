#!/usr/bin/env bash
# The scaling benchmark campaign in one command: slurm/bench.sbatch as job arrays for the 1-rank
# baselines and for each rank count given, then a job that collects their results once all of them
# have ended (afterany) into CAMPAIGN/scaling.txt (the table; CAMPAIGN/scaling.png too with matplotlib).
# CAMPAIGN is a new folder RESULTS/campaign-DATE-TIME-XXXX for each campaign: its results, and the tasks'
# Slurm output, are never mixed with an earlier campaign's.  A task that left no result is named in
# scaling.txt, and the collecting job (with --wait: this script) then exits 1.
#
#   bash slurm/bench_campaign.sh --wait          # 1 and 2 ranks; waits and prints the table here
#   bash slurm/bench_campaign.sh 2 4 8 16        # returns at once; the table lands in CAMPAIGN/scaling.txt
#
# Environment: as slurm/bench.sbatch (SINGA_PYTHON, RESULTS default bench-results, STEPS, SINGA_LAUNCHER).
set -euo pipefail
cd "$(dirname "$0")/.."

WAIT=0
COUNTS=()
for arg in "$@"; do
  case $arg in
    --wait) WAIT=1 ;;
    ''|*[!0-9]*) echo "bench_campaign: $arg: expected rank counts (2 4 8 ...) and --wait" >&2; exit 2 ;;
    *) [ "$arg" -gt 1 ] && COUNTS+=("$arg") ;;
  esac
done
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(2)
PY=${SINGA_PYTHON:-python3}
mkdir -p "${RESULTS:-bench-results}"
# this campaign's own folder: the tasks write into it (RESULTS, exported to them), the collector reads it
RESULTS=$(mktemp -d "${RESULTS:-bench-results}/campaign-$(date +%Y%m%d-%H%M%S)-XXXX")
export RESULTS
echo "campaign folder: $RESULTS"

ids=()
for n in 1 "${COUNTS[@]}"; do  # the baselines first: every speed-up is against them
  id=$(sbatch --parsable --ntasks="$n" --output="$RESULTS/slurm-%x-%A_%a.out" slurm/bench.sbatch)
  ids+=("${id%%;*}")
  echo "submitted the benchmark array on $n rank(s): job ${id%%;*}"
done
deps=$(IFS=:; echo "${ids[*]}")
# --wrap is one line of shell: each word quoted (%q), so that a path with spaces stays one word
wrap=$(printf '%q ' "$PY" scripts/bench_scaling.py --collect "$RESULTS" --expect-ranks 1 "${COUNTS[@]}" \
         --plot "$RESULTS/scaling.png")
collect=(sbatch --parsable --dependency="afterany:$deps" --ntasks=1 --time=00:05:00 --job-name=singa-bench-collect
         --output="$RESULTS/scaling.txt" --wrap="$wrap")
if [ "$WAIT" -eq 0 ]; then
  id=$("${collect[@]}")
  echo "submitted the collecting job ${id%%;*}: the table will be in $RESULTS/scaling.txt"
  exit 0
fi
echo "waiting for the arrays and the collecting job (the table is also kept in $RESULTS/scaling.txt)"
status=0
"${collect[@]}" --wait >/dev/null || status=$?
cat "$RESULTS/scaling.txt"
exit "$status"
