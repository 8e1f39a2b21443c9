"""The notebook example (examples/python/digits_notebook.ipynb) runs in a Jupyter kernel, one process
and no MPI launcher, cell by cell as a user runs it, and shows what its text says: a checked job with
no warnings, a trained net, its test, predictions that agree with the test, and the params' shapes."""
from __future__ import annotations

import ast
import pathlib
import shutil

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "python" / "digits_notebook.ipynb"


def _results(notebook) -> list[str]:
    """Each code cell's value as the kernel shows it (text/plain), or its printed text."""
    shown = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        values = [out["data"]["text/plain"] for out in cell.outputs if out["output_type"] == "execute_result"]
        shown.append(values[-1] if values else "")
    return shown


def test_the_notebook_runs_in_a_kernel_and_shows_what_it_says(tmp_path):
    copy = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, copy)
    notebook = nbformat.read(copy, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")  # committed clean
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    shapes, check, losses, test, predicted, params = _results(notebook)
    assert ast.literal_eval(shapes) == ((1400, 64), (397, 64))
    assert check.startswith("Summary(name='digits-notebook'") and check.endswith("warnings=[])")
    losses = ast.literal_eval(losses)
    assert [step for step, _ in losses] == [0, 50, 100, 150] and losses[-1][1] < losses[0][1] / 5
    test = ast.literal_eval(test)
    assert test["step"] == 200 and test["accuracy"] > 0.85
    predicted = ast.literal_eval(predicted)
    assert predicted["rows"] == 397 and abs(predicted["accuracy"] - test["accuracy"]) < 1e-9
    assert ast.literal_eval(params) == {"fc1_b": (64,), "fc1_w": (64, 64), "fc2_b": (10,), "fc2_w": (10, 64)}
    assert (tmp_path / "runs" / "notebook" / "job.conf").exists()
