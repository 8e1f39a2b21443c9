"""What `train` leaves behind when a run ends early: the --trace timeline and WORKSPACE/profile.json
are written as on a finished run."""
from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from test_nonfinite import BAD_STEP, assert_stopped, job, store, train
from test_timeline import check_chrome_trace


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_nonfinite_stop_still_writes_the_trace_and_the_profile(tmp_path, ranks):
    """A NaN stops every rank at the same step (voted): the timeline up to it is the one most wanted."""
    trace, workspace = tmp_path / "trace.json", tmp_path / "ws"
    result = train(job(tmp_path, store(tmp_path, np.nan)), workspace, "--trace", str(trace), ranks=ranks)
    assert_stopped(result, workspace, BAD_STEP)
    assert result.stdout.count(f"timeline {trace}: ") == 1, result.stdout[-2000:]
    spans = check_chrome_trace(json.loads(trace.read_text()))
    batches = collections.Counter(e["pid"] for e in spans if e["name"] == "train_one_batch")
    assert batches == {rank: BAD_STEP + 1 for rank in range(ranks)}  # the bad step's batch included
    profile = json.loads((workspace / "profile.json").read_text())
    assert profile["steps"] == BAD_STEP + 1 and len(profile["ranks"]) == ranks
