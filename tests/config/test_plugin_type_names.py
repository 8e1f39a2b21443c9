"""A plugin's names (SINGA's ``user_type``/``user_alg``) are never offered as values of the enum field
``type``/``alg``, which takes only built-ins: an unknown ``type`` lists the built-in ones, and a ``type``
that names a plugin's entry says to write ``user_type: "NAME"``. The campaign's line was
``type = kProbe: expected one of ..., kProbe, ...`` while ``type: kProbe`` is itself refused.

Checked for layers, updaters, learning rate schedules, init methods and algorithms; in this process
(the plugin loaded before, as a second job of one session meets it), and from the command line, where
the job's plugins (``--plugin`` or the job's ``plugin:`` line) are loaded only after the job parses."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from singa_mpi import plugins
from singa_mpi.checks.job import validate
from singa_mpi.config.load import load_job
from singa_mpi.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[2]
DIGITS = (REPO / "conf" / "digits_mlp.conf").read_text()

PLUGIN = '''
    import numpy as np

    from singa_mpi.algorithms import ALGORITHMS
    from singa_mpi.algorithms.bp import BackPropagation
    from singa_mpi.layers import LAYERS, Layer
    from singa_mpi.params import INITS
    from singa_mpi.updaters import LR_SCHEDULES, UPDATERS, LRSchedule, Updater


    @LAYERS.register("kProbe")
    class Probe(Layer):
        def setup(self, src_shapes):
            return tuple(src_shapes[0])

        def forward(self, inputs, train):
            return inputs[0]


    @UPDATERS.register("kProbeUpdater")
    class Keep(Updater):
        def apply(self, name, data, grad, lr):
            pass


    @LR_SCHEDULES.register("kProbeSchedule")
    class Fixed(LRSchedule):
        def __call__(self, step):
            return self.base_lr


    @INITS.register("kProbeInit")
    def sevens(gen, shape, rng):
        return np.full(shape, 7.0)


    @ALGORITHMS.register("kProbeAlg")
    class SameBP(BackPropagation):
        pass
    '''

# (what the job says instead of the digits job's own, the field's dotted name, its user field, the noun)
CASES = {
    "layer": (("type: kInnerProduct", "type: kProbe"), "layer 'fc1' (#2): type", "user_type", "layer"),
    "updater": (("type: kSGD", "type: kProbeUpdater"), "updater.type", "user_type", "updater"),
    "schedule": (("learning_rate { type: kStep", "learning_rate { type: kProbeSchedule"),
                 "updater.learning_rate.type", "user_type", "learning rate schedule"),
    "init": (("init { type: kConstant value: 0 }", "init { type: kProbeInit value: 0 }"),
             "layer 'fc1' (#2, kInnerProduct): param.init.type", "user_type", "init method"),
    "alg": (("alg: kBP", "alg: kProbeAlg"), "train_one_batch.alg", "user_alg", "algorithm"),
}


@pytest.fixture
def plugin_file(tmp_path) -> pathlib.Path:
    path = tmp_path / "probe_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN).lstrip())
    return path


def job_with(tmp_path, case: str, plugin_line: str = "") -> pathlib.Path:
    (old, new), *_ = CASES[case]
    assert old in DIGITS, old
    job = tmp_path / f"{case}.conf"
    job.write_text(plugin_line + DIGITS.replace(old, new, 1))
    return job


def expected_line(case: str) -> str:
    (_, new), field, user_field, noun = CASES[case]
    name = new.split()[-1] if case != "init" else "kProbeInit"
    return f"{field} = {name}: {name} is a plugin {noun}: write {user_field}: \"{name}\""


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_plugin_name_as_type_says_to_write_user_type(tmp_path, plugin_file, monkeypatch, case):
    monkeypatch.setattr(sys, "path", list(sys.path))
    plugins.load(str(plugin_file))
    job = job_with(tmp_path, case)
    with pytest.raises(ConfigError) as err:
        load_job(job)
    message = str(err.value)
    assert re.fullmatch(rf"{re.escape(str(job))}:\d+:\d+: {re.escape(expected_line(case))}", message), message


@pytest.mark.parametrize("how", ["--plugin", "plugin line"])
@pytest.mark.parametrize("case", ["layer", "updater"])
def test_from_the_command_line_too(tmp_path, plugin_file, case, how):
    job = job_with(tmp_path, case, f'plugin: "{plugin_file}"\n' if how == "plugin line" else "")
    extra = ["--plugin", str(plugin_file)] if how == "--plugin" else []
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "check", str(job), *extra], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.rstrip("\n").endswith(": " + expected_line(case)), done.stderr


def digits_with_the_plugin(tmp_path, plugin_file, monkeypatch, old: str, new: str):
    """The digits job with its first `old` replaced by `new`, and the plugin loaded (its names registered)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    plugins.load(str(plugin_file))
    job = tmp_path / "job.conf"
    job.write_text(DIGITS.replace(old, new, 1))
    return job


def test_an_unknown_type_lists_only_built_in_layers(tmp_path, plugin_file, monkeypatch):
    job = digits_with_the_plugin(tmp_path, plugin_file, monkeypatch, "type: kInnerProduct", "type: kInnerProdct")
    with pytest.raises(ConfigError) as err:
        load_job(job)
    message = str(err.value)
    assert "type = kInnerProdct: expected one of kAccuracy, " in message and "kInnerProduct" in message
    assert "kProbe" not in message and "did you mean 'kInnerProduct'?" in message, message


@pytest.mark.parametrize("unported", ["kConcate", "kDummy", "kSlice"])
def test_an_enum_layer_type_without_an_implementation_lists_only_built_ins(tmp_path, plugin_file, monkeypatch,
                                                                          unported):
    """These parse (they are SINGA's enum values) and are refused when the job is validated."""
    job = digits_with_the_plugin(tmp_path, plugin_file, monkeypatch, "type: kInnerProduct", f"type: {unported}")
    with pytest.raises(ConfigError) as err:
        validate(load_job(job))
    message = str(err.value)
    assert f"type = {unported}: expected one of kAccuracy, " in message and "kProbe" not in message, message


def test_a_missing_algorithm_offers_only_built_in_ones(tmp_path, plugin_file, monkeypatch):
    job = digits_with_the_plugin(tmp_path, plugin_file, monkeypatch, "train_one_batch { alg: kBP }", "")
    with pytest.raises(ConfigError) as err:
        validate(load_job(job))
    assert str(err.value).endswith("train_one_batch: missing: expected train_one_batch { alg: kBP } (or kBPTT, kCD)")
