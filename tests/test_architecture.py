"""The layering the package promises, checked by tools rather than by hand.

* the import-linter contracts of pyproject.toml (only the MPI communicator
  imports mpi4py; layers, planner, algorithms, sync strategies, checkpoints and
  the trainer never import a communicator implementation or a runtime; the
  communicators know nothing of layers or training; parsing (``config``)
  imports no layer, net, plan or run, nor the checks; nothing from the planner
  down imports the checks; the way of a job only goes down: cli (and the Python
  API), launcher (and the test command), runtimes, trainer, cost model, checks, programs, parsed
  config, none importing one above it, directly or through others);
* no import cycle between modules of the package (function-level imports
  count too), found with grimp, import-linter's import graph.
"""
import pathlib
import shutil
import subprocess
import sys

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports not found: pip install -e '.[test]' installs import-linter")
    result = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout, result.stdout[-4000:]


def _cycles(graph, package: str) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    edges = {m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d in modules) for m in modules}
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if child < len(edges[node]):
                work.append((node, child + 1))
                nxt = edges[node][child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            for nxt in edges[node]:
                if nxt in on_stack:
                    low[node] = min(low[node], low[nxt])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_between_modules():
    graph = grimp.build_graph("singa_mpi")
    assert _cycles(graph, "singa_mpi") == []


def test_the_cycle_finder_finds_cycles():
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph, "p") == [["p.a", "p.b"]]


def test_one_module_imports_mpi4py():
    hits = [path.relative_to(ROOT).as_posix() for path in (ROOT / "singa_mpi").rglob("*.py")
            if "import mpi4py" in path.read_text() or "from mpi4py" in path.read_text()]
    assert hits == ["singa_mpi/communication/mpi.py"]
