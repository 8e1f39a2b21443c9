"""scripts/device_scaling.sh: the 16-core measurement, rehearsed here (its dry run), and its check of
the carried wheels; bench_scaling.py's weak scaling at a given number of rows per rank."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_scaling.sh"
TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"


def run_script(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    environ = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], **env)
    return subprocess.run(["bash", str(SCRIPT)] + args, cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=timeout)


def test_the_wheel_check_names_what_is_missing_for_this_python(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (wheels / "mpi4py-4.1.2-cp39-cp39-manylinux1_x86_64.whl").write_bytes(b"")  # another Python's
    proc = run_script(["check-wheels"], {"SINGA_DEVICE_WHEELS": str(wheels)}, 60)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith(f"device_scaling: missing in {wheels}/ for this machine's Python ({TAG}): ")
    assert "threadpoolctl-*.whl protobuf-*.whl mpi4py-*-" + TAG + "-*.whl: expected" in line
    assert "mpich" not in line.split("): ", 1)[1]
    for name in ("threadpoolctl-3.8.0-py3-none-any.whl", "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",
                 f"mpi4py-4.1.2-{TAG}-{TAG}-manylinux1_x86_64.whl"):
        (wheels / name).write_bytes(b"")
    proc = run_script(["check-wheels"], {"SINGA_DEVICE_WHEELS": str(wheels)}, 60)
    assert proc.returncode == 0 and "the wheels for " + TAG + " are all in" in proc.stdout


def test_an_unknown_part_is_one_line():
    proc = run_script(["everything"], {}, 60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("device_scaling: unknown part 'everything': expected scaling, peer-cost, "
                                   "pipeline, all, check-wheels or install")


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_keeps_its_results(tmp_path):
    """The rehearsal: every stage at 1-2 ranks on the MLP, each stage's JSON written, the log's last
    line saying what was done (PyTorch's stage is skipped where PyTorch is not installed)."""
    out = tmp_path / "out"
    proc = run_script(["all"], {"SINGA_DEVICE_DRY_RUN": "1", "SINGA_DEVICE_OUT": str(out), "SINGA_DEVICE_BUDGET": "600",
                                "XDG_CACHE_HOME": str(tmp_path / "cache")}, 900)  # calibrate and kernels: not the user's
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    machine = json.loads((out / "machine.json").read_text())
    assert machine["cores"] == os.cpu_count() and machine["mpi"] and machine["numpy"]
    assert machine["blas"].endswith(" kernels")  # which GEMM kernels ran
    cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    assert machine["avx512"] == ("avx512f" in cpuinfo.split()), machine["avx512"]
    assert machine["cpu"] and f"model name\t: {machine['cpu']}\n" in cpuinfo, machine["cpu"]
    family, model = machine["cpu_family_model"].split("/")  # the CPU's generation, where its name is generic
    assert family.isdigit() and model.isdigit(), machine["cpu_family_model"]
    assert machine["threads_per_core"] >= 1 and 1 <= machine["usable_cpus"] <= os.cpu_count(), machine
    strong = json.loads((out / "strong.json").read_text())["summary"]
    assert {(row["scheme"], row["ranks"]) for row in strong} == {(s, n) for s in ("data", "feature", "hybrid")
                                                                  for n in (1, 2)}
    weak = json.loads((out / "weak.json").read_text())["summary"]
    assert {row["ranks"]: row["batch"] for row in weak} == {1: 64, 2: 128}  # 64 rows per rank
    assert {row["ranks"] for row in json.loads((out / "auto.json").read_text())["summary"]} == {1, 2}
    cost = json.loads((out / "cost.json").read_text())
    assert cost and all(row["ranks"] == 2 for row in cost)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("== device_scaling all: done [strong weak auto calibrate ")
    assert "profile" in last.split("], cut short")[0] and "failed []" in last
    assert "pipelines pipeline-cost]" in last.split(", cut short")[0]
    pipelines = json.loads((out / "pipelines.json").read_text())["summary"]
    assert {(row["scheme"], row["ranks"]) for row in pipelines} == {("1f1b-4", 1), ("1f1b-4", 2)}
    assert (out / "device_scaling.log").read_text().strip().splitlines()[-1] == last
    if machine["torch"] is None:
        assert "== peer: skipped: PyTorch is not importable here" in proc.stdout
    else:
        assert (out / "peer.json").exists()
    assert "train" in proc.stdout and "rank(s); BLAS threads per rank" in proc.stdout  # the profile's table
    assert re.search(r"step: predicted [\d.]+ ms .*predicted/measured [\d.]+", proc.stdout)  # and the model's beside it


def test_a_budget_that_is_no_whole_seconds_is_one_line(tmp_path):
    proc = run_script(["all"], {"SINGA_DEVICE_BUDGET": "5m", "SINGA_DEVICE_OUT": str(tmp_path / "out")}, 60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "device_scaling: SINGA_DEVICE_BUDGET=5m: expected whole seconds, e.g. 270"
    assert not (tmp_path / "out").exists()


def standin_wheel(folder: pathlib.Path, name: str, tag: str = "py3-none-any") -> pathlib.Path:
    """A wheel of distribution ``name`` 99.0 holding one module, ``name``.py, that says it was carried."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-99.0.dist-info"
    files = {f"{name}.py": "CARRIED = True\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 99.0\n",
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: a test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for path, text in files.items()) + f"{info}/RECORD,,\n"
    wheel = folder / f"{name}-99.0-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(path, text)
    return wheel


def site_folder(python: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                       capture_output=True, text=True, check=True).stdout.strip())


@pytest.mark.slow
def test_the_install_puts_the_carried_wheels_before_the_machines_packages(tmp_path):
    """The measurement machine's python3 is a venv whose base Python lacks numpy and PyTorch: here, a venv
    (`machine`) whose packages are stand-ins the base has not (`standin_numpy`; a `threadpoolctl` of its
    own, which the carried one must shadow).  `install` makes the venv over it with the carried wheels
    (stand-ins too, built here: no network): they come first, then the machine venv's site folder."""
    machine = tmp_path / "machine"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(machine)], check=True, timeout=120)
    machine_site = site_folder(machine / "bin" / "python3")
    (machine_site / "standin_numpy.py").write_text("FROM = 'the machine'\n")
    (machine_site / "threadpoolctl.py").write_text("CARRIED = False\n")
    editable = tmp_path / "src"  # a package the machine's Python has through a .pth file (pip install -e)
    editable.mkdir()
    (editable / "standin_torch.py").write_text("FROM = 'a .pth file'\n")
    (machine_site / "__editable__.standin_torch-1.0.pth").write_text(f"{editable}\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("mpich", "protobuf", "threadpoolctl"):
        standin_wheel(wheels, name)
    standin_wheel(wheels, "mpi4py", f"{TAG}-{TAG}-linux_x86_64")
    venv = tmp_path / "device venv"  # a space: every path in the script is quoted
    environ = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    environ.update(PATH=f"{machine / 'bin'}{os.pathsep}{os.environ['PATH']}", SINGA_DEVICE_WHEELS=str(wheels),
                   SINGA_DEVICE_VENV=str(venv), PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run(["bash", str(SCRIPT), "install"], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith(f"device_scaling: {venv} has the carried wheels, then "), \
        proc.stdout
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", """
import json, sys, mpi4py, mpich, protobuf, threadpoolctl, standin_numpy, standin_torch
print(json.dumps({"path": sys.path, "carried": [m.CARRIED for m in (mpi4py, mpich, protobuf, threadpoolctl)],
                  "threadpoolctl": threadpoolctl.__file__, "numpy": standin_numpy.__file__,
                  "torch": standin_torch.__file__}))
"""], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    own_site = site_folder(venv / "bin" / "python")
    assert found["carried"] == [True] * 4, found
    assert pathlib.Path(found["threadpoolctl"]).parent == own_site  # the carried one, not the machine's own
    assert pathlib.Path(found["numpy"]).parent == machine_site  # the machine's packages are found
    assert pathlib.Path(found["torch"]).parent == editable  # and those its .pth files add
    path = [pathlib.Path(p) for p in found["path"]]
    assert path.index(own_site) < path.index(machine_site), found["path"]
