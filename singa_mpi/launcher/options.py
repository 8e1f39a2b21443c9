"""What the user asked for: the job, the command (train or test) and its options."""
from __future__ import annotations

import dataclasses
from typing import Callable

from singa_mpi.config.load import JobConfig

TRAIN, TEST = "train", "test"


@dataclasses.dataclass
class RunOptions:
    """How to run beyond the job file: ``singa-mpi train`` options."""

    seed: int | None = None
    steps: int | None = None
    stall_timeout: float | None = None
    resume: bool = False
    workers: int | None = None  # overrides cluster.nworkers_per_group (--workers N)
    overwrite: bool = False  # move another run's checkpoints and metrics aside (WORKSPACE/previous-<time>/)
    keep: int | None = None
    allow_partial: bool | None = None  # --allow-partial (None: the caller has no such option, as the Python API)
    allow_other_job: bool = False  # --resume from a checkpoint another job wrote (its identity differs)
    trace: str | None = None  # FILE: every rank's timeline as Chrome-trace JSON (singa_mpi.timeline)
    profile: bool = False  # print the per-layer compute/communication table at the end
    check_finite: bool = True  # stop at the first NaN/inf in inputs, metrics or gradients (exit 5)
    check_memory: bool = True  # refuse a job predicted not to fit a rank's memory (singa_mpi.cost.memory)
    debug: bool = False  # --debug: also the communication table's bookkeeping rows
    deterministic: bool = False  # --deterministic: the job's deterministic setting, on (its default blocks)
    # the Python API: the job's text is written to WORKSPACE/job.conf (the folder of its path) once the run
    # is known to be this job's (the workspace claimed, a resumed checkpoint this job's), never by a refused run
    write_job: bool = False
    resume_hint: str | None = None  # how the caller resumes, when not by the command (the API's fit(...))
    # the caller's words for an option when it is no command line (the API: "fit(..., resume=True)" for
    # --resume; "" where it has no such option): what a message tells the user to do
    spelling: dict[str, str] = dataclasses.field(default_factory=dict)

    def said(self, flag: str) -> str:
        """``flag`` (``--resume``) as the caller spells it."""
        return self.spelling.get(flag, flag)


@dataclasses.dataclass(frozen=True)
class Request:
    """One run as asked for: ``job`` (a path, or a config already read), where it writes
    (``workspace_of(cfg)``), the command and its options; ``checkpoints``: `test --checkpoint` files."""

    job: str | JobConfig
    workspace_of: Callable[[JobConfig], str]
    options: RunOptions = dataclasses.field(default_factory=RunOptions)
    command: str = TRAIN
    checkpoints: tuple[str, ...] = ()

    @property
    def trains(self) -> bool:
        return self.command == TRAIN


# options that may differ between ranks: each rank's own watchdog, the root's pruning and printing
PER_RANK_OPTIONS = {"seed", "steps", "workers", "stall_timeout", "keep", "profile", "trace", "debug", "resume_hint",
                    "spelling"}


def options_to_agree(options: RunOptions) -> list[tuple[str, str]]:
    """The run options every rank must share (seed, steps and workers are compared from the job as
    each rank reads it); --trace's file is the root's, but recording is collective."""
    pairs = [(f"--{name.replace('_', '-')}", str(value)) for name, value in dataclasses.asdict(options).items()
             if name not in PER_RANK_OPTIONS]
    return pairs + [("--trace", "on" if options.trace else "off")]
