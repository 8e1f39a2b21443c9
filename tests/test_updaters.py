"""Learning-rate schedules and updaters against SINGA 0.3's formulas, computed independently in float64."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.errors import ConfigError
from singa_mpi.params import Param
from singa_mpi.proto import job_pb2
from singa_mpi.updaters import make_updater


def updater_conf(text: str) -> job_pb2.UpdaterProto:
    conf = job_pb2.UpdaterProto()
    text_format.Parse(text, conf)
    return conf


SCHEDULES = [
    ("type: kFixed base_lr: 0.1", {0: 0.1, 500: 0.1}),
    ("type: kStep base_lr: 0.1 step_conf { gamma: 0.5 change_freq: 10 }", {0: 0.1, 9: 0.1, 10: 0.05, 25: 0.025}),
    ("type: kFixedStep fixedstep_conf { step: 0 step: 5 step: 8 step_lr: 1 step_lr: 0.5 step_lr: 0.25 }",
     {0: 1, 4: 1, 5: 0.5, 7: 0.5, 8: 0.25, 100: 0.25}),
    ("type: kLinear base_lr: 1 linear_conf { change_freq: 10 final_lr: 0.5 }", {0: 1, 5: 0.75, 10: 0.5, 20: 0.0}),
    ("type: kExponential base_lr: 1 exponential_conf { change_freq: 4 }", {0: 1, 4: 0.5, 6: 2 ** -1.5}),
    ("type: kInverse base_lr: 0.01 inverse_conf { gamma: 0.0001 pow: 0.75 }",
     {0: 0.01, 1000: 0.01 * 1.1 ** -0.75}),
    ("type: kInverseT base_lr: 1 inverset_conf { final_lr: 4 }", {0: 1, 4: 0.5, 12: 0.25}),
]


@pytest.mark.parametrize("text,expected", SCHEDULES)
def test_learning_rate_schedules(text, expected):
    updater = make_updater(updater_conf(f"type: kSGD learning_rate {{ {text} }}"))
    for step, lr in expected.items():
        assert updater.learning_rate(step) == pytest.approx(lr, rel=1e-6), step


def reference(kind, conf, data, grads, lr_fn, lr_scale=1.0, wd_scale=1.0):
    """SINGA's update rules (facts reference §1.2), float64, one param."""
    data = data.astype(np.float64).copy()
    history = np.zeros_like(data)
    update = np.zeros_like(data)
    for step, grad in enumerate(grads):
        grad = grad.astype(np.float64).copy()
        if kind in ("kSGD", "kNesterov", "kAdaGrad", "kRMSProp") and conf.clip_high > conf.clip_low:
            grad = np.clip(grad, conf.clip_low, conf.clip_high)
        lr = lr_fn(step) * lr_scale
        wd = conf.weight_decay * wd_scale
        if wd > 0:
            grad = grad + wd * data
        m, delta = conf.momentum, conf.delta
        if kind == "kSGD":
            if m > 0:
                history = m * history - lr * grad
                data = data + history
            else:
                data = data - lr * grad
        elif kind == "kNesterov":
            tmp = history.copy()
            history = m * history + lr * grad
            data = data - ((1 + m) * history - m * tmp)
        elif kind == "kAdaGrad":
            history = history + grad ** 2
            data = data - lr * grad / np.sqrt(history + delta)
        elif kind == "kRMSProp":
            rho = conf.rmsprop_conf.rho
            history = rho * history + (1 - rho) * grad ** 2
            data = data - lr * grad / np.sqrt(history + delta)
        elif kind == "kAdaDelta":
            rho = conf.adadelta_conf.rho
            history = rho * history + (1 - rho) * grad ** 2
            tmp = grad * np.sqrt(update + delta) / np.sqrt(history + delta)
            update = rho * update + (1 - rho) * tmp ** 2
            data = data - lr * tmp
        elif kind == "kAdam":
            b1, b2 = conf.adam_conf.beta1, conf.adam_conf.beta2
            history = b1 * history + (1 - b1) * grad
            update = b2 * update + (1 - b2) * grad ** 2
            data = data - lr * history / np.sqrt(update + delta)
        elif kind == "kAdamMax":
            b1, b2 = conf.adammax_conf.beta1, conf.adammax_conf.beta2
            history = b1 * history + (1 - b1) * grad
            update = np.maximum(b2 * update, np.abs(grad)) + delta
            data = data - lr * history / update
    return data


UPDATERS = [
    ("kSGD", ""), ("kSGD", "momentum: 0.9 weight_decay: 0.01"), ("kSGD", "clip_low: -0.3 clip_high: 0.3"),
    ("kNesterov", "momentum: 0.8"), ("kAdaGrad", "delta: 0.001"), ("kRMSProp", "rmsprop_conf { rho: 0.9 }"),
    ("kAdaDelta", "adadelta_conf { rho: 0.95 } delta: 0.001"), ("kAdam", "adam_conf { beta1: 0.8 beta2: 0.9 }"),
    ("kAdamMax", "adammax_conf { beta1: 0.8 beta2: 0.9 } delta: 0.001"),
]


@pytest.mark.parametrize("kind,extra", UPDATERS)
def test_updaters_match_the_formulas(kind, extra):
    conf = updater_conf(f"type: {kind} {extra} learning_rate {{ type: kStep base_lr: 0.1 "
                        f"step_conf {{ gamma: 0.5 change_freq: 2 }} }}")
    updater = make_updater(conf)
    rng = np.random.default_rng(0)
    start = rng.normal(0, 1, (3, 4)).astype(np.float32)
    grads = [rng.normal(0, 1, (3, 4)).astype(np.float32) for _ in range(3)]
    pconf = job_pb2.ParamProto(name="w", lr_scale=2.0, wd_scale=0.5)
    param = Param(pconf, (3, 4), ((0, 3), (0, 4)))
    param.data[...] = start
    for step, grad in enumerate(grads):
        param.grad[...] = grad
        updater.update(step, param)
    expected = reference(kind, conf, start, grads, updater.learning_rate, lr_scale=2.0, wd_scale=0.5)
    np.testing.assert_allclose(param.data, expected, rtol=2e-5, atol=2e-6)


def test_grad_scale_and_state_round_trip():
    conf = updater_conf("type: kSGD momentum: 0.9 learning_rate { type: kFixed base_lr: 0.1 }")
    a, b = make_updater(conf), make_updater(conf)
    pa, pb = (Param(job_pb2.ParamProto(name="w"), (2,), ((0, 2),)) for _ in range(2))
    pa.grad[...] = [2.0, 4.0]
    a.update(0, pa, grad_scale=0.5)
    np.testing.assert_allclose(pa.data, [-0.1, -0.2])
    b.load_state("w", a.state("w"))
    pb.data[...] = pa.data
    for p, u in ((pa, a), (pb, b)):
        p.grad[...] = [1.0, 1.0]
        u.update(1, p)
    np.testing.assert_array_equal(pa.data, pb.data)


def test_adam_bias_correction_option():
    conf = updater_conf("type: kAdam adam_conf { bias_correction: true } learning_rate { type: kFixed base_lr: 0.1 }")
    p = Param(job_pb2.ParamProto(name="w"), (1,), ((0, 1),))
    p.grad[...] = 0.5
    make_updater(conf).update(0, p)
    assert p.data[0] == pytest.approx(-0.1, rel=1e-4)  # textbook Adam's first step is -lr·sign(g)


@pytest.mark.parametrize("text,message", [
    ("learning_rate { type: kFixed }", "updater.type = kUserUpdater: expected one of kAdaDelta, kAdaGrad"),
    ("type: kSGD", "updater.learning_rate.type = kUserChange: expected one of kExponential, kFixed"),
    ("type: kSGD learning_rate { type: kStep }", "step_conf.change_freq = 0"),
    ("type: kSGD learning_rate { type: kFixedStep fixedstep_conf { step: 0 step_lr: 1 step_lr: 2 } }", "step_lr"),
])
def test_bad_configs_name_the_field(text, message):
    with pytest.raises(ConfigError, match=message):
        make_updater(updater_conf(text))
