"""Works as an installed package: a wheel, installed into a fresh venv (numpy, mpi4py, h5py... come
from this environment: nothing is downloaded), runs the quick start from an empty folder."""
import importlib.util
import os
import pathlib
import shutil
import site
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(cmd, cwd, env=None, timeout=300):
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_trains_the_default_job_from_an_empty_folder(tmp_path):
    # the sources a build reads, copied so that building leaves nothing in the checkout
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("singa_mpi", "conf"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
    wheels = tmp_path / "wheels"
    # without setuptools here (Python >= 3.12 venvs lack it) pip builds in isolation, fetching it
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", wheels, src], tmp_path)
    wheel, = wheels.glob("singa_mpi-*.whl")
    examples = sorted(p.name for p in (ROOT / "conf").glob("*.conf")) + sorted(  # and the plugins beside them
        p.name for p in (ROOT / "conf").glob("*.py"))
    examples.sort()
    assert sorted(n.split("/")[-1] for n in zipfile.ZipFile(wheel).namelist()
                  if n.startswith("singa_mpi/conf/")) == examples

    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    see_these_packages(python, this_environments_site_packages())
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], tmp_path)

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    # the packages borrowed from this environment include PyPI's MPICH, whose libmpi lies in this
    # environment's lib/: mpi4py >= 4.1 looks for it beside its interpreter's prefix (the new venv),
    # so name it, as a user whose MPI is elsewhere would
    borrowed = [path for name in ("libmpi.so.12", "libmpi.so.40")  # (libmpi.so: a linker script)
                if (path := pathlib.Path(sys.prefix) / "lib" / name).exists()]
    if borrowed and "MPI4PY_LIBMPI" not in env:
        env["MPI4PY_LIBMPI"] = str(borrowed[0])
    where = run([python, "-c", "import singa_mpi; print(singa_mpi.__file__)"], empty, env).stdout.strip()
    assert pathlib.Path(where).is_relative_to(venv), where  # the wheel, not this checkout
    out = run([venv / "bin" / "singa-mpi", "train"], empty, env).stdout
    assert "preparing scikit-learn's digits in data/digits/" in out
    assert (empty / "workspace" / "digits_mlp" / "checkpoint" / "step600.h5").exists()
    assert sorted(p.name for p in empty.iterdir()) == ["data", "workspace"]
    # the examples come out for editing; a job named by path finds its digits here too
    run([venv / "bin" / "singa-mpi", "examples"], empty, env)
    assert sorted(p.name for p in (empty / "conf").iterdir()) == examples
    shutil.rmtree(empty / "data")
    run([venv / "bin" / "singa-mpi", "train", "conf/digits_mlp.conf", "--steps", "2", "--workspace", "copy"],
        empty, env)
    assert (empty / "data" / "digits" / "test.h5").exists()


def this_environments_site_packages() -> list[str]:
    """The folders the running interpreter imports installed packages from. Not `--system-site-packages`:
    run from a venv, that would see the *base* interpreter's packages, not the ones this test runs on."""
    folders = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return [f for f in folders if pathlib.Path(f).is_dir()]


def see_these_packages(python: pathlib.Path, folders: list[str]) -> None:
    """Lets the venv of `python` import from `folders` after its own site-packages, through a .pth of
    plain paths: the .pth files inside those folders (this checkout's editable install) are not run,
    so `singa_mpi` can only come from the wheel."""
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  python.parent).stdout.strip()
    (pathlib.Path(purelib) / "parent_environment.pth").write_text("".join(f + "\n" for f in folders))
