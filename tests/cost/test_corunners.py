"""Kernel co-runners (singa_mpi.cost.corunners): they build every kernel the parent times."""
import pathlib

import pytest

from singa_mpi.config.load import load_job
from singa_mpi.cost.corunners import CoRunners, Kernel
from singa_mpi.cost.kernels import kernel_spec
from singa_mpi.planner import plan

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_corunner_builds_a_plugin_layer_of_the_job_from_another_folder(tmp_path, monkeypatch):
    """conf/digits_swish_lion.conf's kSwish comes from its plugin, named relative to the job's folder:
    the co-runner, a new process, loads it too (it used to refuse user_type kSwish)."""
    monkeypatch.chdir(tmp_path)
    the_plan = plan(load_job(str(ROOT / "conf" / "digits_swish_lion.conf")), 2)
    swish = next(sub for sub in the_plan.sublayers if sub.origin == "swish1")
    pool = CoRunners(1)
    try:
        with pool.alongside(kernel_spec(the_plan, swish)):
            assert pool.processes[0].poll() is None
    finally:
        pool.close()


def test_a_kernel_that_reads_ids_is_timed_on_ids_inside_its_vocabulary(tmp_path):
    """conf/char_rnn.conf's kOneHot was fed N(0, 1) floats: `id -1 outside the vocabulary 0..96`."""
    the_plan = plan(load_job(str(ROOT / "conf" / "char_rnn.conf")), 2)
    onehot = next(sub for sub in the_plan.sublayers if sub.origin and sub.origin.endswith("onehot"))
    kernel = Kernel(kernel_spec(the_plan, onehot), str(tmp_path))
    assert kernel.forward().sum() == len(kernel.inputs[0])  # one 1 per row


def _swish_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    the_plan = plan(load_job(str(ROOT / "conf" / "digits_swish_lion.conf")), 2)
    return kernel_spec(the_plan, next(sub for sub in the_plan.sublayers if sub.origin == "swish1"))


def test_an_interrupt_while_the_corunners_die_too_stays_the_interrupt(tmp_path, monkeypatch):
    """`timeout` sends SIGTERM to the co-runners as well as to the benchmark: the interrupt the
    benchmark reports on used to be replaced by "a kernel co-runner failed while stopping", and the
    device run's pipelines stage lost the table and JSON it had measured."""
    spec = _swish_spec(tmp_path, monkeypatch)
    pool = CoRunners(2)
    try:
        with pytest.raises(KeyboardInterrupt):
            with pool.alongside(spec):
                for process in pool.processes:
                    process.terminate()
                    process.wait()
                raise KeyboardInterrupt
        assert pool.processes == []
        with pool.alongside(spec):  # the next kernel starts new ones
            assert [process.poll() for process in pool.processes] == [None, None]
    finally:
        pool.close()


def test_a_failure_in_the_timed_block_ends_the_running_corunners_at_once(tmp_path, monkeypatch):
    spec = _swish_spec(tmp_path, monkeypatch)
    pool = CoRunners(1)
    try:
        with pytest.raises(ValueError, match="the block's own"):
            with pool.alongside(spec):
                running = list(pool.processes)
                raise ValueError("the block's own")
        assert [process.returncode is not None for process in running] == [True]
    finally:
        pool.close()
