"""Updaters and learning-rate schedules with SINGA 0.3's formulas (src/utils/updater.cc).

Per param, each step:  clip the gradient to [clip_low, clip_high] if clip_high > clip_low
(SINGA does this for kSGD, kNesterov, kAdaGrad and kRMSProp only; so do we);
lr = LR(step)·lr_scale; wd = weight_decay·wd_scale; grad *= grad_scale;
if wd > 0: grad += wd·data; then the rule of the updater type.  Where SINGA
differs from the textbook we follow SINGA by default:

* kAdam has no bias correction (``adam_conf { bias_correction: true }`` adds it);
* kAdamMax adds ``delta`` to its running maximum every step;
* kNesterov keeps ``history = momentum·history + lr·grad`` and steps by
  ``(1+momentum)·history - momentum·history_prev``.

The updater modifies ``param.grad`` in place (scaling, clipping, weight decay):
callers zero gradients before the next backward anyway.  Per-param state
(``history``, ``update``) is float32, allocated on first use, keyed by name.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from singa_mpi.errors import ConfigError
from singa_mpi.params import Param
from singa_mpi.proto import job_pb2

LR_SCHEDULES: dict[str, Callable[[job_pb2.LRGenProto], Callable[[int], float]]] = {}
UPDATERS: dict[str, type["Updater"]] = {}


def _schedule(name: str):
    def add(fn):
        LR_SCHEDULES[name] = fn
        return fn

    return add


def _require(ok: bool, field: str, value, expected: str) -> None:
    if not ok:
        raise ConfigError(f"updater.learning_rate.{field} = {value}: expected {expected}")


@_schedule("kFixed")
def _fixed(conf):
    return lambda step: conf.base_lr


@_schedule("kStep")
def _step(conf):
    freq = conf.step_conf.change_freq
    _require(freq > 0, "step_conf.change_freq", freq, "a positive number of steps")
    return lambda step: conf.base_lr * conf.step_conf.gamma ** (step // freq)  # integer division: a staircase


@_schedule("kFixedStep")
def _fixed_step(conf):
    steps, rates = list(conf.fixedstep_conf.step), list(conf.fixedstep_conf.step_lr)
    _require(len(steps) == len(rates) and steps, "fixedstep_conf", f"{len(steps)} steps/{len(rates)} step_lr",
             "as many step_lr as step values (at least one)")
    _require(steps == sorted(steps), "fixedstep_conf.step", steps, "increasing steps")

    def lr(step: int) -> float:
        # SINGA advances a stored index by at most one per call; for a monotone step this is the same
        current = rates[0]
        for boundary, rate in zip(steps, rates):
            if step >= boundary:
                current = rate
        return current

    return lr


@_schedule("kLinear")
def _linear(conf):
    freq = conf.linear_conf.change_freq
    _require(freq > 0, "linear_conf.change_freq", freq, "a positive number of steps")

    def lr(step: int) -> float:
        r = step / freq
        return (1 - r) * conf.base_lr + r * conf.linear_conf.final_lr  # not clamped past freq (SINGA)

    return lr


@_schedule("kExponential")
def _exponential(conf):
    freq = conf.exponential_conf.change_freq
    _require(freq > 0, "exponential_conf.change_freq", freq, "a positive number of steps")
    return lambda step: conf.base_lr / 2.0 ** (step / freq)


@_schedule("kInverse")
def _inverse(conf):
    c = conf.inverse_conf
    return lambda step: conf.base_lr * (1 + c.gamma * step) ** (-c.pow)


@_schedule("kInverseT")
def _inverse_t(conf):
    final = conf.inverset_conf.final_lr
    _require(final > 0, "inverset_conf.final_lr", final, "a positive time constant")
    return lambda step: conf.base_lr / (1 + step / final)


def make_schedule(conf: job_pb2.LRGenProto) -> Callable[[int], float]:
    name = job_pb2.ChangeMethod.Name(conf.type)
    if name not in LR_SCHEDULES:
        raise ConfigError(f"updater.learning_rate.type = {name}: expected one of {', '.join(sorted(LR_SCHEDULES))}")
    return LR_SCHEDULES[name](conf)


# ------------------------------------------------------------------ updaters

def _updater(name: str):
    def add(cls):
        UPDATERS[name] = cls
        return cls

    return add


class Updater:
    """Applies one step to a param in place, from ``param.grad``."""

    clips = False  # whether SINGA clips the gradient for this updater

    def __init__(self, conf: job_pb2.UpdaterProto):
        self.conf = conf
        self.learning_rate = make_schedule(conf.learning_rate)
        self.slots: dict[str, dict[str, np.ndarray]] = {}

    def _slot(self, param: Param, key: str) -> np.ndarray:
        slot = self.slots.setdefault(param.name, {})
        if key not in slot:
            slot[key] = np.zeros_like(param.data)
        return slot[key]

    def update(self, step: int, param: Param, grad_scale: float = 1.0) -> None:
        conf = self.conf
        grad, data = param.grad, param.data
        if self.clips and conf.clip_high > conf.clip_low:
            np.clip(grad, conf.clip_low, conf.clip_high, out=grad)
        lr = np.float32(self.learning_rate(step) * param.lr_scale)
        if grad_scale != 1.0:
            grad *= np.float32(grad_scale)
        wd = conf.weight_decay * param.wd_scale
        if wd > 0:
            grad += np.float32(wd) * data
        self.apply(param, grad, data, lr)

    def apply(self, param: Param, grad: np.ndarray, data: np.ndarray, lr: np.float32) -> None:
        raise NotImplementedError

    def state(self, param_name: str) -> dict[str, np.ndarray]:
        return dict(self.slots.get(param_name, {}))

    def load_state(self, param_name: str, state: dict[str, np.ndarray]) -> None:
        self.slots[param_name] = {k: np.array(v, np.float32) for k, v in state.items()}


@_updater("kSGD")
class SGD(Updater):
    """history = momentum·history - lr·grad; data += history (plain data -= lr·grad without momentum)."""

    clips = True

    def apply(self, param, grad, data, lr):
        momentum = self.conf.momentum
        grad *= lr
        if momentum > 0:
            history = self._slot(param, "history")
            history *= np.float32(momentum)
            history -= grad
            data += history
        else:
            data -= grad


@_updater("kNesterov")
class Nesterov(Updater):
    clips = True

    def apply(self, param, grad, data, lr):
        momentum = np.float32(self.conf.momentum)
        history = self._slot(param, "history")
        previous = history.copy()
        history *= momentum
        history += lr * grad
        data -= (1 + momentum) * history - momentum * previous


@_updater("kAdaGrad")
class AdaGrad(Updater):
    clips = True

    def apply(self, param, grad, data, lr):
        history = self._slot(param, "history")
        history += grad * grad
        data -= lr * grad / np.sqrt(history + np.float32(self.conf.delta))


@_updater("kRMSProp")
class RMSProp(Updater):
    clips = True

    def apply(self, param, grad, data, lr):
        rho = np.float32(self.conf.rmsprop_conf.rho)
        history = self._slot(param, "history")
        history *= rho
        history += (1 - rho) * grad * grad
        data -= lr * grad / np.sqrt(history + np.float32(self.conf.delta))


@_updater("kAdaDelta")
class AdaDelta(Updater):
    def apply(self, param, grad, data, lr):
        rho, delta = np.float32(self.conf.adadelta_conf.rho), np.float32(self.conf.delta)
        history, update = self._slot(param, "history"), self._slot(param, "update")
        history *= rho
        history += (1 - rho) * grad * grad
        step = grad * np.sqrt(update + delta) / np.sqrt(history + delta)
        update *= rho
        update += (1 - rho) * step * step
        data -= lr * step


@_updater("kAdam")
class Adam(Updater):
    def __init__(self, conf):
        super().__init__(conf)
        self.steps: dict[str, int] = {}

    def apply(self, param, grad, data, lr):
        c = self.conf.adam_conf
        b1, b2 = np.float32(c.beta1), np.float32(c.beta2)
        history, update = self._slot(param, "history"), self._slot(param, "update")
        history *= b1
        history += (1 - b1) * grad
        update *= b2
        update += (1 - b2) * grad * grad
        if c.bias_correction:
            t = self.steps[param.name] = self.steps.get(param.name, 0) + 1
            lr = np.float32(lr * math.sqrt(1 - c.beta2 ** t) / (1 - c.beta1 ** t))
        data -= lr * history / np.sqrt(update + np.float32(self.conf.delta))


@_updater("kAdamMax")
class AdamMax(Updater):
    def apply(self, param, grad, data, lr):
        c = self.conf.adammax_conf
        b1, b2 = np.float32(c.beta1), np.float32(c.beta2)
        history, update = self._slot(param, "history"), self._slot(param, "update")
        history *= b1
        history += (1 - b1) * grad
        np.maximum(update * b2, np.abs(grad), out=update)
        update += np.float32(self.conf.delta)
        data -= lr * history / update


def make_updater(conf: job_pb2.UpdaterProto) -> Updater:
    """The updater of ``conf``; ConfigError naming the field and the valid types otherwise."""
    name = job_pb2.UpdaterType.Name(conf.type)
    if name not in UPDATERS:
        raise ConfigError(f"updater.type = {name}: expected one of {', '.join(sorted(UPDATERS))}")
    return UPDATERS[name](conf)
