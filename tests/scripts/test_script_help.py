"""Every script in scripts/ with a module docstring and argparse describes itself in -h by its docstring's
first paragraph, whole, as examples/python/ does: the first line alone stopped mid-sentence
(bench_frameworks.py: "... the fidelity of AllReduce, Sandblaster and")."""
import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _described() -> list[str]:
    """The scripts with a module docstring that build an argparse parser."""
    found = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        text = path.read_text()
        if ast.get_docstring(ast.parse(text)) and "argparse.ArgumentParser(" in text:
            found.append(path.name)
    return found


def test_the_scripts_with_a_help_text_are_found():
    assert {"bench_frameworks.py", "bench_trace.py", "bench_recovery.py"} <= set(_described())


@pytest.mark.parametrize("script", _described())
def test_a_script_s_help_gives_its_docstring_s_first_paragraph_whole(script):
    path = ROOT / "scripts" / script
    out = subprocess.run([sys.executable, str(path), "-h"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    first = " ".join(doc.split("\n\n")[0].split())
    assert first.endswith(".") and first in " ".join(out.stdout.split()), out.stdout
