"""The hosts a job's ranks run on, as the supervisor sees them: read from ``--hosts``, a hostfile or
Slurm's allocation, mapped to ranks, and handed back to the launcher without a host that died.

A launcher fills each host's slots in order (MPICH's ``-hosts a:2,b:2`` and Open MPI's ``--host
a:2,b:2`` both put ranks 0-1 on a and 2-3 on b; so does Slurm's default block distribution), so a
rank's host follows from the list alone (:func:`placement`).  That lets the supervisor tell a lost
host from the run's events without comparing host names (``node07`` in a hostfile may be
``node07.cluster`` to the node itself): a host none of whose ranks said anything is gone.
Standard library only: this runs before any MPI is loaded.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess


class HostListError(ValueError):
    """A host list that cannot be read; the message names where and what was expected."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int  # ranks the launcher may place there


def parse_hosts(text: str, where: str = "--hosts") -> list[Host]:
    """``a:2,b:2`` (a host without ``:N`` has one slot)."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, slots = item.partition(":")
        hosts.append(Host(name, _slots(slots or "1", f"{where}: {item!r}")))
    if not hosts:
        raise HostListError(f"{where}: no hosts (expected HOST[:SLOTS],...)")
    return hosts


def read_hostfile(path: str) -> list[Host]:
    """A hostfile in MPICH's form (``host`` or ``host:N``) or Open MPI's (``host slots=N``); ``#`` comments."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise HostListError(f"--hostfile {path}: cannot read it: {err.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        name, _, slots = words[0].partition(":")
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "max_slots", "max-slots") and not slots:
                slots = value
        hosts.append(Host(name, _slots(slots or "1", where)))
    if not hosts:
        raise HostListError(f"--hostfile {path}: no hosts in it (expected lines 'HOST', 'HOST:N' or 'HOST slots=N')")
    return hosts


def _slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise HostListError(f"{where}: slots {text!r}: expected a whole number of at least 1")
    return int(text)


def slurm_hosts(environ: dict[str, str] | None = None) -> list[Host] | None:
    """The allocation's nodes with their task counts (``SLURM_JOB_NODELIST`` expanded by ``scontrol show
    hostnames``, ``SLURM_TASKS_PER_NODE`` such as ``2(x3),1``); None outside an allocation or without scontrol."""
    environ = os.environ if environ is None else environ
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    counts = environ.get("SLURM_TASKS_PER_NODE") or environ.get("SLURM_JOB_CPUS_PER_NODE")
    scontrol = shutil.which("scontrol")
    if not nodelist or not counts or scontrol is None:
        return None
    try:
        names = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                               timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    slots = expand_counts(counts)
    if len(slots) != len(names):
        return None
    return [Host(name, count) for name, count in zip(names, slots)]


def expand_counts(text: str) -> list[int]:
    """Slurm's compressed per-node counts: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found is None:
            return []
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def placement(hosts: list[Host], nranks: int) -> list[int]:
    """Each rank's host (an index into ``hosts``): the slots filled in order, as the launchers do.
    More ranks than slots: the launcher oversubscribes round the list again, so do we."""
    order = [index for index, host in enumerate(hosts) for _ in range(host.slots)]
    return [order[rank % len(order)] for rank in range(nranks)] if order else []


def ranks_on(hosts: list[Host], nranks: int, index: int) -> list[int]:
    return [rank for rank, host in enumerate(placement(hosts, nranks)) if host == index]


def host_option(flavor: str, hosts: list[Host]) -> list[str]:
    """The launcher's option that starts ranks on ``hosts``: MPICH's ``-hosts``, Open MPI's ``--host``."""
    listed = ",".join(f"{host.name}:{host.slots}" for host in hosts)
    return ["-hosts", listed] if flavor == "mpich" else ["--host", listed]


def total_slots(hosts: list[Host]) -> int:
    return sum(host.slots for host in hosts)


__all__ = ["Host", "HostListError", "parse_hosts", "read_hostfile", "slurm_hosts", "expand_counts", "placement",
           "ranks_on", "host_option", "total_slots"]
