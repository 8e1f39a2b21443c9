"""The one Registry type, and the six registries built on it (layers, algorithms, updaters,
LR schedules, init methods, store backends)."""
import subprocess
import sys
import textwrap
import types

import pytest

from singa_mpi.errors import ConfigError
from singa_mpi.registry import Registry

# ------------------------------------------------------------ the type itself


def test_decorator_and_direct_forms():
    reg = Registry("widget", "job.widget")

    @reg.register("kOne", "kUno")  # aliases: one object, several names
    class One:
        pass

    def two():
        pass

    assert reg.register("kTwo", obj=two) is two
    assert reg.get("kOne") is One and reg.get("kUno") is One and reg.get("kTwo") is two
    assert reg.names() == ["kOne", "kTwo", "kUno"] == list(reg)
    assert "kUno" in reg and "kThree" not in reg and 3 not in reg
    assert len(reg) == 3


def test_names_are_free_strings():
    """No SINGA enum check: a plugin's own name is as good as kReLU."""
    reg = Registry("layer type")
    reg.register("MyLayer", obj=object)
    assert reg.get("MyLayer") is object


def test_unknown_name_lists_the_valid_ones():
    reg = Registry("updater", "updater.type")
    for name in ("kSGD", "kAdam"):
        reg.register(name, obj=name)
    with pytest.raises(ConfigError, match=r"^updater.type = kSGDD: expected one of kAdam, kSGD$"):
        reg.get("kSGDD")
    with pytest.raises(ConfigError, match=r"^thing = x: expected one of \(none registered\)$"):
        Registry("thing").get("x")


def test_duplicates_are_refused_naming_both():
    reg = Registry("widget")

    @reg.register("kA")
    class First:
        pass

    class Second:
        pass

    with pytest.raises(ValueError, match=r"widget kA registered twice: .*:.*First and .*:.*Second"):
        reg.register("kB", "kA", obj=Second)
    assert "kB" not in reg  # a refused call adds none of its names
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("kA", obj=First)  # even the same object: a name is registered once
    with pytest.raises(ValueError, match="registered twice"):
        reg.register_lazy("kA", "somewhere.else:Thing")
    reg.register_lazy("kL", "json:dumps")
    with pytest.raises(ValueError, match="widget kL registered twice: json:dumps and "):
        reg.register("kL", obj=Second)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register_lazy("kL", "json:dumps")


def test_names_and_lazy_targets_are_checked():
    reg = Registry("widget")
    with pytest.raises(ValueError, match="expected a non-empty string"):
        reg.register("", obj=object)
    with pytest.raises(ValueError, match="at least one name"):
        reg.register(obj=object)
    with pytest.raises(ValueError, match="widget kX: lazy target 'json.dumps': expected 'package.module:Attr'"):
        reg.register_lazy("kX", "json.dumps")


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A module ``fake_plugin`` (not imported yet) whose decorator registers into ``holder.REG``."""
    holder = types.ModuleType("fake_plugin_holder")
    holder.REG = Registry("widget")
    monkeypatch.setitem(sys.modules, "fake_plugin_holder", holder)
    (tmp_path / "fake_plugin.py").write_text(textwrap.dedent("""
        from fake_plugin_holder import REG

        @REG.register("kPlugin", "kPluginAlias")
        class Plugin:
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_plugin", raising=False)
    yield holder.REG
    sys.modules.pop("fake_plugin", None)


def test_lazy_entry_is_imported_on_first_lookup(plugin_module):
    reg = plugin_module
    reg.register_lazy("kPlugin", "fake_plugin:Plugin")
    assert "kPlugin" in reg and reg.names() == ["kPlugin"]
    assert "fake_plugin" not in sys.modules  # listing and membership import nothing
    cls = reg.get("kPlugin")
    assert cls is sys.modules["fake_plugin"].Plugin
    # the module's decorator fulfilled the lazy entry and added its alias
    assert reg.get("kPluginAlias") is cls and reg.names() == ["kPlugin", "kPluginAlias"]


def test_lazy_entry_pointing_elsewhere_than_the_decorator_is_refused(plugin_module):
    reg = plugin_module
    reg.register_lazy("kPlugin", "fake_plugin:Other")
    with pytest.raises(ValueError, match="widget kPlugin registered twice: fake_plugin:Other and fake_plugin:Plugin"):
        reg.get("kPlugin")


def test_lazy_entry_without_a_decorator():
    reg = Registry("widget")
    reg.register_lazy("kDumps", "json:dumps")
    import json

    assert reg.get("kDumps") is json.dumps


@pytest.mark.parametrize("target, cause", [
    ("singa_mpi.no_such_module:Thing", "ModuleNotFoundError: No module named 'singa_mpi.no_such_module'"),
    ("singa_mpi.errors:NoSuchThing", "AttributeError: module 'singa_mpi.errors' has no attribute 'NoSuchThing'"),
])
def test_lazy_target_that_cannot_be_imported(target, cause):
    reg = Registry("widget")
    reg.register_lazy("kGone", target)
    with pytest.raises(ImportError) as info:
        reg.get("kGone")
    assert str(info.value) == f"widget kGone: cannot load {target} ({cause})"
    assert "kGone" in reg  # still listed: the next lookup says the same


# ------------------------------------------------------------ the six registries

LAYER_TYPES = {  # every name the layer registry had before it became a Registry
    "kAccuracy", "kActivation", "kArgSort", "kCConvolution", "kCPooling", "kCSVInput", "kCSVOutput",
    "kConvolution", "kCudnnActivation", "kCudnnConv", "kCudnnLRN", "kCudnnPool", "kCudnnSoftmax",
    "kCudnnSoftmaxLoss", "kDropout", "kEmbedding", "kEuclideanLoss", "kImagePreprocess", "kInnerProduct",
    "kLRN", "kOneHot", "kPooling", "kReLU", "kRecordInput", "kRecordOutput", "kSTanh", "kSigmoid",
    "kSoftmax", "kSoftmaxLoss", "kRBMVis", "kRBMHid", "kBM", "kCudnnBM",
    "kShardData", "kMnist", "kRGBImage", "kLabel",
    "kCharRNN", "kRNNLabel", "kCharRNNOutput", "kRNNDummy",
    "kGRU",
}


def test_built_in_layers_are_all_there_and_match_their_decorators():
    from singa_mpi.layers import batchnorm, conv, input, loss, neuron, output, parser, rbm  # noqa: F401  (decorators ran)
    from singa_mpi.layers.base import LAYERS, Layer, layer_class

    assert set(LAYERS) == LAYER_TYPES  # a decorator name missing from base's lazy table would show here
    for name in LAYER_TYPES:
        assert issubclass(layer_class(name), Layer)
    assert layer_class("kCudnnConv") is conv.Convolution is layer_class("kConvolution")


def test_parsing_suggests_the_built_in_layers_without_importing_them():
    """A misspelt ``type`` lists the layer types a job may write: the LayerType values the built-in
    layers register.  Parsing knows them from the enum (it imports no layer): the enum less the
    kUser placeholder, the retired types and those no job writes."""
    from singa_mpi.config.parse_errors import _enum_choices
    from singa_mpi.layers.base import LAYERS
    from singa_mpi.proto import job_pb2

    enum = job_pb2.LayerType.keys()
    assert _enum_choices("singa.LayerType") == [name for name in LAYERS.builtin_names() if name in enum]
    assert set(_enum_choices("singa.LayerType")) == LAYER_TYPES


def test_other_built_ins_are_all_there():
    from singa_mpi.algorithms import ALGORITHMS
    from singa_mpi.algorithms.bp import BackPropagation
    from singa_mpi.algorithms.cd import ContrastiveDivergence
    from singa_mpi.data.stores import BACKENDS
    from singa_mpi.params import INITS
    from singa_mpi.updaters import LR_SCHEDULES, UPDATERS

    assert ALGORITHMS.names() == ["kBP", "kBPTT", "kCD"] and ALGORITHMS.get("kBP") is BackPropagation
    assert ALGORITHMS.get("kCD") is ContrastiveDivergence
    assert set(UPDATERS) == {"kSGD", "kNesterov", "kAdaGrad", "kRMSProp", "kAdaDelta", "kAdam", "kAdamMax"}
    assert set(LR_SCHEDULES) == {"kFixed", "kStep", "kFixedStep", "kLinear", "kExponential", "kInverse",
                                 "kInverseT"}
    assert set(INITS) == {"kConstant", "kGaussian", "kUniform", "kGaussianSqrtFanIn", "kUniformSqrtFanIn",
                          "kUniformSqrtFanInOut"}
    assert BACKENDS.names() == ["hdf5", "kvfile", "memory", "shard", "textfile"]


def test_a_plugin_layer_with_its_own_name(monkeypatch):
    from singa_mpi.layers.base import LAYERS, Layer, layer_class

    @LAYERS.register("MyLayer")  # from outside singa_mpi: a plugin's name (forgotten after the test)
    class MyLayer(Layer):
        pass

    assert layer_class("MyLayer") is MyLayer and LAYERS.user_names() == ["MyLayer"]


def test_lookups_import_families_on_demand_without_cycles():
    """base lists the families as strings: importing it imports none, and nothing cycles back."""
    script = textwrap.dedent("""
        import sys
        import singa_mpi.layers.base as base
        loaded = lambda: sorted(m for m in sys.modules if m.startswith("singa_mpi.layers."))
        assert loaded() == ["singa_mpi.layers.base"], loaded()
        assert len(base.LAYERS.names()) > 20 and loaded() == ["singa_mpi.layers.base"]
        assert base.layer_class("kReLU").__module__ == "singa_mpi.layers.neuron"
        assert loaded() == ["singa_mpi.layers.base", "singa_mpi.layers.neuron"], loaded()
        import singa_mpi.config.parse_errors
        assert "singa_mpi.net" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
