"""The Python API page's example runs as printed (docs/python-api.md: its python blocks, in a fresh
folder; the digits it reads are prepared on first use), and its commented results hold."""
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_python_api_page_s_example_runs(tmp_path, capsys, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "python-api.md").read_text(), re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/python-api.md", "exec"), namespace)  # noqa: S102 - the page's own code
    job, history = namespace["job"], namespace["history"]
    assert os.path.exists("digits.conf") and os.path.exists("runs/digits/job.conf")
    losses = history.metric("loss")
    assert [step for step, _ in losses] == [0, 100, 200, 300, 400, 500]
    assert losses[0][1] > 2.0 and losses[-1][1] < 0.1  # as the page's comment says
    assert job.evaluate("runs/digits")["accuracy"] > 0.95
    assert round(namespace["arrays_history"].last("test")["accuracy"], 2) == 0.90  # the arrays example's comment
