"""Host lists for the supervisor (singa_mpi.communication.hosts): read from --hosts, a hostfile in
MPICH's or Open MPI's form, or Slurm's allocation; mapped to ranks as the launchers map them; handed
to each launcher in its own option."""
from __future__ import annotations

import os
import stat

import pytest

from singa_mpi.communication import hosts as H
from singa_mpi.communication.hosts import Host, HostListError
from singa_mpi.communication.launchers import OPTIONS_VARIABLE, Launcher


def test_a_host_list_on_the_command_line():
    assert H.parse_hosts("a:2, b:3,c") == [Host("a", 2), Host("b", 3), Host("c", 1)]
    with pytest.raises(HostListError, match=r"--hosts: 'b:two': slots 'two': expected a whole number of at least 1"):
        H.parse_hosts("a:2,b:two")
    with pytest.raises(HostListError, match="no hosts"):
        H.parse_hosts(" , ")


def test_hostfiles_in_either_mpi_s_form_with_comments(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the rack\nn01:4\nn02 slots=2 max_slots=8\n\nn03   # one slot\n")
    assert H.read_hostfile(str(path)) == [Host("n01", 4), Host("n02", 2), Host("n03", 1)]
    path.write_text("n01:4\nn02 slots=0\n")
    with pytest.raises(HostListError, match=rf"{path}:2: slots '0'"):
        H.read_hostfile(str(path))
    with pytest.raises(HostListError, match="cannot read it"):
        H.read_hostfile(str(tmp_path / "absent"))


def test_slurm_s_allocation_is_read_with_scontrol(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho node07 node08 node09\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = H.slurm_hosts({"SLURM_JOB_NODELIST": "node[07-09]", "SLURM_TASKS_PER_NODE": "2(x2),1"})
    assert found == [Host("node07", 2), Host("node08", 2), Host("node09", 1)]
    assert H.slurm_hosts({}) is None  # not in an allocation
    assert H.slurm_hosts({"SLURM_JOB_NODELIST": "node[07-09]", "SLURM_TASKS_PER_NODE": "2"}) is None  # 1 count, 3 nodes
    assert H.expand_counts("4(x3),2") == [4, 4, 4, 2] and H.expand_counts("x") == []


def test_ranks_fill_each_host_s_slots_in_order():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 1)]
    assert H.placement(hosts, 5) == [0, 0, 1, 1, 2]
    assert H.placement(hosts, 7) == [0, 0, 1, 1, 2, 0, 0]  # oversubscribed: round the list again
    assert H.ranks_on(hosts, 5, 1) == [2, 3] and H.total_slots(hosts) == 5
    assert H.placement([], 3) == []  # not known


def test_each_launcher_is_told_the_hosts_in_its_own_option(monkeypatch):
    monkeypatch.delenv(OPTIONS_VARIABLE, raising=False)
    hosts = [Host("a", 2), Host("b", 1)]
    assert Launcher("mpich", "mpiexec").command(3, hosts) == ["mpiexec", "-hosts", "a:2,b:1", "-n", "3"]
    assert Launcher("openmpi", "mpirun", ("--oversubscribe",)).command(3, hosts) == [
        "mpirun", "--oversubscribe", "--host", "a:2,b:1", "-n", "3"]
    assert Launcher("mpich", "mpiexec").command(2) == ["mpiexec", "-n", "2"]
    monkeypatch.setenv(OPTIONS_VARIABLE, "-launcher ssh -genv UCX_TLS 'tcp,self'")
    assert Launcher("mpich", "mpiexec").command(2, hosts[:1]) == [
        "mpiexec", "-launcher", "ssh", "-genv", "UCX_TLS", "tcp,self", "-hosts", "a:2", "-n", "2"]
