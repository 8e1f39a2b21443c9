"""The `train --profile` table (singa_mpi.profiling.format_table) from made-up profiles: the run's
bookkeeping rows (set-up, verdicts, final gathers) are left out unless --debug, and a run of no step
has nothing per step to show."""
import pytest

from singa_mpi import profiling

ROWS = [{"cat": "forward", "name": "fc1", "calls": 1.0, "bytes": 0.0, "seconds": 0.002},
        {"cat": "comm", "name": "allreduce(bucket0)", "calls": 1.0, "bytes": 2048.0, "seconds": 0.001},
        {"cat": "comm", "name": "communicators", "calls": 0.1, "bytes": 0.0, "seconds": 0.0003},
        {"cat": "comm", "name": "gather(objects)", "calls": 0.1, "bytes": 0.0, "seconds": 0.017},
        {"cat": "step", "name": "train_one_batch", "calls": 1.0, "bytes": 0.0, "seconds": 0.005}]
PROFILE = {"steps": 10, "ranks": [ROWS, ROWS[:2] + [ROWS[4]]], "evaluation": [[], []]}


def labels(table):
    return [line.split()[1] for line in table.splitlines()[2:] if line.split()[0].isdigit()]


def test_bookkeeping_rows_are_counted_in_a_last_line_not_as_a_per_step_cost():
    table = profiling.format_table(PROFILE)
    assert labels(table) == ["fc1", "allreduce(bucket0)", "fc1", "allreduce(bucket0)"]
    # the ranks' communication: the sync's 1 ms, not the final gather's wait of 17 ms a step
    assert "rank 0: ms per step: train_one_batch 5.000; in communication calls 1.000" in table
    assert table.splitlines()[-1] == ("  (2 rows of the run's own bookkeeping not shown (set-up, verdicts, final "
                                      "gathers), up to 17.300 ms per step on a rank: --debug shows them)")


def test_debug_shows_every_row():
    table = profiling.format_table(PROFILE, debug=True)
    assert labels(table)[:4] == ["fc1", "allreduce(bucket0)", "communicators", "gather(objects)"]
    assert "in communication calls 18.300" in table and "not shown" not in table


def test_a_run_of_no_step_has_nothing_to_profile():
    assert profiling.format_table({"steps": 0, "ranks": [ROWS], "evaluation": [[]]}) == (
        "profile: this run trained no step: nothing per step to show")


def traced_run(steps: int = 3):
    """A recording tracer over ``steps`` training steps and a test pass after the first, with the
    evaluation totals the trainer keeps (Trainer.evaluate)."""
    from singa_mpi.tracing import Tracer

    tracer, evaluation = Tracer(rank=1, record=True), {}
    for step in range(steps):
        tracer.step = step
        if step == 1:
            before = tracer.snapshot()
            with tracer.span("test", "step"):
                with tracer.span("fc1", "forward"):
                    tracer.end(tracer.begin("metrics", "comm"), 8)
            profiling.add(evaluation, profiling.subtract(tracer.snapshot(), before))
        with tracer.span("train_one_batch", "step"):
            with tracer.span("fc1", "forward"):
                pass
            tracer.end(tracer.begin("allreduce(bucket0)", "comm"), 64)
    return tracer, evaluation


def by_key(rows):
    return {(row["cat"], row["name"]): row for row in rows}


def test_a_worker_s_part_from_its_recorded_spans_is_the_one_from_its_totals():
    """What a failed MPI run's profile holds of the other ranks (their --trace part files) is what their
    totals would have given, test passes kept apart."""
    tracer, evaluation = traced_run()
    mine, theirs = profiling.worker_part(tracer, evaluation), profiling.part_from_spans(tracer.events)
    assert theirs["steps"] == mine["steps"] == 3
    for phase in ("train", "evaluation"):
        assert by_key(theirs[phase]).keys() == by_key(mine[phase]).keys(), phase
        for key, row in by_key(mine[phase]).items():
            assert by_key(theirs[phase])[key] == pytest.approx(row), (phase, key)
    assert ("comm", "metrics") in by_key(theirs["evaluation"]) and ("step", "test") not in by_key(theirs["train"])


def test_a_failed_run_s_profile_holds_the_workers_it_has_and_names_the_others():
    tracer, evaluation = traced_run()
    part = profiling.worker_part(tracer, evaluation)
    fewer = profiling.part_from_spans(traced_run(2)[0].events)
    profile = profiling.build_partial({1: part, 3: fewer}, 4)
    assert profile["ranks"][0] == profile["ranks"][2] == [] and profile["ranks"][1] == part["train"]
    assert profile["missing"] == [0, 2] and profile["steps"] == 3  # the worker that trained most
    assert profiling.build_partial({5: part}, 2)["missing"] == [0, 1, 2, 3, 4]  # a rank beyond the group's size


def test_the_guardian_builds_a_profile_from_parts_with_the_standard_library_alone(tmp_path):
    """The guardian of a rank killed outright runs as `python -I -S` (no site-packages: no numpy) and
    writes the profile from the ranks' parts with this module: it must import without them, and without
    the modules of the package that lead to them."""
    import json
    import os
    import subprocess
    import sys

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(profiling.__file__)))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); sys.modules['numpy'] = None\n"
            "from singa_mpi import profiling\n"
            "from singa_mpi.tracing import Span\n"
            "spans = [Span('train_one_batch', 'step', 0, 0.0, 1.0)]\n"
            "profiling.write_file(sys.argv[2], profiling.build_partial({0: profiling.part_from_spans(spans)}, 2))\n"
            "print(' '.join(sorted(name for name in sys.modules if name.startswith('singa_mpi'))))\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, package_parent, str(tmp_path / "p.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    # nothing of the package that leads to numpy (singa_mpi.progress did: a pipeline's line names its planner)
    assert done.stdout.split() == ["singa_mpi", "singa_mpi.durable", "singa_mpi.profiling", "singa_mpi.tracing"]
    profile = json.loads((tmp_path / "p.json").read_text())
    assert profile["missing"] == [1] and profile["steps"] == 1
