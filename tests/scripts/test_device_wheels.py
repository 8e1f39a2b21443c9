"""scripts/device_wheels.sh, with pip replaced (no network here): the wheels replace FOLDER only when
every download worked; a failed one leaves FOLDER as it was and says what failed."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def fake_python(tmp_path: pathlib.Path, download: str) -> pathlib.Path:
    """This Python, except that `-m pip download ... -d DIR` runs ``download`` (shell, $dir set)."""
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
if [ "$1 $2 $3" = "-m pip download" ]; then
  prev=""; for a in "$@"; do [ "$prev" = -d ] && dir=$a; prev=$a; done
  {download}
fi
exec "{sys.executable}" "$@"
""")
    python.chmod(0o755)
    return python


def run_script(tmp_path, python: pathlib.Path, folder: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "device_wheels.sh"), str(folder)],
                          env=dict(os.environ, PYTHON=str(python)), capture_output=True, text=True, timeout=120)


def earlier_wheels(tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl").write_bytes(b"earlier")
    return folder


def test_a_failed_download_leaves_the_folder_as_it_was_and_says_so(tmp_path):
    folder = earlier_wheels(tmp_path)
    out = run_script(tmp_path, fake_python(tmp_path, "exit 1"), folder)
    assert out.returncode == 1
    assert out.stderr.startswith("device_wheels: pip download mpich"), out.stderr
    assert out.stderr.strip().endswith(f"{folder}/ is left as it was")
    assert [p.name for p in folder.iterdir()] == ["mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python", "wheels"]  # no temporary folder left


def test_the_new_wheels_replace_the_folder(tmp_path):
    folder = earlier_wheels(tmp_path)
    python = fake_python(tmp_path, 'for name in "$@"; do case $name in *==*|mpich|protobuf) '
                                   'touch "$dir/${name%%==*}-1.0-py3-none-any.whl" ;; esac; done; exit 0')
    out = run_script(tmp_path, python, folder)
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in folder.iterdir())
    assert "MANIFEST" in names and "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl" not in names, names
    assert "mpich-1.0-py3-none-any.whl" in names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python", "wheels"]
