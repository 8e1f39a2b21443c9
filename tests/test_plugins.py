"""User plugins (singa_mpi.plugins): where they load from, how a job selects their entries by name
(SINGA 0.3's user_type / user_alg), the one-line errors they make at 1 rank and under mpiexec, the
Python-declared [extensions], and the checks of singa_mpi.testing on the shipped example
(conf/swish_lion.py + conf/digits_swish_lion.conf).

Every test runs inside ``plugins.isolated()`` (tests/conftest.py): what a test loads is forgotten
after it.  Plugin files are written into tmp_path; module names differ from test to test so that
no import cache can hand one test another test's module.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import nets
import numpy as np
import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from mpi_jobs import mpi_env, mpiexec_command

from singa_mpi import cli, plugins
from singa_mpi.algorithms import ALGORITHMS
from singa_mpi.checks.job import validate
from singa_mpi.communication.local import run_ranks
from singa_mpi.config.load import load_job, parse_job
from singa_mpi.data.convert import convert_digits
from singa_mpi.errors import ConfigError
from singa_mpi.launcher import RunOptions, run_training
from singa_mpi.layers import LAYERS
from singa_mpi.params import INITS
from singa_mpi.plugins import PluginError
from singa_mpi.proto import job_pb2
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.testing import build_layer, check_equivalence, check_layer_gradients
from singa_mpi.trainer import Trainer
from singa_mpi.updaters import LR_SCHEDULES, UPDATERS

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE_JOB = ROOT / "conf" / "digits_swish_lion.conf"
EXAMPLE_PLUGIN = ROOT / "conf" / "swish_lion.py"


@pytest.fixture(autouse=True)
def _sys_path_restored(monkeypatch):
    """plugins.load puts a plugin file's folder on sys.path (so it imports its siblings): undone here."""
    monkeypatch.setattr(sys, "path", list(sys.path))


# ------------------------------------------------------------------ helpers: plugin files, data, jobs

def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    importlib.invalidate_caches()  # a folder already on sys.path sees the new file
    return path


def layer_plugin(name: str, factor: float = 2.0, extra: str = "") -> str:
    """A plugin registering ``name``: an element-wise y = factor·x layer (any split of rows or features)."""
    return f'''
        from singa_mpi.layers import LAYERS, Layer

        @LAYERS.register("{name}")
        class Scaled(Layer):
            factor = {factor}

            def setup(self, src_shapes):
                return tuple(src_shapes[0])

            def forward(self, inputs, train):
                return self.factor * inputs[0]

            def backward(self, grad, need):
                return [self.factor * grad if need[0] else None]
        {extra}
        '''


# a plugin that registers a layer and an updater, then raises on import (line 10)
BOOM = '''
    from singa_mpi.layers import LAYERS, Layer
    from singa_mpi.updaters import UPDATERS, Updater

    @LAYERS.register("kHalfLayer")
    class Half(Layer):
        pass
    UPDATERS.register("kHalfUpdater", obj=type("HalfUpdater", (Updater,), {}))

    raise RuntimeError("kaboom in the plugin")
    '''
BOOM_LINE = 9

# a plugin registering a fresh name, then one the example plugin holds (kSwish)
DUP = '''
    from singa_mpi.layers import LAYERS, Layer

    @LAYERS.register("kFreshName")
    class Fresh(Layer):
        pass

    @LAYERS.register("kSwish")
    class AnotherSwish(Layer):
        pass
    '''


def tiny_data(folder: pathlib.Path, name: str = "data.h5", count: int = 32) -> str:
    """A 6-feature, 3-class HDF5 store of ``count`` samples."""
    folder.mkdir(parents=True, exist_ok=True)
    return nets.make_data(str(folder / name), count, (6,), 3)


def small_job(data: str, *, plugin_lines: str = 'plugin: "swish_lion.py"',
              act: str = 'layer { name: "act" user_type: "kSwish" srclayers: "fc1" [swish_conf] { beta: 1.5 } }',
              alg: str = "train_one_batch { alg: kBP }",
              updater: str = 'updater { user_type: "kLion" [lion_conf] { beta1: 0.9 beta2: 0.99 } '
                             'learning_rate { type: kFixed base_lr: 0.01 } }',
              w1_init: str = "type: kGaussian std: 0.3", steps: int = 3, batch: int = 8) -> str:
    """data(6) - fc1(5) - ACT - fc2(3) - softmax loss; ``act`` is a layer named "act" reading "fc1"."""
    return textwrap.dedent(f"""\
        {plugin_lines}
        name: "small-plugin-job" seed: 2 train_steps: {steps} disp_freq: 1
        {alg}
        {updater}
        neuralnet {{
          layer {{ name: "data" type: kRecordInput
                  store_conf {{ backend: "hdf5" path: "{data}" batchsize: {batch} shape: 6 }} }}
          layer {{ name: "fc1" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 5 }}
                  param {{ name: "w1" init {{ {w1_init} }} }} param {{ name: "b1" init {{ type: kConstant value: 0 }} }} }}
          {act}
          layer {{ name: "fc2" type: kInnerProduct srclayers: "act" innerproduct_conf {{ num_output: 3 }}
                  param {{ name: "w2" init {{ type: kGaussian std: 0.3 }} }} param {{ name: "b2" init {{ type: kConstant value: 0 }} }} }}
          layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc2" srclayers: "data" }}
        }}
        """)


def serial_trainer(cfg, workspace: pathlib.Path) -> Trainer:
    validate(cfg)
    return Trainer(cfg, str(workspace), SerialRuntime(cfg, cfg.proto.seed, str(workspace)), log=lambda line: None)


# ------------------------------------------------------------------ 1. loading

def test_a_py_file_loads_and_lists_what_it_registered(tmp_path):
    path = write(tmp_path / "pt_file_plugin.py", layer_plugin("kPtFileLayer", extra="""
        from singa_mpi.updaters import UPDATERS, Updater

        @UPDATERS.register("kPtFileUpdater")
        class Keep(Updater):
            def apply(self, name, data, grad, lr):
                pass
        """))
    assert "kPtFileLayer" not in LAYERS
    plugin = plugins.load(str(path))
    assert plugin.module == "pt_file_plugin" and plugin.how == "--plugin" and plugin.spec == str(path)
    assert plugin.origin == str(path)
    assert plugin.names == {"layer type": ["kPtFileLayer"], "updater": ["kPtFileUpdater"]}
    assert plugin.summary() == f"plugin {path} (--plugin): layer type: kPtFileLayer; updater: kPtFileUpdater"
    assert LAYERS.get("kPtFileLayer").factor == 2.0 and "kPtFileUpdater" in UPDATERS
    assert plugins.loaded() == [plugin]


def test_a_module_name_loads_from_sys_path(tmp_path, monkeypatch):
    write(tmp_path / "pt_mod_plugin.py", layer_plugin("kPtModLayer", 3.0))
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = plugins.load("pt_mod_plugin")
    assert plugin.module == "pt_mod_plugin" and plugin.origin == str(tmp_path / "pt_mod_plugin.py")
    assert plugin.names == {"layer type": ["kPtModLayer"]}
    assert LAYERS.get("kPtModLayer").factor == 3.0


def test_a_package_folder_loads_with_its_submodules(tmp_path):
    package = tmp_path / "pt_pkg_plugin"
    write(package / "__init__.py", "from . import layers, inits  # each registers on import\n")
    write(package / "layers.py", layer_plugin("kPtPkgLayer", 4.0))
    write(package / "inits.py", """
        import numpy as np
        from singa_mpi.params import INITS

        @INITS.register("kPtPkgInit")
        def sevens(gen, shape, rng):
            return np.full(shape, 7.0)
        """)
    plugin = plugins.load(str(package))
    assert plugin.module == "pt_pkg_plugin" and plugin.origin == str(package / "__init__.py")
    assert plugin.names == {"init method": ["kPtPkgInit"], "layer type": ["kPtPkgLayer"]}
    assert LAYERS.get("kPtPkgLayer").factor == 4.0
    assert INITS.get("kPtPkgInit")(job_pb2.ParamGenProto(), (2,), None).tolist() == [7.0, 7.0]


def test_the_jobs_plugin_field_is_found_beside_the_job_from_another_folder(tmp_path, monkeypatch):
    jobs, elsewhere = tmp_path / "jobs", tmp_path / "elsewhere"
    write(jobs / "pt_beside.py", layer_plugin("kPtBeside", 0.5))
    data = tiny_data(tmp_path)
    act = 'layer { name: "act" user_type: "kPtBeside" srclayers: "fc1" }'
    write(jobs / "job.conf", small_job(data, plugin_lines='plugin: "pt_beside.py"', act=act,
                                       updater="updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }"))
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # pt_beside.py is not here
    cfg = load_job("../jobs/job.conf")
    [plugin] = plugins.loaded()
    assert plugin.how == "job ../jobs/job.conf" and plugin.origin == str(jobs / "pt_beside.py")
    assert plugin.names == {"layer type": ["kPtBeside"]}
    summary = validate(cfg)
    assert ("act", "kPtBeside", (5,)) in summary.phases[0].layers


def test_the_working_directory_comes_before_the_jobs_folder(tmp_path, monkeypatch):
    jobs, here = tmp_path / "jobs", tmp_path / "here"
    write(jobs / "pt_where.py", layer_plugin("kPtInJobFolder"))
    write(here / "pt_where.py", layer_plugin("kPtInWorkingDir"))
    write(jobs / "job.conf", small_job(tiny_data(tmp_path), plugin_lines='plugin: "pt_where.py"',
                                       act='layer { name: "act" user_type: "kPtInWorkingDir" srclayers: "fc1" }',
                                       updater="updater { type: kSGD learning_rate { type: kFixed } }"))
    monkeypatch.chdir(here)
    load_job(str(jobs / "job.conf"))
    assert "kPtInWorkingDir" in LAYERS and "kPtInJobFolder" not in LAYERS
    assert plugins.loaded()[0].origin == str(here / "pt_where.py")


def test_loading_the_same_plugin_again_is_a_no_op(tmp_path, monkeypatch):
    # the plugin notes each import of itself in a file beside it: a re-import would add a line
    path = write(tmp_path / "pt_once.py", layer_plugin("kPtOnce", extra="""
        with open(__file__ + ".imports", "a") as log:
            log.write("imported\\n")
        """))
    first = plugins.load(str(path))
    assert plugins.load(str(path)) is first
    monkeypatch.chdir(tmp_path)
    assert plugins.load("pt_once.py") is first  # the same file, written relative to the working directory
    assert plugins.load("pt_once") is first  # by its module name
    job = tmp_path / "job.conf"  # and from a job that names it
    write(job, small_job(tiny_data(tmp_path), plugin_lines='plugin: "pt_once.py"',
                         act='layer { name: "act" user_type: "kPtOnce" srclayers: "fc1" }',
                         updater="updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }"))
    validate(load_job(str(job)))
    assert plugins.loaded() == [first]
    assert (tmp_path / "pt_once.py.imports").read_text() == "imported\n"


def test_two_files_of_one_module_name_are_refused(tmp_path):
    first = plugins.load(str(write(tmp_path / "a" / "pt_same_name.py", layer_plugin("kPtSameA"))))
    other = write(tmp_path / "b" / "pt_same_name.py", layer_plugin("kPtSameB"))
    with pytest.raises(PluginError, match=rf"^plugin {other}: its module name 'pt_same_name' is taken by "
                                          rf"{tmp_path / 'a' / 'pt_same_name.py'}: expected a file name no other "
                                          rf"module uses \(rename it\)$"):
        plugins.load(str(other))
    assert "kPtSameB" not in LAYERS and plugins.loaded() == [first]


def test_a_refused_file_of_a_taken_module_name_leaves_the_first_module_in_place(tmp_path):
    first = plugins.load(str(write(tmp_path / "a" / "pt_kept_name.py", layer_plugin("kPtKeptA"))))
    with pytest.raises(PluginError, match="its module name 'pt_kept_name' is taken"):
        plugins.load(str(write(tmp_path / "b" / "pt_kept_name.py", layer_plugin("kPtKeptB"))))
    # a sibling plugin importing the first one (`from swish_lion import Swish`) must get that module,
    # not run it a second time (which registers its names again: DuplicateName)
    assert sys.modules.get("pt_kept_name") is not None
    assert sys.modules["pt_kept_name"].__file__ == first.origin


def test_the_plugin_option_of_the_cli_loads_before_the_job(tmp_path, capsys):
    path = write(tmp_path / "pt_cli_plugin.py", layer_plugin("kPtCli"))
    job = write(tmp_path / "job.conf", small_job(tiny_data(tmp_path), plugin_lines="",
                                                 act='layer { name: "act" user_type: "kPtCli" srclayers: "fc1" }',
                                                 updater="updater { type: kSGD learning_rate { type: kFixed } }"))
    assert cli.main(["check", str(job), "-v", "--plugin", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{job}: OK  job 'small-plugin-job'  kBP  kSGD  3 steps" in out
    assert any(line.split()[:2] == ["act", "kPtCli"] for line in out.splitlines())
    assert [p.how for p in plugins.loaded()] == ["--plugin"]


def test_fingerprints_name_each_module_and_the_digest_of_its_file(tmp_path):
    one = write(tmp_path / "a" / "pt_print_one.py", layer_plugin("kPtPrintOne"))
    two = write(tmp_path / "b" / "pt_print_two.py", layer_plugin("kPtPrintTwo", 5.0))
    assert plugins.fingerprints() == []
    plugins.load(str(two))
    plugins.load(str(one))

    def digest(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12]

    assert plugins.fingerprints() == [f"pt_print_one {digest(one)}", f"pt_print_two {digest(two)}"]
    assert digest(one) != digest(two)  # other code, other fingerprint


def test_a_package_fingerprint_covers_its_submodules(tmp_path):
    """Ranks whose package differs only below its __init__.py load different code: their digests differ."""
    def package(where, body):
        write(where / "pt_print_pkg" / "__init__.py", "from . import layers\n")
        write(where / "pt_print_pkg" / "layers.py", body)
        return where / "pt_print_pkg"

    plugin = plugins.load(str(package(tmp_path / "a", layer_plugin("kPtPkg"))))
    assert plugins.fingerprints() == [f"pt_print_pkg {plugin.digest}"]
    other = package(tmp_path / "b", layer_plugin("kPtPkg", 5.0))  # the same __init__.py, another submodule
    assert plugins._digest(str(other / "__init__.py")) != plugin.digest
    assert plugins._digest(str(tmp_path / "a" / "pt_print_pkg" / "__init__.py")) == plugin.digest


def test_a_plugin_file_named_like_an_imported_module_is_refused_and_that_module_kept(tmp_path):
    import numpy

    path = write(tmp_path / "numpy.py", layer_plugin("kPtNumpy"))
    with pytest.raises(PluginError, match="its module name 'numpy' is taken by"):
        plugins.load(str(path))
    assert sys.modules["numpy"] is numpy and str(tmp_path) not in sys.path and "kPtNumpy" not in LAYERS


# ------------------------------------------------------------------ 2. entry points

def fake_distribution(folder: pathlib.Path, name: str, entry_points: str) -> None:
    """An installed distribution as importlib.metadata finds it on sys.path: NAME-0.1.dist-info/."""
    info = folder / f"{name}-0.1.dist-info"
    write(info / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    write(info / "entry_points.txt", f"[singa_mpi.plugins]\n{entry_points}\n")


def test_an_entry_point_naming_a_module_registers_on_import(tmp_path, monkeypatch):
    fake_distribution(tmp_path, "myplug", "mine = myplug_mod")
    write(tmp_path / "myplug_mod.py", layer_plugin("kPtEntryLayer", 6.0))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    assert "kPtEntryLayer" not in LAYERS
    plugins.load_entry_points()
    assert LAYERS.get("kPtEntryLayer").factor == 6.0
    [plugin] = plugins.loaded()
    assert plugin.how == "entry point mine" and plugin.spec == "mine = myplug_mod" and plugin.module == "myplug_mod"
    assert plugin.names == {"layer type": ["kPtEntryLayer"]}
    plugins.load_entry_points()  # once per process
    assert plugins.loaded() == [plugin]


def test_an_entry_point_naming_a_function_is_called(tmp_path, monkeypatch):
    fake_distribution(tmp_path, "myplugfn", "fn = myplug_fn_mod:register")
    write(tmp_path / "myplug_fn_mod.py", """
        from singa_mpi.layers import LAYERS, Layer

        CALLS = []


        def register():
            CALLS.append("register")

            @LAYERS.register("kPtEntryFnLayer")
            class Registered(Layer):
                pass
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    plugins.load_entry_points()
    assert sys.modules["myplug_fn_mod"].CALLS == ["register"]  # called once, with no arguments
    assert "kPtEntryFnLayer" in LAYERS
    [plugin] = plugins.loaded()
    assert plugin.names == {"layer type": ["kPtEntryFnLayer"]} and plugin.how == "entry point fn"


def test_a_job_reads_the_entry_points_before_it_is_checked(tmp_path, monkeypatch):
    fake_distribution(tmp_path, "myplugjob", "job = myplug_job_mod")
    write(tmp_path / "myplug_job_mod.py", layer_plugin("kPtEntryJobLayer"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    text = small_job(tiny_data(tmp_path), plugin_lines="",
                     act='layer { name: "act" user_type: "kPtEntryJobLayer" srclayers: "fc1" }',
                     updater="updater { type: kSGD learning_rate { type: kFixed } }")
    summary = validate(parse_job(text))
    assert ("act", "kPtEntryJobLayer", (5,)) in summary.phases[0].layers


# ------------------------------------------------------------------ 3. selected by name, SINGA 0.3 style

USER_BITS = '''
    """A user algorithm, updater, LR schedule, init method and layer, each noting its calls in CALLS."""
    import numpy as np

    from singa_mpi.algorithms import ALGORITHMS
    from singa_mpi.algorithms.bp import BackPropagation
    from singa_mpi.layers import LAYERS, Layer
    from singa_mpi.params import INITS
    from singa_mpi.updaters import LR_SCHEDULES, UPDATERS, LRSchedule, Updater

    CALLS = {"alg": [], "layer": [], "lr": [], "updates": [], "init": []}


    @LAYERS.register("kPtHalf")
    class Half(Layer):
        def setup(self, src_shapes):
            return tuple(src_shapes[0])

        def forward(self, inputs, train):
            CALLS["layer"].append(self.conf.name)
            return 0.5 * inputs[0]

        def backward(self, grad, need):
            return [0.5 * grad if need[0] else None]


    @ALGORITHMS.register("kPtCountingBP")
    class CountingBP(BackPropagation):
        def train_one_batch(self, net, on_layer_done=None):
            CALLS["alg"].append(len(net.params))
            super().train_one_batch(net, on_layer_done)


    @LR_SCHEDULES.register("kPtHalving")
    class Halving(LRSchedule):
        def __call__(self, step):
            lr = self.base_lr * 0.5 ** step
            CALLS["lr"].append((step, lr))
            return lr


    @UPDATERS.register("kPtPlainSGD")
    class PlainSGD(Updater):
        def apply(self, name, data, grad, lr):
            CALLS["updates"].append((name, lr, data.copy(), grad.copy()))
            data -= lr * grad


    @INITS.register("kPtRamp")
    def ramp(gen, shape, rng):
        CALLS["init"].append(tuple(shape))
        return gen.value * np.linspace(-1, 1, int(np.prod(shape))).reshape(shape)
    '''


def test_user_layer_algorithm_updater_schedule_and_init_are_selected_by_name(tmp_path):
    write(tmp_path / "pt_user_bits.py", USER_BITS)
    data = tiny_data(tmp_path)
    act = ('layer { name: "act" user_type: "kPtHalf" srclayers: "fc1" }\n'  # type absent
           'layer { name: "act2" type: kUserLayer user_type: "kPtHalf" srclayers: "act" }')
    text = small_job(data, plugin_lines='plugin: "pt_user_bits.py"', act=act, steps=4,
                     alg='train_one_batch { alg: kUserAlg user_alg: "kPtCountingBP" }',
                     updater='updater { user_type: "kPtPlainSGD" learning_rate { user_type: "kPtHalving" base_lr: 0.2 } }',
                     w1_init='user_type: "kPtRamp" value: 0.5').replace('srclayers: "act" innerproduct_conf { num_output: 3 }',
                                                                        'srclayers: "act2" innerproduct_conf { num_output: 3 }')
    job = write(tmp_path / "job.conf", text)
    cfg = load_job(str(job))
    [plugin] = plugins.loaded()
    assert plugin.names == {"algorithm": ["kPtCountingBP"], "init method": ["kPtRamp"], "layer type": ["kPtHalf"],
                            "learning rate schedule": ["kPtHalving"], "updater": ["kPtPlainSGD"]}
    module = sys.modules["pt_user_bits"]
    assert (ALGORITHMS.get("kPtCountingBP"), UPDATERS.get("kPtPlainSGD"), LR_SCHEDULES.get("kPtHalving"),
            INITS.get("kPtRamp"), LAYERS.get("kPtHalf")) == (module.CountingBP, module.PlainSGD, module.Halving,
                                                             module.ramp, module.Half)
    calls = module.CALLS
    trainer = serial_trainer(cfg, tmp_path / "ws")
    summary = validate(cfg)
    assert (summary.algorithm, summary.updater) == ("kPtCountingBP", "kPtPlainSGD")
    assert [(n, t) for n, t, _ in summary.phases[0].layers if n.startswith("act")] == [("act", "kPtHalf"),
                                                                                       ("act2", "kPtHalf")]
    # the user init method made w1 (and only w1)
    params = {p.name: p for p in trainer.train_net.params}
    w1 = params["w1"].data
    assert calls["init"] and set(calls["init"]) == {w1.shape}
    np.testing.assert_allclose(w1, 0.5 * np.linspace(-1, 1, w1.size).reshape(w1.shape), rtol=1e-6)
    calls["layer"].clear()
    for step in range(4):
        trainer.train_one_batch(step)
    assert len(calls["alg"]) == 4  # the user algorithm ran every step
    assert calls["layer"] == ["act", "act2"] * 4  # both user layers forwarded every step
    # the updater got the schedule's rate for each step, for each of the 4 params, and applied its own rule
    assert {step for step, _ in calls["lr"]} >= {0, 1, 2, 3}
    by_step = [sorted((name, lr) for name, lr, _, _ in calls["updates"][4 * s:4 * s + 4]) for s in range(4)]
    assert by_step == [sorted((name, pytest.approx(0.2 * 0.5 ** s)) for name in ("b1", "b2", "w1", "w2"))
                       for s in range(4)]
    _, lr, before, grad = calls["updates"][-4:][[u[0] for u in calls["updates"][-4:]].index("w1")]
    np.testing.assert_allclose(params["w1"].data, before - lr * grad, rtol=1e-6, atol=1e-7)
    assert np.abs(grad).max() > 0 and not np.allclose(params["w1"].data, 0.5 * np.linspace(-1, 1, w1.size)
                                                      .reshape(w1.shape))


def test_a_user_job_trains_end_to_end_from_the_cli(tmp_path, monkeypatch):
    """`singa-mpi train` with the example plugin: the user layer and updater train, metrics are written."""
    write(tmp_path / "swish_lion.py", EXAMPLE_PLUGIN.read_text())
    data = tiny_data(tmp_path, count=64)
    job = write(tmp_path / "job.conf", small_job(data, steps=30))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "job.conf", "--workspace", "ws"]) == 0
    lines = [json.loads(line) for line in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in lines if m["phase"] == "train"]
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert job.exists() and plugins.loaded()[0].names == {"layer type": ["kSwish"], "updater": ["kLion"]}


@pytest.mark.parametrize("field,edit,message", [
    ("user_alg", ("train_one_batch { alg: kBP }", 'train_one_batch { alg: kUserAlg user_alg: "kPtNoAlg" }'),
     "train_one_batch.user_alg = kPtNoAlg: expected the name of a plugin's algorithm (no loaded plugin"),
    ("updater", ('updater { type: kSGD', 'updater { user_type: "kPtNoUpdater"'),
     "updater.user_type = kPtNoUpdater: expected the name of a plugin's updater (no loaded "),
    ("schedule", ("learning_rate { type: kFixed", 'learning_rate { user_type: "kPtNoSchedule"'),
     "updater.learning_rate.user_type = kPtNoSchedule: expected the name of a plugin's learning rate schedule "),
    ("init", ("init { type: kGaussian std: 0.3 } } param { name: \"b1\"",
              "init { user_type: \"kPtNoInit\" } } param { name: \"b1\""),
     "init.user_type = kPtNoInit: expected the name of a plugin's init method (no "),
])
def test_an_unknown_user_name_is_one_line_naming_the_field(tmp_path, field, edit, message):
    text = small_job(tiny_data(tmp_path), plugin_lines="", act='layer { name: "act" type: kReLU srclayers: "fc1" }',
                     updater="updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }")
    assert edit[0] in text
    job = write(tmp_path / "job.conf", text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError) as err:
        validate(load_job(str(job)))
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{job}:") and message in text


# ------------------------------------------------------------------ 4. errors: one line, exit 2, at 1 and 2 ranks

def singa(args: list[str], cwd: pathlib.Path, nranks: int = 1) -> subprocess.CompletedProcess:
    env = mpi_env(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "singa_mpi", *args]
    if nranks > 1:
        cmd = mpiexec_command(nranks) + cmd
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                              check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{' '.join(cmd)} timed out: {err.stdout!r} {err.stderr!r}")


def single_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # under mpiexec too: rank 0 prints it, once
    assert lines[0].startswith("singa-mpi: error: "), lines[0]  # every rank failed alike
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0][len("singa-mpi: error: "):]


ERROR_CASES = {
    # name: (what the job's plugin lines become, the swish layer line, extra CLI args, fragments of the message)
    "unknown-user-type": ('plugin: "swish_lion.py"', 'layer { name: "act" user_type: "kSwsh" srclayers: "fc1" }', [],
                          [("layer 'act' (#2, kSwsh): user_type = kSwsh: expected one of the plugins' layers kSwish "
                            "(a built-in layer is selected by type, not user_type)")]),
    "import-fails": ('plugin: "swish_lion.py"\nplugin: "boom.py"', None, [],
                     [f"plugin boom.py: import failed: RuntimeError: kaboom in the plugin (boom.py:{BOOM_LINE})"]),
    "undeclared-field": ('plugin: "swish_lion.py"',
                         'layer { name: "act" user_type: "kSwish" srclayers: "fc1" [swish_conf] { bogus: 1 } }', [],
                         ["[swish_conf].bogus", "bogus"]),
    "undeclared-extension": ('plugin: "swish_lion.py"',
                             'layer { name: "act" user_type: "kSwish" srclayers: "fc1" [nobody_conf] { x: 1 } }', [],
                             ["layer 'act'", "[nobody_conf]: no loaded plugin declares this extension",
                              "loaded: swish_lion.py"]),
    "same-name-twice": ('plugin: "swish_lion.py"\nplugin: "dup.py"', None, [],
                        [("plugin dup.py: layer type kSwish is already registered by plugin swish_lion.py "
                          "(swish_lion:Swish)")]),
    "missing-file": ('plugin: "no_such_plugin.py"', None, [],
                     ["plugin no_such_plugin.py: no such file in the working directory"]),
    "missing-module": ('plugin: "no_such_plugin_module"', None, [],
                       ["plugin no_such_plugin_module: no module named 'no_such_plugin_module'"]),
    "missing-module-option": ('plugin: "swish_lion.py"', None, ["--plugin", "no_such_plugin_module"],
                              ["plugin no_such_plugin_module: no module named 'no_such_plugin_module'"]),
}


@pytest.fixture
def error_folder(tmp_path) -> pathlib.Path:
    write(tmp_path / "swish_lion.py", EXAMPLE_PLUGIN.read_text())
    write(tmp_path / "boom.py", BOOM)
    write(tmp_path / "dup.py", DUP)
    tiny_data(tmp_path)
    return tmp_path


@pytest.mark.parametrize("nranks", [1, 2], ids=["1-rank", "mpiexec-2"])
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_plugin_errors_are_one_line_with_exit_code_2(case, nranks, error_folder):
    plugin_lines, act, extra, fragments = ERROR_CASES[case]
    assert (error_folder / "boom.py").read_text().splitlines()[BOOM_LINE - 1].startswith("raise RuntimeError")
    text = small_job("data.h5", plugin_lines=plugin_lines, **({"act": act} if act else {}))
    write(error_folder / "job.conf", text)
    message = single_error_line(singa(["train", "job.conf", "--workspace", "ws", *extra], error_folder, nranks))
    for fragment in fragments:
        assert fragment in message, message
    if not extra:  # the job's line that causes it is named
        assert message.startswith("job.conf:") and message.split(":")[1].isdigit(), message
    assert not (error_folder / "ws" / "metrics.jsonl").exists()


SETUP_FAILS = '''
    from singa_mpi.layers import LAYERS, Layer

    @LAYERS.register("kPtSetupFails")
    class SetupFails(Layer):
        def setup(self, src_shapes):
            return {}["no such key"]  # the plugin's own bug
    '''


@pytest.mark.parametrize("nranks", [1, 2], ids=["1-rank", "mpiexec-2"])
def test_a_plugin_layer_whose_setup_raises_is_one_line_at_its_place_in_the_job(nranks, error_folder):
    """A bug in a plugin's setup (no config error: exit 1) printed Python's traceback, naming neither
    the layer nor the job's line; forward's and backward's already named the layer."""
    write(error_folder / "setup_fails.py", SETUP_FAILS)
    text = small_job("data.h5", plugin_lines='plugin: "setup_fails.py"',
                     act='layer { name: "act" user_type: "kPtSetupFails" srclayers: "fc1" }',
                     updater="updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }")
    write(error_folder / "job.conf", text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "kPtSetupFails" in row)
    result = singa(["train", "job.conf", "--workspace", "ws"], error_folder, nranks)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    errors = [row for row in result.stderr.splitlines() if "error" in row]
    assert len(errors) == 1, result.stderr
    assert errors[0].endswith(f"job.conf:{line}:3: layer 'act' (setup): KeyError: 'no such key'"), errors[0]
    if nranks == 1:  # --debug: the plugin's frame too
        debug = singa(["--debug", "check", "job.conf"], error_folder)
        assert debug.returncode == 1 and "Traceback" in debug.stderr and "setup_fails.py" in debug.stderr


def test_the_same_job_without_the_error_trains_under_mpiexec(error_folder):
    """The control of the cases above: the example plugin's layer and updater on 2 ranks (the ranks
    load the same plugin file, so their fingerprints agree)."""
    write(error_folder / "job.conf", small_job("data.h5", steps=3))
    done = singa(["train", "job.conf", "--workspace", "ws"], error_folder, nranks=2)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (error_folder / "ws" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]


def test_a_failed_import_takes_back_what_it_registered(tmp_path):
    path = write(tmp_path / "pt_boom.py", BOOM)
    for _ in range(2):  # nothing is cached: the second try fails the same way
        with pytest.raises(PluginError, match=rf"^plugin {path}: import failed: RuntimeError: kaboom in the plugin "
                                              rf"\(.*pt_boom.py:{BOOM_LINE}\)$") as err:
            plugins.load(str(path))
        assert err.value.exit_code == 2
        assert "kHalfLayer" not in LAYERS and "kHalfUpdater" not in UPDATERS
        assert "pt_boom" not in sys.modules and plugins.loaded() == []


def test_a_name_taken_twice_is_refused_and_the_second_plugin_leaves_nothing(tmp_path):
    swish = write(tmp_path / "swish_lion.py", EXAMPLE_PLUGIN.read_text())
    dup = write(tmp_path / "pt_dup.py", DUP)
    first = plugins.load(str(swish))
    with pytest.raises(PluginError, match=rf"^plugin {dup}: layer type kSwish is already registered by plugin "
                                          rf"{swish} \(swish_lion:Swish\): expected a name no other plugin "):
        plugins.load(str(dup))
    assert "kFreshName" not in LAYERS and LAYERS.get("kSwish").__module__ == "swish_lion"
    assert plugins.loaded() == [first] and "pt_dup" not in sys.modules


def test_a_plugin_may_reuse_a_built_in_name_which_user_type_selects(tmp_path):
    """As SINGA 0.3 (rnnlm's user_type "kEmbedding" beside the built-in): a plugin's names and the
    built-ins are two name spaces; user_type looks among the plugins' first, type among the built-ins."""
    plugin = plugins.load(str(write(tmp_path / "pt_builtin_name.py", layer_plugin("kReLU", 9.0))))
    assert plugin.names == {"layer type": ["kReLU"]}
    mine = text_format.Parse('name: "a" user_type: "kReLU"', job_pb2.LayerProto())
    built_in = text_format.Parse('name: "a" type: kReLU', job_pb2.LayerProto())
    assert LAYERS.select(mine).factor == 9.0
    assert LAYERS.select(built_in).__module__ == "singa_mpi.layers.neuron"
    assert LAYERS.get("kReLU").__module__ == "singa_mpi.layers.neuron"


def test_missing_plugins_are_plugin_errors(tmp_path):
    with pytest.raises(PluginError, match=r"^plugin nowhere/pt_missing.py: no such file in the working directory "
                                          rf"or {tmp_path}: expected a .py file"):
        plugins.load("nowhere/pt_missing.py", folder=str(tmp_path))
    with pytest.raises(PluginError, match=r"^plugin pt_missing_module: no module named 'pt_missing_module'"):
        plugins.load("pt_missing_module")
    with pytest.raises(PluginError, match=r"expected a module name or a .py file"):
        plugins.load("  ")
    # a module the plugin imports is missing: an import failure of the plugin, not "no such plugin"
    broken = write(tmp_path / "pt_needs_missing.py", "import pt_not_installed_anywhere\n")
    with pytest.raises(PluginError, match=r"plugin .*pt_needs_missing.py: import failed: ModuleNotFoundError: "
                                          r"No module named 'pt_not_installed_anywhere' \(.*pt_needs_missing.py:1\)"):
        plugins.load(str(broken))
    assert plugins.loaded() == []


# ------------------------------------------------------------------ 5. ranks with different plugins

def test_ranks_that_loaded_different_plugins_are_caught(tmp_path, monkeypatch):
    cfg = parse_job(small_job(tiny_data(tmp_path), plugin_lines="", act='layer { name: "act" type: kReLU srclayers: "fc1" }',
                              updater="updater { type: kSGD learning_rate { type: kFixed } }"))
    validate(cfg)

    def agree(comm):
        WorkerRuntime(cfg, 1, str(tmp_path / f"w{comm.rank}"), comm).check_agreement()
        return comm.rank

    monkeypatch.setattr(plugins, "fingerprints", lambda: ["pt_same 0123456789ab"])
    assert run_ranks(2, agree) == [0, 1]  # the same plugins everywhere: no complaint
    # each rank's thread is named local-rank-<r>: a plugin whose file differs on rank 1
    monkeypatch.setattr(plugins, "fingerprints",
                        lambda: [f"pt_mine {'aaaaaaaaaaaa' if threading.current_thread().name.endswith('0') else 'bbbbbbbbbbbb'}"])
    with pytest.raises(ConfigError, match=r"worker \d loaded plugins \[pt_mine \w+\] and worker \d \[pt_mine \w+\] "
                                          r"\(module and file digest\): expected every worker to load the same plugin"):
        run_ranks(2, agree)
    monkeypatch.setattr(plugins, "fingerprints",  # a plugin only rank 1 loaded
                        lambda: [] if threading.current_thread().name.endswith("0") else ["pt_extra 0123456789ab"])
    with pytest.raises(ConfigError, match="loaded plugins"):
        run_ranks(2, agree)


# ------------------------------------------------------------------ 6. extension()

def test_extension_fields_take_defaults_and_types():
    ext = plugins.extension("pt_fields_conf", slope=0.25, count=3, label="hi", flag=True, off=False, path=str,
                            steps=[int], names=[str], weights=[float], flags=[bool])
    fields = ext.message_type.fields_by_name

    def repeated_field(f) -> bool:  # protobuf 7 dropped FieldDescriptor.label
        return f.is_repeated if hasattr(f, "is_repeated") else f.label == FieldDescriptor.LABEL_REPEATED

    types = {name: (f.type, repeated_field(f)) for name, f in fields.items()}
    single, repeated = False, True
    assert types == {"slope": (FieldDescriptor.TYPE_FLOAT, single), "count": (FieldDescriptor.TYPE_INT32, single),
                     "label": (FieldDescriptor.TYPE_STRING, single), "flag": (FieldDescriptor.TYPE_BOOL, single),
                     "off": (FieldDescriptor.TYPE_BOOL, single), "path": (FieldDescriptor.TYPE_STRING, single),
                     "steps": (FieldDescriptor.TYPE_INT32, repeated), "names": (FieldDescriptor.TYPE_STRING, repeated),
                     "weights": (FieldDescriptor.TYPE_FLOAT, repeated), "flags": (FieldDescriptor.TYPE_BOOL, repeated)}
    assert ext.containing_type.full_name == job_pb2.LayerProto.DESCRIPTOR.full_name
    assert 1001 <= ext.number <= 1100 and ext.name == "pt_fields_conf"
    unset = text_format.Parse('name: "l" [pt_fields_conf] { }', job_pb2.LayerProto()).Extensions[ext]
    assert (unset.slope, unset.count, unset.label, unset.flag, unset.off, unset.path) == (0.25, 3, "hi", True, False, "")
    assert list(unset.steps) == [] and not unset.HasField("slope")
    written = text_format.Parse('name: "l" [pt_fields_conf] { slope: 2.5 count: -4 label: "x" flag: false path: "p" '
                                'steps: 1 steps: 5 names: "a" names: "b" weights: 0.5 flags: true }',
                                job_pb2.LayerProto()).Extensions[ext]
    assert (written.slope, written.count, written.label, written.flag, written.path) == (2.5, -4, "x", False, "p")
    assert (list(written.steps), list(written.names), list(written.weights), list(written.flags)) == \
        ([1, 5], ["a", "b"], [0.5], [True])
    with pytest.raises(text_format.ParseError, match=r"PtFieldsConfMessage.* no field named \"nope\""):
        text_format.Parse('name: "l" [pt_fields_conf] { nope: 1 }', job_pb2.LayerProto())


def test_extension_of_the_updater_and_of_the_job():
    updater_ext = plugins.extension("pt_updater_conf", extends="UpdaterProto", rho=0.5)
    job_ext = plugins.extension("pt_job_conf", extends="JobProto", note=str)
    assert updater_ext.containing_type.name == "UpdaterProto" and 101 <= updater_ext.number <= 200
    assert job_ext.containing_type.name == "JobProto" and 101 <= job_ext.number <= 200
    job = text_format.Parse('name: "j" [pt_job_conf] { note: "n" } updater { user_type: "kX" '
                            '[pt_updater_conf] { rho: 0.75 } }', job_pb2.JobProto())
    assert job.updater.Extensions[updater_ext].rho == 0.75 and job.Extensions[job_ext].note == "n"
    with pytest.raises(text_format.ParseError):  # an UpdaterProto extension is no layer's
        text_format.Parse('name: "l" [pt_updater_conf] { rho: 1 }', job_pb2.LayerProto())


def test_extension_numbers_are_given_from_the_top_of_the_range_and_declaring_twice_is_the_same():
    first = plugins.extension("pt_number_a_conf", extends="AlgProto", x=1)
    second = plugins.extension("pt_number_b_conf", extends="AlgProto", x=1)
    top = max(job_pb2.AlgProto.DESCRIPTOR.extension_ranges)[1] - 1  # the range's end is exclusive
    assert 101 <= second.number < first.number <= top == 200
    assert plugins.extension("pt_number_a_conf", extends="AlgProto", x=1) is first  # a plugin imported twice
    assert plugins.extension("pt_number_a_conf", extends="AlgProto", y=str) is first  # the first declaration holds
    chosen = plugins.extension("pt_number_c_conf", extends="AlgProto", number=150, x=1)
    assert chosen.number == 150
    with pytest.raises(ValueError, match="^extension pt_number_d_conf: "):  # a number another module took
        plugins.extension("pt_number_d_conf", extends="AlgProto", number=150, x=1)
    retry = plugins.extension("pt_number_d_conf", extends="AlgProto", x=1)  # the refused one left nothing behind
    assert retry.number not in (first.number, second.number, 150)


def test_a_plugin_file_declares_extensions_a_job_writes(tmp_path):
    write(tmp_path / "pt_ext_plugin.py", layer_plugin("kPtExtLayer", extra="""
        from singa_mpi.plugins import extension

        GAIN = extension("pt_gain_conf", gain=1.0, tags=[str])
        NOTE = extension("pt_note_conf", extends="JobProto", text="none")
        """))
    act = ('layer { name: "act" user_type: "kPtExtLayer" srclayers: "fc1" '
           '[pt_gain_conf] { gain: 3.5 tags: "a" tags: "b" } }')
    text = small_job(tiny_data(tmp_path), plugin_lines='plugin: "pt_ext_plugin.py"\n[pt_note_conf] { text: "mine" }',
                     act=act, updater="updater { type: kSGD learning_rate { type: kFixed } }")
    cfg = load_job(str(write(tmp_path / "job.conf", text)))
    module = sys.modules["pt_ext_plugin"]
    layer = next(layer for layer in cfg.proto.neuralnet.layer if layer.name == "act")
    assert layer.Extensions[module.GAIN].gain == 3.5 and list(layer.Extensions[module.GAIN].tags) == ["a", "b"]
    assert cfg.proto.Extensions[module.NOTE].text == "mine"
    validate(cfg)


@pytest.mark.parametrize("fields,extends,message", [
    ({"x": [int, str]}, "LayerProto", r"x = \[<class 'int'>, <class 'str'>\]: expected \[bool\], \[int\]"),
    ({"x": [dict]}, "LayerProto", r"x = \[<class 'dict'>\]: expected \[bool\], \[int\], \[float\] or \[str\]"),
    ({"x": []}, "LayerProto", r"x = \[\]: expected \[bool\]"),
    ({"x": b"bytes"}, "LayerProto", r"x = b'bytes': expected a default or a type among bool, int, float, str"),
    ({"x": None}, "LayerProto", r"x = None: expected a default or a type"),
    ({"x": dict}, "LayerProto", r"x = <class 'dict'>: expected a default or a type"),
    ({"x": 1}, "NoSuchProto", r"extends = 'NoSuchProto': expected a message of job.proto with an extension range"),
    ({"x": 1}, "CDProto", r"extends = 'CDProto': expected a message of job.proto with an extension range"),
])
def test_a_bad_extension_spec_is_a_value_error(fields, extends, message):
    name = f"pt_bad_{abs(hash((repr(fields), extends))) % 10**8}_conf"
    with pytest.raises(ValueError, match=rf"^extension {name}: {message}"):
        plugins.extension(name, extends=extends, **fields)
    good = plugins.extension(name, y=2)  # nothing of the refused declaration stayed in the pool
    assert list(good.message_type.fields_by_name) == ["y"]


# ------------------------------------------------------------------ 7. the digits example, and the helpers

@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory) -> pathlib.Path:
    """A folder holding data/digits/{train,test}.h5, the relative paths of conf/digits_swish_lion.conf."""
    folder = tmp_path_factory.mktemp("digits")
    convert_digits(str(folder / "data" / "digits"))
    return folder


def test_the_digits_example_trains(digits_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(digits_folder)
    cfg = load_job(EXAMPLE_JOB)
    assert [p.spec for p in plugins.loaded()] == ["swish_lion.py"]
    assert run_training(cfg, lambda c: str(tmp_path / "ws"), RunOptions(steps=100)) == 0
    lines = [json.loads(line) for line in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    tests = [m for m in lines if m["phase"] == "test"]
    assert [m["step"] for m in tests] == [0, 100]
    assert tests[-1]["loss"] < 0.5 * tests[0]["loss"]
    assert tests[-1]["accuracy"] > 0.8 and tests[0]["accuracy"] < 0.3


def test_swish_passes_the_gradient_check_and_a_wrong_gradient_fails_it(tmp_path):
    plugins.load(str(EXAMPLE_PLUGIN))
    rng = np.random.default_rng(0)
    for beta in (1.0, 1.5):
        layer = build_layer(f'name: "s" user_type: "kSwish" [swish_conf] {{ beta: {beta} }}', [(16,)], batch=4)
        assert layer.beta == beta
        check_layer_gradients(layer, [rng.standard_normal((4, 16))])
    # the same layer with the sigmoid's derivative term left out
    write(tmp_path / "pt_bad_swish.py", """
        from singa_mpi.layers import LAYERS
        from swish_lion import Swish

        @LAYERS.register("kPtBadSwish")
        class BadSwish(Swish):
            def backward(self, grad, need):
                return [grad * self.s]
        """)
    plugins.load(str(tmp_path / "pt_bad_swish.py"))
    layer = build_layer('name: "s" user_type: "kPtBadSwish"', [(16,)], batch=4)
    with pytest.raises(AssertionError, match=r"input\[0\]\[.*\]: numerical .* != analytic"):
        check_layer_gradients(layer, [rng.standard_normal((4, 16))])


def test_the_digits_example_is_equivalent_on_2_and_3_workers(digits_folder, monkeypatch):
    monkeypatch.chdir(digits_folder)
    metrics = check_equivalence(str(EXAMPLE_JOB), workers=(2, 3), steps=3, partition_dims=(0, 1))
    assert len(metrics["loss"]) == 3 and metrics["loss"][-1] < metrics["loss"][0]


EQUIVALENCE_PLUGIN = '''
    """A user BP (written out, counting its calls), a correct user layer, and a wrong one."""
    from singa_mpi.algorithms import ALGORITHMS
    from singa_mpi.algorithms.base import Algorithm, backward_pass, forward_pass
    from singa_mpi.layers import LAYERS, Layer

    CALLS = []


    @ALGORITHMS.register("kPtMyBP")
    class MyBP(Algorithm):
        def train_one_batch(self, net, on_layer_done=None):
            CALLS.append(1)
            net.zero_grads()
            forward_pass(net, "forward", train=True)
            backward_pass(net, on_layer_done)
            net.finish_grads()


    class Elementwise(Layer):
        def setup(self, src_shapes):
            return tuple(src_shapes[0])

        def forward(self, inputs, train):
            self.scale = self.factor(inputs[0])
            return inputs[0] * self.scale

        def backward(self, grad, need):
            return [grad * self.scale if need[0] else None]


    @LAYERS.register("kPtGood")
    class Good(Elementwise):
        def factor(self, x):
            return 0.5


    @LAYERS.register("kPtPerRows")
    class PerRows(Elementwise):
        """Wrong: divides by the rows it sees, not by the global batch (self.ctx.global_batch)."""

        def factor(self, x):
            return 4.0 / x.shape[0]


    BLAS_THREADS = []


    @LAYERS.register("kPtBlasProbe")
    class BlasProbe(Good):
        """Good, noting numpy's BLAS threads while the calling thread computes (threadpoolctl)."""

        def factor(self, x):
            import threading
            from blas_threads import numpy_blas_threads  # tests/blas_threads.py

            BLAS_THREADS.append((threading.current_thread().name, numpy_blas_threads()))
            return 0.5
    '''


def equivalence_job(folder: pathlib.Path, layer_type: str) -> str:
    plugin = write(folder / "pt_equivalence.py", EQUIVALENCE_PLUGIN)
    return small_job(tiny_data(folder, count=64), plugin_lines=f'plugin: "{plugin}"', steps=3,
                     act=f'layer {{ name: "act" user_type: "{layer_type}" srclayers: "fc1" }}',
                     alg='train_one_batch { alg: kUserAlg user_alg: "kPtMyBP" }',
                     updater="updater { type: kSGD momentum: 0.9 learning_rate { type: kFixed base_lr: 0.1 } }")


def test_a_user_algorithm_passes_check_equivalence(tmp_path):
    metrics = check_equivalence(equivalence_job(tmp_path, "kPtGood"), workers=(2, 3), steps=3, partition_dims=(0, 1))
    assert len(metrics["loss"]) == 3 and all(np.isfinite(metrics["loss"]))
    # the user algorithm ran every step: serially, then on every rank of each of the 4 runs
    assert len(sys.modules["pt_equivalence"].CALLS) == 3 + 3 * (2 + 3) * 2


def test_check_equivalence_gives_each_worker_thread_its_share_of_the_cores(tmp_path, monkeypatch):
    """The workers are threads of one process, each calling numpy's BLAS: cores // workers threads
    while they run, as `singa-mpi train` gives the ranks of a node (numpy's default, a thread per core
    for every worker, made a 784-1500-1000-10 MLP's check 2-2.5x slower on 2 cores).  The user's
    OMP_NUM_THREADS wins."""
    from blas_threads import numpy_blas_threads as numpy_blas
    from singa_mpi import threads

    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "cores_available", lambda: 4)
    job, before = equivalence_job(tmp_path, "kPtBlasProbe"), numpy_blas()

    def probed(workers: int) -> set[tuple[str, int]]:
        """What the probe noted on the workers' threads in a check on ``workers`` workers."""
        check_equivalence(job, workers=(workers,), steps=1, partition_dims=(0,))
        notes = sys.modules["pt_equivalence"].BLAS_THREADS  # the plugin is loaded by the check
        seen = {(name, count) for name, count in notes if name.startswith("local-rank-")}
        notes.clear()
        return seen

    for workers, share in ((2, 2), (4, 1)):
        assert probed(workers) == {(f"local-rank-{r}", share) for r in range(workers)}
        assert numpy_blas() == before  # given back
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's setting: nothing is limited
    assert probed(4) == {(f"local-rank-{r}", before) for r in range(4)}


def test_check_equivalence_catches_a_layer_that_depends_on_its_row_count(tmp_path):
    job = equivalence_job(tmp_path, "kPtPerRows")
    # serially the layer sees all 8 rows; split on features it still does, so that passes ...
    check_equivalence(job, workers=(2,), steps=2, partition_dims=(1,))
    # ... but on the batch each worker sees 4 rows and scales by twice as much
    with pytest.raises(AssertionError, match=r"^2 workers, partition_dim 0: step 0: "):
        check_equivalence(job, workers=(2,), steps=2, partition_dims=(0,))


def test_a_job_made_portable_names_its_plugin_files_by_absolute_path(tmp_path, monkeypatch):
    """A copy of a job written in another folder (plan --auto -o, the Python API's job.conf) must load
    the plugin its `plugin: "swish_lion.py"` found beside the original job."""
    from singa_mpi.proto import job_pb2

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "mine.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    job = job_pb2.JobProto()
    job.plugin.extend(["mine.py", "pkg", "json", "gone.py"])
    plugins.made_portable(job, str(tmp_path / "jobs" / "job.conf"))
    assert list(job.plugin) == [str(tmp_path / "jobs" / "mine.py"), str(tmp_path / "pkg"), "json", "gone.py"]


BROKEN_LAYERS = '''
    import numpy as np
    from singa_mpi.layers import LAYERS, Layer

    class Passing(Layer):
        def setup(self, src_shapes):
            return tuple(src_shapes[0])

        def forward(self, inputs, train):
            return inputs[0]

        def backward(self, grad, need):
            return [grad if need[0] else None]

    @LAYERS.register("kPtDropsAColumn")
    class DropsAColumn(Passing):
        def forward(self, inputs, train):
            return inputs[0][:, 1:]

    @LAYERS.register("kPtDropsARow")
    class DropsARow(Passing):
        def forward(self, inputs, train):
            return inputs[0][1:]

    @LAYERS.register("kPtDoubles")
    class Doubles(Passing):
        def forward(self, inputs, train):
            return inputs[0].astype(np.float64)

    @LAYERS.register("kPtNoGradients")
    class NoGradients(Passing):
        def backward(self, grad, need):
            return None

    @LAYERS.register("kPtRaises")
    class Raises(Passing):
        def backward(self, grad, need):
            raise ValueError("boom in backward")

    @LAYERS.register("kPtNegativeShape")
    class NegativeShape(Passing):
        def setup(self, src_shapes):
            return (-5,)

    @LAYERS.register("kPtBadShardAxis")
    class BadShardAxis(Passing):
        def setup(self, src_shapes):
            self.declare_param(0, "scale", (src_shapes[0][0],), shard_axis=1)
            return tuple(src_shapes[0])

    @LAYERS.register("kPtNaN")
    class NaN(Passing):
        def forward(self, inputs, train):
            return inputs[0] * np.float32("nan")

    @LAYERS.register("kPtWrongGradient")
    class WrongGradient(Passing):
        def backward(self, grad, need):
            return [grad[:, :3]]
    '''


@pytest.mark.parametrize("layer_type, message", [
    ("kPtDropsAColumn", "layer 'act' (forward): ValueError: returned an array of shape (8, 4): expected (8, 5) "
                        "(its input's rows, then the shape its setup returned)"),
    ("kPtDropsARow", "layer 'act' (forward): ValueError: returned an array of shape (7, 5): expected (8, 5)"),
    ("kPtDoubles", "layer 'act' (forward): ValueError: returned float64 values: expected float32 (the layer contract)"),
    ("kPtNoGradients", "layer 'act' (backward): ValueError: backward returned NoneType: expected a list of 1 input "
                       "gradient(s), None where `need` is False"),
    ("kPtWrongGradient", "layer 'act' (backward): ValueError: backward returned a gradient of shape (8, 3) for "
                         "input 0: expected shape (8, 5)"),
])
def test_what_a_plugin_layer_returns_is_checked_at_that_layer(tmp_path, layer_type, message):
    """A wrong shape used to be blamed on the next layer (a matmul in fc2), or on the data (`359 labels
    for 358 rows`, exit 3); a backward returning None was a TypeError traceback naming no layer."""
    write(tmp_path / "broken.py", BROKEN_LAYERS)
    tiny_data(tmp_path)
    text = small_job("data.h5", plugin_lines='plugin: "broken.py"',
                     act=f'layer {{ name: "act" user_type: "{layer_type}" srclayers: "fc1" }}',
                     updater="updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }")
    write(tmp_path / "job.conf", text)
    result = singa(["train", "job.conf", "--workspace", "ws"], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    errors = [row for row in result.stderr.splitlines() if "error" in row]
    assert len(errors) == 1 and message in errors[0], result.stderr


def test_a_failure_every_rank_meets_is_said_once(tmp_path):
    """Both workers' backward raises at step 0: one line (the rank that claimed the job's verdict),
    where each rank used to print its own copy."""
    write(tmp_path / "broken.py", BROKEN_LAYERS)
    tiny_data(tmp_path)
    write(tmp_path / "job.conf", small_job("data.h5", plugin_lines='plugin: "broken.py"',
                                           act='layer { name: "act" user_type: "kPtRaises" srclayers: "fc1" }',
                                           updater="updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }"))
    result = singa(["train", "job.conf", "--workspace", "ws"], tmp_path, nranks=2)
    errors = [row for row in result.stderr.splitlines() if row.startswith("singa-mpi: ")]
    assert result.returncode != 0 and len(errors) == 1, result.stderr
    assert errors[0].endswith("error at step 0: layer 'act' (backward): ValueError: boom in backward"), errors[0]


@pytest.mark.parametrize("layer_type, extra, message", [
    ("kPtNegativeShape", [], "layer 'act' (setup): ValueError: setup returned (-5,): expected whole numbers > 0"),
    ("kPtBadShardAxis", ["-n", "2"], "layer 'act' (setup): ValueError: declare_param(0, 'scale'): shard_axis = 1: "
                                     "expected an axis of its 1-D shape (5,) (or None: not split)"),
])
def test_a_plugin_setup_that_returns_or_declares_no_shape_is_one_line_in_check(tmp_path, layer_type, extra, message):
    """`check` passed them; training then died in numpy ("negative dimensions"), or `check -n 2` in an
    IndexError traceback."""
    write(tmp_path / "broken.py", BROKEN_LAYERS)
    tiny_data(tmp_path)
    act = f'layer {{ name: "act" user_type: "{layer_type}" srclayers: "fc1" partition_dim: 1 param {{ name: "s" }} }}'
    write(tmp_path / "job.conf", small_job("data.h5", plugin_lines='plugin: "broken.py"', act=act,
                                           updater="updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }"))
    result = singa(["check", "job.conf", *extra], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    errors = [row for row in result.stderr.splitlines() if "error" in row]
    assert len(errors) == 1 and message in errors[0] and "job.conf:" in errors[0], result.stderr


def test_a_plugin_backend_named_like_a_built_in_is_refused(tmp_path):
    """store_conf.backend is one string: a plugin's "hdf5" was accepted, listed as the plugin's, and
    never used (the built-in always won)."""
    path = write(tmp_path / "pt_hdf5_backend.py", '''
        from singa_mpi.data.stores import BACKENDS
        BACKENDS.register("hdf5", obj=object())
        ''')
    with pytest.raises(plugins.PluginError) as err:
        plugins.load(str(path))
    assert str(err.value) == (f"plugin {path}: store backend hdf5 is a built-in one: expected a name of its own "
                              f"(a job names a store backend by one string, which finds the built-in)")


def test_check_equivalence_names_a_serial_nan_and_checks_an_auto_job_under_every_scheme(tmp_path):
    """A layer giving NaN was reported as a partitioning mismatch ("loss = nan, serially nan"); a job
    with partition_dim: auto failed with "partition_dim = 1: expected 0 or -1", a value it never wrote."""
    write(tmp_path / "broken.py", BROKEN_LAYERS)
    data = tiny_data(tmp_path, count=64)
    sgd = "updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }"
    nan = small_job(data, plugin_lines=f'plugin: "{tmp_path / "broken.py"}"', updater=sgd,
                    act='layer { name: "act" user_type: "kPtNaN" srclayers: "fc1" }')
    with pytest.raises(AssertionError, match=r"^serial run: step 0: loss = nan: the job gives non-finite values "):
        check_equivalence(nan, workers=(2,), steps=2)
    auto = small_job(data, plugin_lines="", updater=sgd, act='layer { name: "act" type: kReLU srclayers: "fc1" }'
                     ).replace("neuralnet {", "neuralnet { partition_dim: auto", 1)
    assert "partition_dim: auto" in auto
    check_equivalence(auto, workers=(2,), steps=2)
