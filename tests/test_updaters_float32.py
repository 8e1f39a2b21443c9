"""Every registered updater and learning-rate schedule keeps float32 params float32, and computes
in float32: no step of an update runs a float64 loop over a param-sized array.

An update writes into the param, its gradient and its state in place, so a float64 operand (an
``np.float64`` learning rate, a float64 constant) does not change their dtype: it makes every
element-wise pass run in float64 and cast back, twice the memory traffic.  The arrays are watched
(:class:`Watched`) to see each ufunc's operands.  The cases walk the registries: a new built-in
updater or schedule fails ``test_every_built_in_has_a_case`` until it has one here.
"""
from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.params import Param
from singa_mpi.proto import job_pb2
from singa_mpi.updaters import LR_SCHEDULES, UPDATERS, make_updater

F32 = np.dtype(np.float32)
STEPS = 60

SCHEDULES = {
    "kFixed": "type: kFixed base_lr: 0.05",
    "kStep": "type: kStep base_lr: 0.05 step_conf { gamma: 0.9 change_freq: 7 }",
    "kFixedStep": "type: kFixedStep fixedstep_conf { step: 0 step: 20 step_lr: 0.05 step_lr: 0.01 }",
    "kLinear": "type: kLinear base_lr: 0.05 linear_conf { change_freq: 100 final_lr: 0.01 }",
    "kExponential": "type: kExponential base_lr: 0.05 exponential_conf { change_freq: 30 }",
    "kInverse": "type: kInverse base_lr: 0.05 inverse_conf { gamma: 0.1 pow: 0.75 }",
    "kInverseT": "type: kInverseT base_lr: 0.05 inverset_conf { final_lr: 40 }",
}
UPDATERS_CASES = {  # every field that adds a term: momentum, weight decay, clipping, bias correction
    "kSGD": "momentum: 0.9 weight_decay: 0.01 clip_low: -1 clip_high: 1",
    "kNesterov": "momentum: 0.9 weight_decay: 0.01 clip_low: -1 clip_high: 1",
    "kAdaGrad": "delta: 1e-6 weight_decay: 0.01 clip_low: -1 clip_high: 1",
    "kRMSProp": "rmsprop_conf { rho: 0.95 } weight_decay: 0.01 clip_low: -1 clip_high: 1",
    "kAdaDelta": "adadelta_conf { rho: 0.9 } delta: 1e-4 weight_decay: 0.01",
    "kAdam": "adam_conf { beta1: 0.9 beta2: 0.999 bias_correction: true } weight_decay: 0.01",
    "kAdamMax": "adammax_conf { beta1: 0.9 beta2: 0.999 } delta: 1e-3 weight_decay: 0.01",
}


class Watched(np.ndarray):
    """An array that notes every ufunc it takes part in whose operands make a float64 (or wider)
    loop: ``Watched.wide`` lists them."""

    wide: list[str] = []

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = [x.view(np.ndarray) if isinstance(x, Watched) else x for x in inputs]
        outs = None if out is None else tuple(o.view(np.ndarray) if isinstance(o, Watched) else o for o in out)
        dtype = np.result_type(*plain)  # Python scalars are weak (NEP 50): they keep float32 float32
        if dtype.kind in "fc" and dtype.itemsize > (4 if dtype.kind == "f" else 8):
            Watched.wide.append(f"{ufunc.__name__}.{method}({', '.join(_describe(x) for x in inputs)}): {dtype}")
        result = getattr(ufunc, method)(*plain, **kwargs) if outs is None else \
            getattr(ufunc, method)(*plain, out=outs, **kwargs)
        return out[0] if out is not None and len(out) == 1 else result


def _describe(x) -> str:
    return f"array {x.dtype}" if isinstance(x, np.ndarray) else f"{type(x).__name__} {x!r}"


def _watch(updater) -> None:
    """Watch the updater's state and scratch arrays (made on its first update)."""
    for slots in updater._slots.values():
        for key, value in slots.items():
            slots[key] = value.view(Watched)
    updater._scratch = updater._scratch.view(Watched)


def test_every_built_in_has_a_case():
    assert set(LR_SCHEDULES.builtin_names()) - set(SCHEDULES) == set(), "add a case for each new schedule"
    assert set(UPDATERS.builtin_names()) - set(UPDATERS_CASES) == set(), "add a case for each new updater"


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_a_learning_rate_is_no_float64(name):
    """A rate is a Python float or a float32: a NumPy float64 would make each pass over a param float64."""
    updater = make_updater(text_format.Parse(f"type: kSGD learning_rate {{ {SCHEDULES[name]} }}",
                                             job_pb2.UpdaterProto()))
    for step in range(0, 10 * STEPS, 7):
        lr = updater.learning_rate(step)
        assert np.result_type(np.float32, lr) == F32, f"step {step}: learning rate {lr!r} ({type(lr).__name__})"


@pytest.mark.parametrize("exact", [False, True], ids=["blas", "exact"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("name", sorted(UPDATERS_CASES))
def test_an_update_keeps_float32_and_computes_in_float32(name, schedule, exact):
    conf = text_format.Parse(f"type: {name} {UPDATERS_CASES[name]} learning_rate {{ {SCHEDULES[schedule]} }}",
                             job_pb2.UpdaterProto())
    updater = make_updater(conf, exact=exact)
    param = Param(job_pb2.ParamProto(name="w", lr_scale=0.5, wd_scale=2), (6, 5), ((0, 6), (0, 5)))
    rng = np.random.default_rng(0)
    param.data[...] = rng.standard_normal(param.data.shape)
    param.data, param.grad = param.data.view(Watched), param.grad.view(Watched)
    Watched.wide = []
    for step in range(STEPS):
        param.grad[...] = rng.standard_normal(param.grad.shape)
        updater.update(step, param)
        if step == 0:
            _watch(updater)
    assert Watched.wide == []
    state = updater.state("w")
    assert {key: value.dtype for key, value in state.items()} == {key: F32 for key in state}
    assert param.data.dtype == param.grad.dtype == F32 and np.isfinite(param.data).all()
