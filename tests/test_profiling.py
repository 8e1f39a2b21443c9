"""The `train --profile` table (singa_mpi.profiling.format_table) from made-up profiles: the run's
bookkeeping rows (set-up, verdicts, final gathers) are left out unless --debug, and a run of no step
has nothing per step to show."""
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
