#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels scripts/device_scaling.sh installs on a machine without
# network (the 16-core measurement machine): into wheels/ (ignored by git), or the folder given.
#
#     bash scripts/device_wheels.sh [FOLDER]
#
# That machine's Python brings numpy, scipy, h5py, scikit-learn and PyTorch; what it may lack, or have
# built against another MPI, is carried: mpich (MPICH's library and mpiexec as a wheel), mpi4py and
# protobuf for CPython 3.10-3.13 (its version is not known here), threadpoolctl.  The versions are
# those installed in this environment (the ones the tests ran with), else the newest.  About 19 MB:
# well inside what the device tool carries (64 MiB).  The project itself is not a wheel: the scripts
# run from the carried checkout (PYTHONPATH), so what is measured is the code as committed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-wheels}
python=${PYTHON:-python3}

pinned() {  # NAME==VERSION as installed here, else NAME
  "$python" - "$1" <<'EOF'
import importlib.metadata as metadata, sys
try:
    print(f"{sys.argv[1]}=={metadata.version(sys.argv[1])}")
except metadata.PackageNotFoundError:
    print(sys.argv[1])
EOF
}

# Downloaded into a new folder beside FOLDER, which replaces it only when every download worked: a
# failure (no network) leaves FOLDER as it was.
out=${out%/}
mkdir -p "$(dirname "$out")"
new=$(mktemp -d "$(dirname "$out")/.$(basename "$out").new.XXXXXX")
old=""
trap 'rm -rf "$new" "$old"' EXIT
chmod a+rx "$new"  # (mktemp's folder is the owner's only)
download() {
  "$python" -m pip download -q --no-deps --only-binary=:all: -d "$new" "$@" && return
  echo "device_wheels: pip download $*: failed (pip's message above, if any): expected PyPI to be reachable;" \
       "$out/ is left as it was" >&2
  exit 1
}
download "$(pinned mpich)" "$(pinned threadpoolctl)"
for version in 310 311 312 313; do
  download --python-version "$version" --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$(pinned mpi4py)" "$(pinned protobuf)"
done
ls -1 "$new" > "$new/MANIFEST"
if [ -e "$out" ]; then  # the earlier wheels aside, the new ones in, then the earlier ones gone
  old=$(mktemp -d "$(dirname "$out")/.$(basename "$out").old.XXXXXX")
  mv "$out" "$old/"
fi
mv "$new" "$out"
echo "device_wheels: $(grep -c whl "$out/MANIFEST") wheels, $(du -sh "$out" | cut -f1) in $out/ (carry it: run(..., carry=[\"$out\"]))"
