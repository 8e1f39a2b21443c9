"""`singa-mpi plot`: several runs' metrics.jsonl overlaid against step and wall time, a run's
per-layer profile as bars, PNG files that open, and a one-line install hint without matplotlib."""
import json
import sys

import matplotlib.image
import pytest

from singa_mpi import cli, plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_metrics(folder, losses, offset=0.0):
    folder.mkdir()
    entries = []
    for i, loss in enumerate(losses):
        step = 10 * i
        entries.append({"step": step, "phase": "train", "loss": loss, "accuracy": 1 - loss / 3,
                        "elapsed": offset + 0.5 * i, "samples_per_s": 100.0})
        if i % 2 == 0:
            entries.append({"step": step, "phase": "test", "loss": loss + 0.1, "accuracy": 0.5,
                            "elapsed": offset + 0.5 * i + 0.1})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    return str(folder)


def lines_of(ax):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_two_runs_are_overlaid_against_step_and_elapsed(tmp_path, capsys):
    a = write_metrics(tmp_path / "a", [2.0, 1.0, 0.5, 0.25])
    b = write_metrics(tmp_path / "b", [2.5, 1.5, 1.0], offset=3.0)
    fig = plot.metrics_figure({a: plot.read_metrics(a), b: plot.read_metrics(b)})
    assert [(ax.get_ylabel(), ax.get_xlabel()) for ax in fig.axes] == [
        ("loss", "step"), ("loss", "elapsed (s)"), ("accuracy", "step"), ("accuracy", "elapsed (s)")]
    by_step, by_time = lines_of(fig.axes[0]), lines_of(fig.axes[1])
    assert set(by_step) == {f"{a} train", f"{a} test", f"{b} train", f"{b} test"}
    assert by_step[f"{a} train"] == ([0, 10, 20, 30], [2.0, 1.0, 0.5, 0.25])
    assert by_step[f"{b} test"] == ([0, 20], [2.6, 1.1])
    assert by_time[f"{b} train"] == ([3.0, 3.5, 4.0], [2.5, 1.5, 1.0])
    assert {line.get_linestyle() for line in fig.axes[0].get_lines() if line.get_label().endswith("test")} == {":"}
    assert lines_of(fig.axes[2])[f"{a} train"][1] == pytest.approx([1 - x / 3 for x in [2.0, 1.0, 0.5, 0.25]])

    out = tmp_path / "compare.png"
    assert cli.main(["plot", a, b, "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert out.read_bytes()[:8] == PNG_MAGIC
    height, width, _ = matplotlib.image.imread(str(out)).shape
    assert (width, height) == (800, round(80 * (2 * 2.6 + 0.6)))


def test_one_run_goes_into_its_workspace(tmp_path):
    a = write_metrics(tmp_path / "a", [2.0, 1.0])
    assert cli.main(["plot", a]) == 0
    assert (tmp_path / "a" / "metrics.png").read_bytes()[:8] == PNG_MAGIC


PROFILE = {"steps": 10, "ranks": [
    [{"cat": "forward", "name": "fc1", "calls": 1.0, "bytes": 0.0, "seconds": 0.002},
     {"cat": "forward", "name": "concate@0", "calls": 1.0, "bytes": 0.0, "seconds": 0.001},
     {"cat": "comm", "name": "concate@0", "calls": 1.0, "bytes": 4096.0, "seconds": 0.0005},
     {"cat": "backward", "name": "fc1", "calls": 1.0, "bytes": 0.0, "seconds": 0.003},
     {"cat": "comm", "name": "allreduce(bucket0)", "calls": 2.0, "bytes": 8192.0, "seconds": 0.0004},
     {"cat": "step", "name": "train_one_batch", "calls": 1.0, "bytes": 0.0, "seconds": 0.007}],
    [{"cat": "forward", "name": "fc1", "calls": 1.0, "bytes": 0.0, "seconds": 0.001},
     {"cat": "step", "name": "train_one_batch", "calls": 1.0, "bytes": 0.0, "seconds": 0.002}]],
    "evaluation": [[], []]}


def test_profile_bars_per_rank_and_layer(tmp_path):
    fig = plot.profile_figure(PROFILE, "ws")
    time_ax, bytes_ax, time_ax1, _ = fig.axes
    assert [t.get_text() for t in time_ax.get_yticklabels()] == ["fc1", "concate@0", "allreduce(bucket0)"]
    assert [t.get_text() for t in time_ax1.get_yticklabels()] == ["fc1"]
    widths = {c.get_label(): [round(p.get_width(), 6) for p in c.patches] for c in time_ax.containers}
    assert widths == {"forward": [2.0, 1.0, 0.0], "backward": [3.0, 0.0, 0.0],
                      "in communication calls": [0.0, 0.5, 0.4]}
    assert [round(p.get_width(), 6) for p in bytes_ax.containers[0].patches] == [0.0, 4.0, 8.0]  # KiB per step

    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "profile.json").write_text(json.dumps(PROFILE))
    assert cli.main(["plot", "--profile", str(tmp_path / "ws")]) == 0
    assert (tmp_path / "ws" / "profile.png").read_bytes()[:8] == PNG_MAGIC


def test_without_matplotlib_one_line_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    a = write_metrics(tmp_path / "a", [2.0, 1.0])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert cli.main(["plot", a]) == 2  # a command line this installation cannot run (tests/cli/test_cli_optional.py)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matplotlib" in err and "pip install 'singa_mpi[plot]'" in err, err
    assert cli.main(["plot", "--profile", a]) == 2
    assert "pip install 'singa_mpi[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "a" / "metrics.png").exists()


def test_missing_files_and_several_profiles_are_one_line_errors(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "nothing")]) == 3
    assert "metrics.jsonl: no such file" in capsys.readouterr().err
    a = write_metrics(tmp_path / "a", [2.0])
    assert cli.main(["plot", "--profile", a]) == 3
    assert "profile.json: no such file" in capsys.readouterr().err
    assert cli.main(["plot", "--profile", a, a]) == 2
    assert "expected one" in capsys.readouterr().err


def test_plot_names_a_file_given_as_the_workspace_a_suffix_without_a_writer_and_a_line_that_is_no_object(
        tmp_path, capsys):
    """Each was a traceback: NotADirectoryError, matplotlib's ValueError, an AttributeError."""
    from singa_mpi import cli

    pytest.importorskip("matplotlib")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "metrics.jsonl").write_text('{"step": 0, "phase": "train", "loss": 1.0, "elapsed": 0.1}\n')
    assert cli.main(["plot", str(ws / "metrics.jsonl")]) == 3
    assert "metrics.jsonl: a file: expected the workspace folder that holds metrics.jsonl" in capsys.readouterr().err
    assert cli.main(["plot", str(ws), "-o", str(tmp_path / "curves.txt")]) == 2
    assert "curves.txt: a .txt suffix: expected one that names the picture's format: " in capsys.readouterr().err
    assert not (tmp_path / "curves.txt").exists()
    (ws / "metrics.jsonl").write_text("[1, 2]\n")
    assert cli.main(["plot", str(ws)]) == 3
    assert "metrics.jsonl:1: not a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize("content, expected", [
    ("[]", "profile.json: a JSON list, not an object: expected the profile a run writes at its end"),
    ('{"ranks": [[]]}', "profile.json: steps = null: expected the number of steps trained"),
    ('{"steps": 3, "ranks": "x"}', 'profile.json: ranks = "x": expected a list of row lists, one per rank'),
    ('{"steps": 3, "ranks": [[{"cat": "forward"}]]}', 'profile.json: ranks[0][0] = {"cat": "forward"}: expected a row'),
    ('{"steps": 3, "ranks": [[{"cat": "comm", "name": "fc1", "calls": 1, "bytes": "8", "seconds": 0.1}]]}',
     "profile.json: ranks[0][0] = "),
])
def test_a_profile_that_is_json_but_no_profile_is_a_one_line_error(tmp_path, capsys, content, expected):
    """Each was a traceback (KeyError, TypeError) while drawing."""
    (tmp_path / "profile.json").write_text(content)
    assert cli.main(["plot", "--profile", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err
    assert not (tmp_path / "profile.png").exists()


@pytest.mark.parametrize("bad", ['"a"', "null", "true", "[0]"])
def test_a_step_or_elapsed_that_is_no_number_is_a_one_line_error(tmp_path, capsys, bad):
    """A step that is not a number was a TypeError while sorting the points."""
    for key in ("step", "elapsed"):
        first = {"step": 0, "phase": "train", "loss": 1.0, "elapsed": 0.1, key: json.loads(bad)}
        lines = [first, {"step": 1, "phase": "train", "loss": 2.0}]
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
        assert cli.main(["plot", str(tmp_path)]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"metrics.jsonl:1: {key} = {bad}: expected a number" in err, err


def test_a_metric_value_that_is_no_number_is_left_out_of_its_curve(tmp_path):
    lines = [{"step": 0, "phase": "train", "loss": 1.0}, {"step": 1, "phase": "train", "loss": "x"},
             {"step": 1, "phase": "train", "loss": 2.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert cli.main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "metrics.png").read_bytes().startswith(PNG_MAGIC)


def test_unreadable_or_undecodable_files_are_one_line_errors(tmp_path, capsys):
    """Each was a traceback: IsADirectoryError, NotADirectoryError, UnicodeDecodeError."""
    (tmp_path / "folders" / "metrics.jsonl").mkdir(parents=True)
    (tmp_path / "folders" / "profile.json").mkdir()
    bytes_ws = tmp_path / "bytes"
    bytes_ws.mkdir()
    (bytes_ws / "metrics.jsonl").write_bytes(b'{"step": 0, "phase": "train", "loss": 1.0}\n\n\xff\xfe{"step": 1}\n')
    (bytes_ws / "profile.json").write_bytes(b'{"steps": \x82\xff}')
    cases = [(["plot", str(tmp_path / "folders")], "metrics.jsonl: cannot read it: Is a directory: expected the "
                                                     "workspace of a `singa-mpi train` run"),
             (["plot", "--profile", str(tmp_path / "folders")], "profile.json: cannot read it: Is a directory"),
             (["plot", str(bytes_ws)], "metrics.jsonl:3: not a JSON object"),  # its line, blank lines counted
             (["plot", "--profile", str(bytes_ws)], "profile.json: not valid JSON"),
             (["plot", "--profile", str(bytes_ws / "metrics.jsonl")],
              "metrics.jsonl: a file: expected the workspace folder that holds profile.json")]
    for args, expected in cases:
        assert cli.main(args) == 3, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err, (args, err)


def test_the_runs_bookkeeping_rows_are_drawn_only_with_debug(tmp_path):
    """The final gather's wait, spread over the steps, was drawn as the longest bar of a layer-less row."""
    rows = PROFILE["ranks"][0] + [{"cat": "comm", "name": "gather(objects)", "calls": 0.1, "bytes": 0.0,
                                   "seconds": 0.017}]
    profile = dict(PROFILE, ranks=[rows, PROFILE["ranks"][1]])
    shown = [t.get_text() for t in plot.profile_figure(profile, "ws").axes[0].get_yticklabels()]
    assert shown == ["fc1", "concate@0", "allreduce(bucket0)"]
    every = [t.get_text() for t in plot.profile_figure(profile, "ws", debug=True).axes[0].get_yticklabels()]
    assert every == shown + ["gather(objects)"]


def test_a_profile_of_no_step_is_a_one_line_error_not_an_empty_chart(tmp_path, capsys):
    (tmp_path / "profile.json").write_text(json.dumps(dict(PROFILE, steps=0)))
    assert cli.main(["plot", "--profile", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "steps = 0: the run trained no step, so there is nothing per step to draw" in err
    assert not (tmp_path / "profile.png").exists()
