"""Kernel co-runners (singa_mpi.cost.corunners): they build every kernel the parent times."""
import pathlib

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
