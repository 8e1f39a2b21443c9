"""The guardian process's own work beside naming a vanished rank (singa_mpi.communication.guardian):
the --trace timeline and the profile it writes from the ranks' part files.  The whole path, a rank SIGKILLed under
mpiexec, is in tests/launcher/test_train_outputs.py."""
from __future__ import annotations

import json
import os
import types

from singa_mpi import timeline_parts
from singa_mpi.communication import guardian, liveness
from test_timeline_parts import traced


def told_to_the_guardian(monkeypatch, path: str, run: str, *profile) -> dict:
    """What a rank's tell_guardian_of_trace(path, run, *profile) writes down its guardian's pipe, as the
    guardian reads it."""
    read_end, write_end = os.pipe()
    side = liveness.Guardian.__new__(liveness.Guardian)  # the rank's side, without starting the process
    side._write_end = write_end
    monkeypatch.setattr(liveness, "_LIVES", [types.SimpleNamespace(guardian=side)])
    liveness.tell_guardian_of_trace(path, run, *profile)
    os.close(write_end)
    line = os.read(read_end, 4096).split(b"\n")[0]
    os.close(read_end)
    assert line.startswith(b"trace ")
    return json.loads(line[6:])


def test_the_guardian_names_a_relative_trace_as_the_user_gave_it(tmp_path, monkeypatch, capfd):
    """`--trace out/trace.json` and a rank SIGKILLed: the guardian's line said 'timeline /tmp/.../out/trace.json'
    where every other line names it as given."""
    monkeypatch.chdir(tmp_path)
    trace = told_to_the_guardian(monkeypatch, "out/trace.json", "run1")
    for rank in (0, 1):
        part = timeline_parts.PartWriter("out/trace.json", traced(rank, 2), "run1")
        part.flush()
        part.close()
    monkeypatch.chdir("/")  # the file is written where the rank meant it, whatever the guardian's folder
    guardian._keep_the_timeline(trace, [1])
    err = capfd.readouterr().err
    assert err.startswith("singa-mpi: timeline out/trace.json: ") and err.count("\n") == 1, err
    assert "(each of ranks 0 1 up to its last written step; rank 1 vanished)" in err, err
    assert json.loads((tmp_path / "out" / "trace.json").read_text())["traceEvents"]
    assert not list((tmp_path / "out").glob("*.part"))


def test_the_guardian_of_a_vanished_rank_writes_the_profile_from_the_parts_too(tmp_path, monkeypatch, capfd):
    """A rank SIGKILLed under --trace: the guardian wrote the timeline from the ranks' parts, but no
    profile.json, which a rank that fails writes from the same parts."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    trace = told_to_the_guardian(monkeypatch, "out/trace.json", "run1", "ws/profile.json", 3)
    for rank, steps in ((0, 3), (1, 2)):
        part = timeline_parts.PartWriter("out/trace.json", traced(rank, steps), "run1")
        part.flush()
        part.close()
    monkeypatch.chdir("/")  # written where the rank meant it, named as the user gave it
    guardian._keep_what_is_left(trace, [1])
    err = capfd.readouterr().err.splitlines()
    assert err[0] == ("singa-mpi: profile ws/profile.json: ranks 0 1 up to their last written step (their --trace "
                      "parts; rank 1 vanished); no part of ranks 2 was found (on another node's disk?)"), err
    assert err[1].startswith("singa-mpi: timeline out/trace.json: ") and len(err) == 2, err
    profile = json.loads((tmp_path / "ws" / "profile.json").read_text())
    assert profile["steps"] == 3 and profile["missing"] == [2] and profile["ranks"][2] == [], profile
    calls = [{row["name"]: row["calls"] for row in rows if row["cat"] == "forward"} for rows in profile["ranks"][:2]]
    assert calls == [{"fc1": 1.0}, {"fc1": 1.0}]  # per step of each rank's own
    assert json.loads((tmp_path / "out" / "trace.json").read_text())["traceEvents"]
    assert not list((tmp_path / "out").glob("*.part"))
