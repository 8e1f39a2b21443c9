"""``singa-mpi plot``: a run's curves from ``metrics.jsonl``, or its per-layer profile, into PNG.

    singa-mpi plot runs/mlp                        # runs/mlp/metrics.png
    singa-mpi plot runs/a runs/b -o compare.png    # several runs overlaid, labelled by workspace
    singa-mpi plot --profile runs/mlp              # runs/mlp/profile.png from profile.json

Curves: one row per metric (loss first, then accuracy and the rest), against the step (left)
and the wall time ``elapsed`` (right); one colour per workspace, one line style per phase
(train solid, val dashed, test dotted).  Profile: per worker, ms per training step of each
layer's passes and of its communication calls, and KiB moved per step.

matplotlib is an optional extra (``pip install 'singa_mpi[plot]'``); it is imported only here.
"""
from __future__ import annotations

import json
import os

from singa_mpi import profiling
from singa_mpi.errors import ConfigError, DataError, MissingDependency, writing

INSTALL = "pip install 'singa_mpi[plot]'"
NOT_METRICS = {"step", "phase", "elapsed", "samples_per_s", "comm_share"}
AXES = ("step", "elapsed")
PHASE_STYLES = {"train": "-", "val": "--", "test": ":"}
PROFILE_EXPECTED = "expected the profile a run writes at its end"
COMM_COLOUR = "0.4"  # grey: the passes take C0, C1, ...


def figure_class():
    """matplotlib's Figure (no pyplot, no display needed), or a one-line error saying how to get it."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependency("plot", "matplotlib", f"{INSTALL} (or pip install matplotlib)") from None
    return Figure


def read_metrics(workspace: str) -> list[dict]:
    path = workspace_file(workspace, "metrics.jsonl")
    text = read_text(path, "expected the workspace of a `singa-mpi train` run")
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    entries = []
    for number, line in lines:  # numbered as an editor numbers them, blank lines included
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            raise DataError(f"{path}:{number}: not a JSON object: expected one metrics entry per line")
        for key in AXES:  # the x axes: the points are sorted by them
            if key in entry and not is_number(entry[key]):
                raise DataError(f"{path}:{number}: {key} = {json.dumps(entry[key])[:60]}: expected a number")
        entries.append(entry)
    return entries


def workspace_file(workspace: str, name: str) -> str:
    if os.path.isfile(workspace):
        raise DataError(f"{workspace}: a file: expected the workspace folder that holds {name} "
                        f"({os.path.dirname(workspace) or '.'} here?)")
    return os.path.join(workspace, name)


def read_text(path: str, expected: str) -> str:
    """The text of ``path``, or a one-line DataError (a folder in its place, a file that cannot be read).
    Undecodable bytes (a damaged file) become U+FFFD: the JSON that holds them is then the error named."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file: {expected}") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read it: {err.strerror or err}: {expected}") from None


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def save_figure(figure, output: str, what: str) -> str:
    """Write ``figure`` to ``output`` in the format its suffix names (ConfigError for a suffix matplotlib
    has no writer for: it raised its own ValueError)."""
    formats = figure.canvas.get_supported_filetypes()
    suffix = os.path.splitext(output)[1].lstrip(".").lower()
    if suffix not in formats:
        raise ConfigError(f"{output}: {'a .' + suffix if suffix else 'no'} suffix: expected one that names the "
                          f"picture's format: {', '.join('.' + name for name in sorted(formats))}")
    with writing(output, what):
        figure.savefig(output)
    return output


def metric_names(runs: dict[str, list[dict]]) -> list[str]:
    """Metrics present in any run: loss first, accuracy next, then the rest by name."""
    names = {key for entries in runs.values() for entry in entries for key, value in entry.items()
             if key not in NOT_METRICS and not key.endswith("/count") and is_number(value)}
    return sorted(names, key=lambda k: (k != "loss", k != "squared_error", k != "accuracy", k))


def plot_metrics(workspaces: list[str], output: str) -> str:
    """Loss/accuracy/... against step and elapsed seconds, every workspace overlaid, into ``output``."""
    figure_class()  # the install hint before anything is read
    figure = metrics_figure({workspace: read_metrics(workspace) for workspace in workspaces})
    return save_figure(figure, output, "the plot")


def metrics_figure(runs: dict[str, list[dict]]):
    """The figure of :func:`plot_metrics` from each workspace's metrics entries."""
    figure = figure_class()
    workspaces = list(runs)
    names = metric_names(runs)
    if not names:
        raise DataError(f"{', '.join(workspaces)}: metrics.jsonl holds no metric values: expected a run that "
                        f"displayed or tested at least once")
    fig = figure(figsize=(10, 2.6 * len(names) + 0.6), dpi=80, layout="constrained")
    axes = fig.subplots(len(names), 2, squeeze=False)
    colours = [f"C{i % 10}" for i in range(len(workspaces))]
    for row, name in enumerate(names):
        for col, x_key in enumerate(AXES):
            ax = axes[row][col]
            for colour, (workspace, entries) in zip(colours, runs.items()):
                for phase, style in PHASE_STYLES.items():
                    points = sorted((e[x_key], e[name]) for e in entries
                                    if e.get("phase") == phase and is_number(e.get(name)) and x_key in e)
                    if points:
                        xs, ys = zip(*points)
                        ax.plot(xs, ys, style, color=colour, marker="." if len(xs) < 30 else None,
                                label=f"{workspace} {phase}" if len(workspaces) > 1 else phase)
            ax.set_xlabel("step" if x_key == "step" else "elapsed (s)")
            ax.set_ylabel(name)
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(", ".join(workspaces) if len(workspaces) > 1 else workspaces[0])
    return fig


def plot_profile(workspace: str, output: str, debug: bool = False) -> str:
    """Bars per worker: ms per training step of each layer's passes and communication, KiB per step
    (the run's bookkeeping rows only with ``debug``, as in the ``--profile`` table)."""
    figure_class()
    path = workspace_file(workspace, profiling.FILE)
    text = read_text(path, "expected the workspace of a finished `singa-mpi train` run")
    try:
        profile = json.loads(text)
    except ValueError:
        raise DataError(f"{path}: not valid JSON: {PROFILE_EXPECTED}") from None
    check_profile(profile, path)
    if not profile["steps"]:
        raise DataError(f"{path}: steps = 0: the run trained no step, so there is nothing per step to draw; "
                        f"expected the profile of a run that trained (its --steps above its start)")
    figure = profile_figure(profile, workspace, debug)
    return save_figure(figure, output, "the plot")


def check_profile(profile, path: str) -> None:
    """A DataError naming the first field of ``profile`` that is not as :func:`profiling.build` writes it
    (a hand-edited or another program's file would end in a KeyError or TypeError while drawing)."""
    if not isinstance(profile, dict):
        raise DataError(f"{path}: a JSON {type(profile).__name__}, not an object: {PROFILE_EXPECTED}")
    if not is_number(profile.get("steps")):
        raise DataError(f"{path}: steps = {json.dumps(profile.get('steps'))}: expected the number of steps trained")
    ranks = profile.get("ranks")
    if not isinstance(ranks, list) or not all(isinstance(rows, list) for rows in ranks):
        raise DataError(f"{path}: ranks = {json.dumps(ranks)[:60]}: expected a list of row lists, one per rank")
    for rank, rows in enumerate(ranks):
        for number, row in enumerate(rows):
            if not (isinstance(row, dict) and all(isinstance(row.get(key), str) for key in ("cat", "name"))
                    and all(is_number(row.get(key)) for key in ("calls", "bytes", "seconds"))):
                raise DataError(f"{path}: ranks[{rank}][{number}] = {json.dumps(row)[:60]}: expected a row with "
                                f"cat and name (strings), calls, bytes and seconds (numbers)")


def profile_figure(profile: dict, title: str, debug: bool = False):
    """The figure of :func:`plot_profile` from a profile.json's content."""
    figure = figure_class()
    ranks = profile["ranks"]
    if not ranks:
        raise DataError(f"{title}: the profile holds no worker: expected one row list per rank")
    tables = [profiling.layer_rows(profiling.shown_rows(rows, debug)) for rows in ranks]
    height = max(1, *(len(labels) for _, labels, _ in tables))
    fig = figure(figsize=(11, (0.22 * height + 1.2) * len(ranks) + 0.4), dpi=80, layout="constrained")
    axes = fig.subplots(len(ranks), 2, squeeze=False, gridspec_kw={"width_ratios": [3, 1]})
    for rank, (passes, labels, cells) in enumerate(tables):
        time_ax, bytes_ax = axes[rank]
        ys = list(range(len(labels)))
        left = [0.0] * len(labels)
        for i, name in enumerate(passes):
            widths = [1e3 * cells[label].get(name, 0.0) for label in labels]
            time_ax.barh([y - 0.2 for y in ys], widths, height=0.4, left=left, color=f"C{i}", label=f"{name}")
            left = [a + b for a, b in zip(left, widths)]
        comm = [1e3 * cells[label].get("comm", 0.0) for label in labels]
        time_ax.barh([y + 0.2 for y in ys], comm, height=0.4, color=COMM_COLOUR, label="in communication calls")
        moved = [cells[label].get("bytes", 0.0) / 2**10 for label in labels]
        bytes_ax.barh(ys, moved, color=COMM_COLOUR)
        bytes_ax.set_xlim(left=0, right=None if any(moved) else 1)
        for ax in (time_ax, bytes_ax):
            ax.set_yticks(ys, labels if ax is time_ax else [""] * len(labels), fontsize="small")
            ax.invert_yaxis()
            ax.grid(True, axis="x", alpha=0.3)
        time_ax.set_title(f"rank {rank}: ms per training step", fontsize="medium")
        bytes_ax.set_title("KiB sent+received per step", fontsize="medium")
        time_ax.legend(fontsize="small", loc="lower right")
    fig.suptitle(f"{title}: {profile['steps']} training steps")
    return fig


def default_output(workspaces: list[str], profile: bool) -> str:
    if profile:
        return os.path.join(workspaces[0], "profile.png")
    return os.path.join(workspaces[0], "metrics.png") if len(workspaces) == 1 else "metrics.png"
