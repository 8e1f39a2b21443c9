"""The phase-1 vote's verdict: before any other collective, every rank's error (if any), whether a
stop signal came, and the facts every rank must share; one line from rank 0 says what stops the job."""
from __future__ import annotations

import hashlib
import sys
from typing import Any, NamedTuple

import numpy as np

from singa_mpi import run_events
from singa_mpi.checkpoints.hdf5 import EXIT_CHECKPOINTED, Checkpoint
from singa_mpi.config.load import JobConfig
from singa_mpi.errors import ConfigError, one_line
from singa_mpi.stop_signals import STOPPED_BEFORE_TRAINING


STARTS_FROM = "the checkpoint the run starts from"
SAME_JOB = "expected every rank to run the same job file with the same options"
FIRST_BATCH = "the first batch of layer"
# what a disagreement asks for where the job file and its options are not the cause
EXPECTED = {STARTS_FROM: "expected every rank to read the same checkpoint: a workspace (and checkpoint_path files) "
                         "in a folder every node shares, named alike from every rank's working directory",
            FIRST_BATCH: "expected every rank to read the same data files: in a folder every node shares (or "
                         "identical copies), named alike from every rank's working directory"}


def expected(what: str) -> str:
    """What a disagreement on ``what`` asks for."""
    return next((hint for start, hint in EXPECTED.items() if what.startswith(start)), SAME_JOB)


class Verdict(NamedTuple):
    """One rank's part of the vote."""

    error: tuple[str, int] | None  # (message, exit code) of what failed on this rank in phase 1
    stopped: bool  # a stop signal came during phase 1
    facts: Any  # what every rank must share (Launch.facts), None where the launch was not described
    warnings: list  # what setup warned of (launcher.said_once): rank 0 says every rank's, once


def phase_one_verdict(world, cfg: JobConfig | None, verdicts: list[Verdict]) -> int | None:
    """The exit code every rank returns after the phase-1 vote (rank 0 prints why), or None to go on:
    the first error; else a stop signal (75); else the first thing a rank does not share with rank 0."""
    failed = [(rank, verdict.error) for rank, verdict in enumerate(verdicts) if verdict.error is not None]
    if failed:
        rank, (message, code) = failed[0]
        if world.rank == 0:
            where = "" if len(failed) == world.size else f" (on rank {rank})"
            print(f"singa-mpi: error{where}: {one_line(message)}", file=sys.stderr, flush=True)
            run_events.note("setup_error", rank=rank, code=code, message=one_line(message))
        return code
    if any(verdict.stopped for verdict in verdicts):
        if world.rank == 0:
            print(STOPPED_BEFORE_TRAINING, flush=True)
        return EXIT_CHECKPOINTED
    mismatch = first_disagreement([verdict.facts for verdict in verdicts])
    if mismatch is None:
        return None
    rank, what, theirs, ours = mismatch
    files = world.allgather_object(cfg.path)
    if what == "the job":  # say where the jobs differ (one more exchange, only on this path)
        rank, what, theirs, ours = first_disagreement(world.allgather_object(job_details(cfg))) \
            or mismatch
    if world.rank == 0:
        print(f"singa-mpi: error: ranks disagree: {what} is {theirs} on rank {rank} and {ours} on rank 0 "
              f"(job files: {files[0]} on rank 0, {files[rank]} on rank {rank}): "
              f"{expected(what)}", file=sys.stderr, flush=True)
        run_events.note("setup_error", rank=rank, code=ConfigError.exit_code, message=f"ranks disagree: {what}")
    return ConfigError.exit_code


def starts_from(ckpt: Checkpoint | None) -> tuple[str, str]:
    """The fact of what this rank starts from (the checkpoint it read in phase 1): its step and a
    digest of its params, or none.  Ranks that start at different steps wait for each other's
    collectives for ever (--resume with a workspace one node does not see, or a relative one read
    from another working directory); at one step with other params they train apart."""
    if ckpt is None:
        return STARTS_FROM, "none (step 0)"
    return STARTS_FROM, f"step {ckpt.step} (params digest {digest(sorted(ckpt.params.items()))})"


def first_batch(layer: str, phase: str, arrays: list[tuple[str, Any]]) -> tuple[str, str]:
    """The fact of what input layer ``layer`` of ``phase`` read as its first global batch (the same rows
    on every rank): ``arrays``, (name, array) pairs.  Ranks whose data files differ (a copy on one
    node's disk, stale; a relative path read from another working directory) otherwise train on both."""
    return f"{FIRST_BATCH} '{layer}' ({phase})", f"digest {digest(arrays)}"


def digest(arrays: list[tuple[str, Any]]) -> str:
    """A short digest of (name, array) pairs: their names, shapes, types and bytes."""
    hashed = hashlib.blake2b(digest_size=6)
    for name, array in arrays:
        array = np.ascontiguousarray(array)
        hashed.update(f"{name} {array.shape} {array.dtype}".encode())
        hashed.update(array.data)
    return hashed.hexdigest()


def job_details(cfg: JobConfig) -> list[tuple[str, str]]:
    """The job field by field (each layer apart), for naming where two ranks' jobs differ."""
    details = []
    for field, value in cfg.proto.ListFields():
        if field.name != "neuralnet":
            details.append((f"the job's {field.name}", _short(value, field)))
    net = cfg.proto.neuralnet
    details.append(("the number of layers", str(len(net.layer))))
    for index, layer in enumerate(net.layer):
        for field, value in layer.ListFields():
            details.append((f"layer #{index} '{layer.name}' {field.name}", _short(value, field)))
    for field, value in net.ListFields():
        if field.name != "layer":
            details.append((f"neuralnet.{field.name}", _short(value, field)))
    return details


def first_disagreement(everyone: list[list[tuple[str, str]]]) -> tuple[int, str, str, str] | None:
    """(rank, what, its value, rank 0's value) for the first rank whose (what, value) facts differ
    from rank 0's, at the first fact that differs (in rank 0's order; "(not set)" where one lacks it);
    None when all agree."""
    reference = dict(everyone[0])
    for rank, facts in enumerate(everyone[1:], start=1):
        theirs = dict(facts)
        for what in list(reference) + [w for w in theirs if w not in reference]:
            value, ours = theirs.get(what, "(not set)"), reference.get(what, "(not set)")
            if value != ours:
                return rank, what, value, ours
    return None


def _short(value, field) -> str:
    """A field's value as it would read in a job file, if short; else a digest of it."""
    from google.protobuf import text_format

    if field.enum_type is not None and isinstance(value, int):
        value = field.enum_type.values_by_number[value].name if value in field.enum_type.values_by_number else value

    if not isinstance(value, (str, bytes)) and hasattr(value, "__iter__") and not hasattr(value, "ListFields"):
        text = "; ".join(text_format.MessageToString(v, as_one_line=True) if hasattr(v, "ListFields") else str(v)
                         for v in value)
    elif hasattr(value, "ListFields"):
        text = text_format.MessageToString(value, as_one_line=True)
    else:
        text = str(value)
    if len(text) <= 120:
        return f"{{ {text} }}" if hasattr(value, "ListFields") else text
    return f"{{ ... }} (digest {hashlib.sha256(text.encode()).hexdigest()[:12]})"
