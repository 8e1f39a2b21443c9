"""`partition_dim: auto` in a job file: read, validated, chosen once (rank 0) and trained."""
import pathlib
import subprocess
import sys

import pytest

import nets
from singa_mpi.checks.job import validate
from singa_mpi.config.load import AUTO, effective_partition_dim, parse_job
from singa_mpi.cost.auto import auto_layers, resolved
from singa_mpi.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def auto_mlp(data: str, workspace: str) -> str:
    text = nets.mlp(data, 16, "data", 2)
    text = text.replace("neuralnet { partition_dim: 0", "neuralnet { partition_dim: auto", 1)
    assert "partition_dim: auto" in text
    return text + f'\ncluster {{ workspace: "{workspace}" }}\n'


def test_auto_is_read_at_the_length_of_the_word(tmp_path):
    text = 'name: "t"\nneuralnet { partition_dim: auto  layer { name: "x" type: kBogus } }\n'
    with pytest.raises(ConfigError) as err:
        validate(parse_job(text, "job.conf"))
    assert "job.conf:2:" in str(err.value)  # file:line still right after the rewrite
    cfg = parse_job('neuralnet { partition_dim: auto }', "j.conf")
    assert cfg.proto.neuralnet.partition_dim == AUTO


def test_auto_layers_follow_the_net_default_and_keep_written_ones(tmp_path):
    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    cfg = parse_job(auto_mlp(data, str(tmp_path / "ws")), "auto.conf")
    validate(cfg)
    free = auto_layers(cfg)
    assert free and all(effective_partition_dim(cfg.proto, layer) == AUTO
                        for layer in cfg.proto.neuralnet.layer if layer.name in free)
    with pytest.raises(ConfigError, match="auto was not resolved"):
        resolved(cfg, None)
    chosen = resolved(cfg, {name: 0 for name in free})
    assert not auto_layers(chosen)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow
def test_an_auto_job_trains(tmp_path, ranks):
    from singa_mpi.communication.launchers import find_launcher

    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    job = tmp_path / "auto.conf"
    job.write_text(auto_mlp(data, str(tmp_path / "ws")))
    launcher = find_launcher()
    env = launcher.environ(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "singa_mpi", "train", str(job)]
    if ranks > 1:
        cmd = launcher.command(ranks) + cmd
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (tmp_path / "ws" / "checkpoint" / "step20.h5").exists()
    if ranks > 1:
        assert "partition_dim: auto chose" in out.stdout
        assert (tmp_path / "cache" / "singa_mpi" / "kernels.json").exists()  # rank 0 timed the kernels


def test_a_cd_job_is_refused_by_the_search_as_by_plan_cost(tmp_path, monkeypatch):
    """One rule: the model prices BP and BPTT steps.  `plan --auto` on a CD job used to price BP's
    programs (0.06 ms for conf/rbm_digits_1.conf); `partition_dim: auto` on one says where it is
    written and what to write instead."""
    from cost_support import RowKernels, rates
    from singa_mpi.cost.auto import choose, choose_for_job
    from singa_mpi.cost.model import NotPriced

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    text = nets.rbm(str(tmp_path / "unused.h5"), 8)
    with pytest.raises(NotPriced, match=r"passes only; .*positive.*: expected a BP or BPTT job"):
        choose(nets.job(text), 2, "shared_memory", RowKernels(), rates())
    auto = parse_job(text.replace("neuralnet { partition_dim: 0", "neuralnet { partition_dim: auto", 1), "rbm.conf")
    with pytest.raises(ConfigError, match=r"^rbm\.conf:\d+:\d+: partition_dim = auto: the cost model times .*"
                                          r"positive.*: expected partition_dim 0, 1 or -1"):
        choose_for_job(auto, 2)


def test_the_job_plan_auto_writes_loads_its_plugins_from_any_folder(tmp_path, monkeypatch):
    """`plan --auto -o elsewhere/chosen.conf` on conf/digits_swish_lion.conf wrote `plugin: "swish_lion.py"`,
    relative to the original job's folder: `check elsewhere/chosen.conf` could not find it."""
    import shutil

    from singa_mpi.config.load import load_job
    from singa_mpi.cost.auto import Choice, auto_report

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name in ("digits_swish_lion.conf", "swish_lion.py"):
        shutil.copy(ROOT / "conf" / name, jobs / name)
    monkeypatch.chdir(jobs)
    cfg = load_job("digits_swish_lion.conf")
    names = [layer.name for layer in cfg.proto.neuralnet.layer]
    monkeypatch.setattr("singa_mpi.cost.auto.choose_for_job",
                        lambda *args, **kwargs: Choice(dict.fromkeys(names, 0), 1e-3, 1e-3, 1, 0, placed=True))
    _, text = auto_report(cfg, 2, "shared_memory", None, False, 1)
    assert f'plugin: "{jobs / "swish_lion.py"}"' in text
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    written = parse_job(text, "chosen.conf")
    assert list(written.proto.plugin) == [str(jobs / "swish_lion.py")]


def test_plan_auto_of_an_auto_job_says_auto_and_writes_no_1000(tmp_path, monkeypatch):
    """`plan --auto` of a job written with `partition_dim: auto` marked every layer "(the job: 1000)", the
    number `auto` is read as, and wrote `partition_dim: 1000` into the chosen job's neuralnet."""
    from singa_mpi.cost.auto import Choice, auto_report

    cfg = parse_job(auto_mlp(str(tmp_path / "d.h5"), str(tmp_path / "ws")), "auto.conf")
    names = [layer.name for layer in cfg.proto.neuralnet.layer]
    monkeypatch.setattr("singa_mpi.cost.auto.choose_for_job",
                        lambda *args, **kwargs: Choice(dict.fromkeys(names, 0), 1e-3, 1e-3, 1, 0, placed=True))
    lines, text = auto_report(cfg, 2, "shared_memory", None, False, 1)
    marked = [line for line in lines if "(the job: " in line]
    assert len(marked) == len(names) and all(line.endswith("(the job: auto)") for line in marked), lines
    assert str(AUTO) not in text
    written = parse_job(text, "chosen.conf")
    assert not auto_layers(written) and {effective_partition_dim(written.proto, layer)
                                         for layer in written.proto.neuralnet.layer} == {0}
