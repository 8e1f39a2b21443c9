"""The guardian: a small process beside each rank that names the rank if it vanishes.

Started by :class:`singa_mpi.communication.liveness.Guardian` in a session of its own (the
launcher's clean-up does not reach it), with the standard library, the status records of
:mod:`singa_mpi.communication.liveness` and :mod:`singa_mpi.run_events` only (the line it prints is
also an event for a supervisor).  It waits on a pipe that only its rank can write to.
A rank that ends normally, or on purpose after printing why (MPI_Abort), says so first; end of file
without that means the rank vanished (SIGKILL, the out-of-memory killer, a segfault).  The guardian
then records which of the node's ranks it saw dead (its sighting), waits up to a second for the other
guardians of the node (the launcher kills every other rank within milliseconds), and the lowest-ranked
of them prints one line naming the rank that vanished first: rank, pid, host, step, what it was doing,
how it ended when the kernel still tells (:func:`first_gone`, :func:`earliest_noticed`).  Under
``--trace`` it then writes the run's profile and timeline from the ranks' part files, which no rank is
left to do (:func:`_keep_what_is_left`).

With ``--stall-timeout`` it also watches its rank's wait in MPI_Init, which the rank's own watchdog
thread cannot (mpi4py holds the interpreter there): past the timeout it names the rank that holds the
start-up up and ends its own rank, which makes the launcher end the job.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time

from singa_mpi import run_events
from singa_mpi.communication.liveness import (
    IN_MPI_INIT,
    Status,
    blame,
    claim_verdict,
    proc_state,
    read_all,
    read_record,
    record_path,
    remove_folder_if_done,
    remove_quietly,
    say_verdict,
    unrecorded_ranks,
)

GRACE = 1.0  # how long a guardian waits for the other guardians of its node


_PF_EXITING = 0x4  # the kernel's task flag: the process is exiting (a big one takes milliseconds)
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def _death_level(pid: int) -> int:
    """0 running, 1 dying (exiting, or a SIGKILL pending) or dead and not yet reaped, 2 gone.  A
    rank killed first may still be tearing down its memory when the launcher's SIGKILL of the others
    lands: "exiting" must count as dead, or a later death would look like the first."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X") or int(fields[6]) & _PF_EXITING or _sigkill_pending(pid):
            return 1
        return 0
    except FileNotFoundError:
        return 2
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)
            return 0
        except ProcessLookupError:
            return 2
        except OSError:
            return 0


def _sigkill_pending(pid: int) -> bool:
    """Whether a SIGKILL waits for delivery to the process (/proc's SigPnd or ShdPnd)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & _SIGKILL_BIT:
                    return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def _how_it_ended(pid: int) -> str:
    """" (killed by SIGKILL)" while the kernel still holds the dead process (its parent has not reaped it)."""
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return ""
        if fields[0] in ("Z", "X") and len(fields) >= 50:
            status = int(fields[49])  # exit_code, as waitpid reports it
            if status & 0x7F:
                try:
                    return f" (killed by {signal.Signals(status & 0x7F).name})"
                except ValueError:
                    return f" (killed by signal {status & 0x7F})"
            return f" (exit code {status >> 8})"
        time.sleep(0.002)
    return ""


def first_gone(sightings: list[dict]) -> list[int]:
    """The ranks that may have vanished first, from what each guardian saw when its rank ended
    (``{"levels": {rank: 0 running, 1 dead, 2 reaped}}``): those dead in every sighting, as every
    sighting comes after the first death.  One rank when a guardian looked before the launcher's
    clean-up had ended the others (usual); several when every guardian looked too late (a node
    short of cores)."""
    candidates = None
    for seen in sightings:
        dead = {int(r) for r, level in seen["levels"].items() if level > 0}
        candidates = dead if candidates is None else candidates & dead
    return sorted(candidates or ())


def earliest_noticed(sightings: list[dict], candidates: list[int], margin: float = 0.005) -> list[int]:
    """Among several candidates, the one whose guardian noticed its end ``margin`` seconds before any
    other guardian noticed anything ([] if none did): a guardian's wake-up is queued when its rank
    dies, so the first death is usually noticed first even on a node short of cores, when the
    launcher's clean-up has overtaken every guardian."""
    if len(candidates) < 2 or len(sightings) < 2:
        return []
    first, second = sorted(sightings, key=lambda seen: seen["noticed"])[:2]
    watching = {seen["rank"]: seen.get("ready", float("inf")) for seen in sightings}
    # a candidate whose guardian was not yet watching (still starting) could have died first unseen
    others = [rank for rank in candidates if rank != first["rank"]]
    if any(watching.get(rank, float("inf")) > first["noticed"] - margin for rank in others):
        return []
    if first["rank"] in candidates and second["noticed"] - first["noticed"] >= margin:
        return [first["rank"]]
    return []


def unwatched(records: dict[int, Status]) -> list[int]:
    """The ranks of this node that have no status record (they may have died while starting, before
    anything watched them): by number where every rank runs on this node, else -1 per unknown one."""
    any_status = next(iter(records.values()), None)
    if any_status is None or not any_status.local or len(records) >= any_status.local:
        return []
    if any_status.local == any_status.size:
        return sorted(set(range(any_status.size)) - set(records))
    return [-1] * (any_status.local - len(records))


def _vanished_line(first: list[int], records: dict[int, Status], ended: str, local: list[int]) -> str:
    def described(rank: int) -> str:
        status = records.get(rank)
        if rank < 0:
            return "a rank of this node that had not started its status record"
        if status is None:
            return f"rank {rank} (no status record: it died while starting, or had not got that far)"
        return f"{status.who()} at step {status.step} ({status.activity})"

    if len(first) == 1:
        how = (f"{ended}: by a user, a scheduler or the out-of-memory killer" if "killed" in ended
               else f"{ended}: it exited without saying why" if ended else ": killed by a signal or crashed")
        after = ("the other ranks save their state for a restart" if os.environ.get("SINGA_MPI_KEPT") == "1"
                 else "the launcher then ended the other ranks")
        return f"singa-mpi: {described(first[0])} vanished without a word{how}; {after}\n"
    if not first:
        return ""
    size = max((status.size for status in records.values()), default=0)
    ranks = ", ".join(str(r) if r >= 0 else "?" for r in first)
    if first == local and len(local) < size:
        return (f"singa-mpi: ranks {ranks} on this node ended together ({'; '.join(described(r) for r in first[:4])})"
                f": the launcher ended them after a rank on another node failed, or a signal reached all of them\n")
    return (f"singa-mpi: one of ranks {ranks} vanished without a word, killed by a signal or crashed, and the "
            f"launcher ended the others within milliseconds, too fast to tell which was first "
            f"({'; '.join(described(r) for r in first[:4])})\n")


def guard(folder: str, rank: int, pid: int, stall_timeout: float) -> None:
    """The guardian's life: wait for the rank to end; if it vanished, help name it (see the module)."""
    ready = time.time()  # from now on this rank's end is noticed at once (earliest_noticed)
    said, trace = _wait_for_the_end(folder, rank, pid, stall_timeout)
    if said.strip():  # it ended as it meant to ("exit", or "abort" after saying why)
        remove_quietly(record_path(folder, rank))
        remove_folder_if_done(folder)
        return
    noticed = time.time()
    records = read_all(folder)
    levels = {str(r): (max(1, _death_level(s.pid)) if r == rank else _death_level(s.pid)) for r, s in records.items()}
    ended = _how_it_ended(pid)
    sighting = {"rank": rank, "levels": levels, "ended": ended, "noticed": noticed, "ready": ready}
    tmp = os.path.join(folder, f"seen{rank}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(sighting, f)
        os.replace(tmp, os.path.join(folder, f"seen{rank}"))
    except OSError:
        pass
    _speak_if_first(folder, rank, records, trace)


def _wait_for_the_end(folder: str, rank: int, pid: int, stall_timeout: float) -> tuple[bytes, dict | None]:
    """What the rank said before its pipe closed ("exit", "abort"), and the --trace timeline it writes
    its part of (a line "trace {path, run}"), if it does.  Meanwhile, with a stall timeout (from the
    command line, or a line "stall SECONDS" from a rank whose guardian started before it had read its
    own), watch its wait in MPI_Init, which the rank's own watchdog cannot: mpi4py holds the
    interpreter there."""
    said, line, trace = b"", b"", None
    watch = _InitWatch(folder, rank, pid, stall_timeout) if stall_timeout > 0 else None
    while True:
        if watch is not None and not select.select([0], [], [], 0.1)[0]:
            watch = watch if watch.still_waiting() else None
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            return said + line, trace
        *complete, line = (line + chunk).split(b"\n")
        for words in complete:
            if words.startswith(b"stall "):
                timeout = float(words.split()[1])
                watch = _InitWatch(folder, rank, pid, timeout) if timeout > 0 else None
            elif words.startswith(b"trace "):
                trace = json.loads(words[6:])
            else:
                said += words + b"\n"


class _InitWatch:
    """The guardian's stall watchdog for its rank's MPI_Init."""

    def __init__(self, folder: str, rank: int, pid: int, timeout: float):
        self.folder, self.rank, self.pid, self.timeout = folder, rank, pid, timeout
        self.seen = False

    def still_waiting(self) -> bool:
        """False once the rank is past MPI_Init (or this watch ended the job)."""
        status, now = read_record(record_path(self.folder, self.rank)), time.time()
        if status is None or status.state != IN_MPI_INIT:
            return not self.seen
        self.seen = True
        if now - status.progress_at <= self.timeout:
            return True
        if proc_state(self.pid) in ("T", "t"):  # the rank itself is stopped: it is the culprit, not the
            return True  # ranks it waits for; their guardians name it (and it may yet be continued)
        records = read_all(self.folder)
        awaited = [r for r in range(status.size) if r != self.rank]
        message = (f"singa-mpi: rank {self.rank}: stalled: {status.activity} for {now - status.progress_at:.1f}s "
                   f"(--stall-timeout {self.timeout:g}s); "
                   f"{blame(records, awaited, now, unrecorded_ranks(self.folder, records))}; aborting the job\n")
        if claim_verdict(self.folder, f"rank {self.rank}"):
            say_verdict(self.folder, message)
            time.sleep(0.2)  # the launcher has read the line: a moment to write it out before it ends the job
            try:
                os.kill(self.pid, signal.SIGKILL)  # its end makes the launcher end every rank
            except OSError:
                pass
        return False


def _speak_if_first(folder: str, rank: int, records: dict[int, Status], trace: dict | None = None) -> None:
    """Wait for the node's other guardians (or GRACE), then let one of them print the line (and, where a
    rank of this node vanished and the ranks wrote a --trace timeline's parts, write the timeline)."""
    local = sorted(records)
    deadline = time.monotonic() + GRACE
    sightings: list[dict] = []
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(folder, "verdict")):
            break  # a rank explained the end (MPI_Abort) or another guardian spoke
        sightings = []
        for other in local:
            try:
                with open(os.path.join(folder, f"seen{other}")) as f:
                    sightings.append(json.load(f))
            except (OSError, ValueError):
                pass
        if len(sightings) == len(local):
            break
        time.sleep(0.02)
    if sightings and rank == min(s["rank"] for s in sightings) and claim_verdict(folder, "guardian"):
        first = first_gone(sightings)
        first = sorted((earliest_noticed(sightings, first) or first) + unwatched(records))
        ended = next((s["ended"] for s in sightings if s["rank"] in first and s["ended"]), "") if len(first) == 1 else ""
        line = _vanished_line(first, records, ended, local)
        say_verdict(folder, line)
        if line:
            # a node whose ranks the launcher ended after a failure elsewhere: the supervisor hears from
            # every node still there (node_ranks), so a node that says nothing is a node lost
            kind = "ended_together" if " on this node ended together " in line else "vanished"
            keeps = kind == "vanished" and trace is not None  # the supervisor waits for its "kept" to name them
            run_events.note(kind, ranks=first, node_ranks=local, ended=ended, line=line.strip(), keeps=keeps,
                            who={str(r): {"step": records[r].step, "host": records[r].host, "pid": records[r].pid,
                                          "activity": records[r].activity} for r in first if r in records})
            if keeps:
                _keep_what_is_left(trace, first)
                run_events.note("kept")  # the profile and timeline it could write are there
    time.sleep(0.2)  # the others read the verdict before it goes
    remove_quietly(os.path.join(folder, f"seen{rank}"))
    remove_quietly(record_path(folder, rank))
    for other, status in records.items():  # ranks that died before their guardian started
        if _death_level(status.pid) == 2:
            remove_quietly(record_path(folder, other))
    remove_folder_if_done(folder)


def _keep_what_is_left(trace: dict, vanished: list[int]) -> None:
    """A run whose rank vanished under --trace: no rank is left to write its profile and timeline, so the
    guardian that named the rank writes both from the ranks' parts (each up to its last written step),
    read once for both."""
    from singa_mpi import timeline_parts  # the standard library only, as this module

    try:
        read = timeline_parts.read_parts(trace["path"], trace["run"])
    except Exception:  # the parts stay beside the trace (docs/observability.md)
        return
    _keep_the_profile(trace, vanished, read)
    _keep_the_timeline(trace, vanished, read)


def _keep_the_profile(trace: dict, vanished: list[int], read: list) -> None:
    """The profile of a run whose rank vanished, from the ranks' parts ``read`` (:func:`singa_mpi.profiling.
    build_partial`; each rank up to its last written step), where the rank said (``trace["profile"]``);
    one line saying whose it holds, if the launcher still reads (the file is written first)."""
    from singa_mpi import profiling  # the standard library only, as this module
    from singa_mpi.durable import NotDurable, not_durable

    if not trace.get("profile") or not read:
        return
    caveat = ""
    try:
        parts = {header["rank"]: profiling.part_from_spans(spans) for header, spans in read}
        profile = profiling.build_partial(parts, int(trace.get("size") or 0))
        try:
            profiling.write_file(trace["profile"], profile)
        except NotDurable as err:  # in place: its line is said, and what the disk did
            caveat = f" ({not_durable(err)})"
    except Exception:  # a by-product: the timeline is still written
        return
    missing = profile["missing"]
    lost = f"; no part of ranks {' '.join(map(str, missing))} was found (on another node's disk?)" if missing else ""
    _say(f"singa-mpi: profile {trace.get('profile_shown') or trace['profile']}: ranks "
         f"{' '.join(map(str, sorted(parts)))} up to their last written step (their --trace parts; "
         f"{_who(vanished)} vanished){lost}{caveat}\n")


def _keep_the_timeline(trace: dict, vanished: list[int], read: list | None = None) -> None:
    """The --trace timeline of a run whose rank vanished: no rank is left to merge the ranks' parts (each
    up to its last written step; ``read``: as read already), so the guardian that named the rank does,
    and says so if the launcher still reads (the file is written first: the launcher may be gone)."""
    from singa_mpi import timeline  # the standard library only, as this module

    try:
        # named as the user gave it (relative, if so), as the ranks' lines name it; written where it was meant
        written = timeline.write_from_parts(trace["path"], trace["run"], shown=trace.get("shown"), read=read)
    except Exception:  # the parts stay beside the trace (docs/observability.md)
        return
    if written is not None:
        line, ranks = written
        _say(f"singa-mpi: {line} (each of ranks {' '.join(map(str, ranks))} up to its last written "
             f"step; {_who(vanished)} vanished)\n")


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {' '.join(map(str, ranks))}"


def _say(line: str) -> None:
    """One line on the rank's stderr, which the launcher forwards while it is still there."""
    try:
        os.write(2, line.encode(errors="replace"))
    except OSError:
        pass


def main(argv: list[str]) -> None:
    """``FOLDER RANK PID STALL_TIMEOUT`` (0: no stall watch)."""
    folder, rank, pid, stall_timeout = argv
    guard(folder, int(rank), int(pid), float(stall_timeout))
