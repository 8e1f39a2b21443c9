"""Updaters and learning-rate schedules with SINGA 0.3's formulas (``src/utils/updater.cc``).

Every step, for each param (shard or chunk) this rank owns, ``Updater.update``:

1. clips ``grad`` to [clip_low, clip_high] when clip_high > clip_low, for kSGD,
   kNesterov, kAdaGrad and kRMSProp only: SINGA's other updaters ignore the
   clip fields, and so do we (SINGA-exact);
2. lr = LR(step)·param.lr_scale;  wd = weight_decay·param.wd_scale;
3. grad *= grad_scale;  if wd > 0: grad += wd·data;
4. applies the rule of its type (``h`` = history, ``u`` = update, both per param)::

     kSGD       momentum > 0: h = m·h - lr·g; data += h      else: data -= lr·g
     kNesterov  h' = m·h + lr·g; data -= (1+m)·h' - m·h
     kAdaGrad   h += g²;                  data -= lr·g / sqrt(h + delta)
     kRMSProp   h = rho·h + (1-rho)·g²;   data -= lr·g / sqrt(h + delta)
     kAdaDelta  h = rho·h + (1-rho)·g²;   t = g·sqrt(u + delta) / sqrt(h + delta)
                u = rho·u + (1-rho)·t²;   data -= lr·t
     kAdam      h = b1·h + (1-b1)·g;  u = b2·u + (1-b2)·g²;  data -= lr·h / sqrt(u + delta)
     kAdamMax   h = b1·h + (1-b1)·g;  u = max(b2·u, |g|) + delta;  data -= lr·h / u

Where SINGA differs from the textbook we follow SINGA:

* kAdam has no bias correction.  ``adam_conf { bias_correction: true }`` (a
  singa_mpi field) gives textbook Adam: with t the number of updates of the
  param so far (counted per param, see ``counters``),
  ``data -= lr·(h/(1-b1^t)) / sqrt(u/(1-b2^t) + delta)`` (delta stays inside
  the square root, where SINGA puts it);
* kAdamMax adds ``delta`` to its running maximum on every step;
* kNesterov is the "look-ahead" form above, with lr folded into the history.

``param.grad`` is consumed: the updater clips, scales and adds weight decay to
it in place and then uses it as scratch space, so its contents afterwards are
unspecified (the algorithm zeroes gradients before the next backward).
Per-param state (``history``, ``update``) is float32 of the param's shape,
allocated on first use and keyed by the param's name; ``state``/``load_state``
move it to and from checkpoints.  Integer per-param counters (textbook Adam's
update count) are kept apart, in ``counters``/``load_counters``, so that every
state array has the param's shape and can be assembled from shards or chunks.
"""
from __future__ import annotations

import bisect
from typing import ClassVar

import numpy as np

from singa_mpi.errors import ConfigError
from singa_mpi.params import Param
from singa_mpi.proto import job_pb2
from singa_mpi.registry import Registry, selected_name


def _show(value: object) -> str:
    # proto floats are float32: print 0.9, not its float64 widening 0.8999999761581421
    return str(np.float32(value)) if isinstance(value, float) else str(value)


def _require(ok: bool, field: str, value: object, expected: str) -> None:
    """One-line ConfigError naming the updater field, its value and what was expected."""
    if not ok:
        raise ConfigError(f"updater.{field} = {_show(value)}: expected {expected}")


# ------------------------------------------------------------ learning rates

class LRSchedule:
    """The learning rate as a function of the training step (``LRGenProto``)."""

    def __init__(self, conf: job_pb2.LRGenProto):
        self.base_lr = conf.base_lr
        # a negative rate climbs the loss: a sign slip, never a schedule (0 freezes the params)
        _require(self.base_lr >= 0, "learning_rate.base_lr", self.base_lr, "a value >= 0")

    def __call__(self, step: int) -> float:
        raise NotImplementedError


LR_SCHEDULES: Registry[type[LRSchedule]] = Registry("learning rate schedule", "updater.learning_rate.type")


def _positive_freq(sub_conf, field: str) -> int:
    freq = sub_conf.change_freq
    _require(freq > 0, f"learning_rate.{field}.change_freq", freq, "a positive number of steps")
    return freq


@LR_SCHEDULES.register("kFixed")
class FixedLR(LRSchedule):
    """lr = base_lr."""

    def __call__(self, step: int) -> float:
        return self.base_lr


@LR_SCHEDULES.register("kStep")
class StepLR(LRSchedule):
    """lr = base_lr·gamma^(step // change_freq): a staircase (integer division)."""

    def __init__(self, conf):
        super().__init__(conf)
        self.gamma = conf.step_conf.gamma
        # a negative gamma flips the rate's sign every change_freq steps: a negative rate half the time
        _require(self.gamma >= 0, "learning_rate.step_conf.gamma", self.gamma, "a value >= 0")
        self.freq = _positive_freq(conf.step_conf, "step_conf")

    def __call__(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.freq)


@LR_SCHEDULES.register("kFixedStep")
class FixedStepLR(LRSchedule):
    """lr = step_lr[i] for the largest i with step >= step[i] (step_lr[0] before step[0]).

    SINGA keeps an index that advances by at most one per call; called on every
    step from 0 with increasing boundaries (as training does) that is this
    stateless rule.  It differs only when a run starts past two or more
    boundaries (a resume), where SINGA lags behind for a few steps and we do not.
    """

    def __init__(self, conf):
        super().__init__(conf)
        fixed = conf.fixedstep_conf
        self.steps, self.rates = list(fixed.step), list(fixed.step_lr)
        _require(len(self.steps) == len(self.rates) and self.steps, "learning_rate.fixedstep_conf",
                 f"{len(self.steps)} step / {len(self.rates)} step_lr values",
                 "one step_lr per step, at least one")
        _require(all(a < b for a, b in zip(self.steps, self.steps[1:])), "learning_rate.fixedstep_conf.step",
                 self.steps, "strictly increasing steps")
        _require(all(rate >= 0 for rate in self.rates), "learning_rate.fixedstep_conf.step_lr",
                 f"[{', '.join(_show(rate) for rate in self.rates)}]", "rates >= 0")

    def __call__(self, step: int) -> float:
        index = bisect.bisect_right(self.steps, step) - 1
        return self.rates[max(index, 0)]


@LR_SCHEDULES.register("kLinear")
class LinearLR(LRSchedule):
    """r = step / change_freq; lr = (1-r)·base_lr + r·final_lr; not clamped for r > 1 (SINGA)."""

    def __init__(self, conf):
        super().__init__(conf)
        self.final_lr = conf.linear_conf.final_lr
        # the rate heads for final_lr (and past it, unclamped): a negative one turns it negative
        _require(self.final_lr >= 0, "learning_rate.linear_conf.final_lr", self.final_lr, "a value >= 0")
        self.freq = _positive_freq(conf.linear_conf, "linear_conf")

    def __call__(self, step: int) -> float:
        r = step / self.freq
        return (1 - r) * self.base_lr + r * self.final_lr


@LR_SCHEDULES.register("kExponential")
class ExponentialLR(LRSchedule):
    """lr = base_lr / 2^(step / change_freq), with a real (not integer) exponent."""

    def __init__(self, conf):
        super().__init__(conf)
        self.freq = _positive_freq(conf.exponential_conf, "exponential_conf")

    def __call__(self, step: int) -> float:
        return self.base_lr / 2.0 ** (step / self.freq)


@LR_SCHEDULES.register("kInverse")
class InverseLR(LRSchedule):
    """lr = base_lr·(1 + gamma·step)^(-pow)."""

    def __init__(self, conf):
        super().__init__(conf)
        self.gamma, self.pow = conf.inverse_conf.gamma, conf.inverse_conf.pow
        _require(self.gamma >= 0, "learning_rate.inverse_conf.gamma", self.gamma, "a value >= 0")
        # an inverse schedule decays: with pow < 0 the rate grows with every step, without bound
        _require(self.pow >= 0, "learning_rate.inverse_conf.pow", self.pow,
                 "a value >= 0 (lr = base_lr·(1 + gamma·step)^(-pow): a negative pow makes the rate grow)")

    def __call__(self, step: int) -> float:
        return self.base_lr * (1 + self.gamma * step) ** (-self.pow)


@LR_SCHEDULES.register("kInverseT")
class InverseTLR(LRSchedule):
    """lr = base_lr / (1 + step / final_lr): SINGA uses final_lr as a time constant."""

    def __init__(self, conf):
        super().__init__(conf)
        self.time_constant = conf.inverset_conf.final_lr
        _require(self.time_constant > 0, "learning_rate.inverset_conf.final_lr", self.time_constant,
                 "a positive time constant (in steps)")

    def __call__(self, step: int) -> float:
        return self.base_lr / (1 + step / self.time_constant)


def make_schedule(conf: job_pb2.LRGenProto) -> LRSchedule:
    """The schedule of ``conf``; ConfigError listing the valid types otherwise."""
    return LR_SCHEDULES.select(conf, where="updater.learning_rate.")(conf)


# ------------------------------------------------------------------ updaters

UPDATERS: Registry[type[Updater]] = Registry("updater", "updater.type")


def _fraction(value: float, field: str) -> float:
    _require(0 <= value <= 1, field, value, "a decay rate in [0, 1]")
    return value


def _moving(value: float, field: str, stays: str) -> float:
    """A decay rate below 1: at 1 the average it keeps stays at its start, 0 (``stays``: what that does)."""
    _require(_fraction(value, field) < 1, field, value, f"a decay rate below 1 (at 1 {stays})")
    return value


# what a decay of 1 does to an average of gradients, and to one of their squares (a divisor)
_NEVER_MOVES = "the average of gradients stays 0: no step moves a weight"
_DIVIDES_BY_DELTA = ("the average of squares stays 0: each step is lr·g/sqrt(delta), 10,000·lr·g at the default "
                     "delta")


class Updater:
    """Applies one step to a param in place from ``param.grad``; keeps per-param state."""

    clips: ClassVar[bool] = False  # whether SINGA clips the gradient for this updater
    divides: ClassVar[bool] = False  # whether its rule divides by a history plus ``delta`` (or its root)
    state_arrays: ClassVar[int] = 1  # arrays of a param's shape it keeps per param (its slots)
    uses_scratch: ClassVar[bool] = True  # whether its rule works in the one scratch array (the largest param's size)

    @classmethod
    def kept_arrays(cls, conf: job_pb2.UpdaterProto) -> int:
        """Arrays of each param's shape this updater keeps for ``conf`` (the memory check counts them)."""
        return cls.state_arrays

    def __init__(self, conf: job_pb2.UpdaterProto):
        self.conf = conf
        self.schedule = make_schedule(conf.learning_rate)
        self.momentum, self.weight_decay, self.delta = conf.momentum, conf.weight_decay, conf.delta
        # m >= 1 keeps every gradient forever (h grows with each step): no run trains with it
        _require(0 <= self.momentum < 1, "momentum", self.momentum, "a value from 0 up to, not including, 1")
        _require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a value >= 0")
        # a history of zeros (a weight whose gradient is still 0) plus a negative delta is the root of a negative
        # number: NaN in the first step (0, textbook Adam's, is the caller's choice: it divides 0 by 0 there)
        _require(self.delta >= 0 or not self.divides, "delta", self.delta,
                 f"a value >= 0 for updater.type {selected_name(conf)} (it keeps the division by the history "
                 f"finite; default 1e-08)")
        self.clip = self._clip_bounds(conf)
        self._slots: dict[str, dict[str, np.ndarray]] = {}
        self._counters: dict[str, dict[str, int]] = {}
        self._scratch = np.empty(0, np.float32)
        self.axpy = axpy

    def exact_elementwise(self) -> None:
        """Deterministic mode: compute every element's update the same way wherever it sits, so that
        an update of a slice (a worker's tiles, a server's range) has the bits of the whole array's.
        BLAS ?axpy does not: OpenBLAS fuses its vector body's multiply-adds (FMA) but not its tail's,
        so an element's bits depend on its place in the call (``tests/test_updaters.py`` shows it);
        numpy's multiply then add rounds each element twice, everywhere (the product in the scratch
        array: ``axpy`` is called where no rule holds it)."""
        self.axpy = lambda alpha, x, y: exact_axpy(alpha, x, y, self._scratch_like(y))

    @staticmethod
    def _clip_bounds(conf: job_pb2.UpdaterProto) -> tuple[float, float] | None:
        # A lone bound would clip to [bound, 0] or [0, bound] (the other defaults to 0):
        # never what was meant, so both must be given.
        if conf.HasField("clip_low") != conf.HasField("clip_high"):
            missing = "clip_high" if conf.HasField("clip_low") else "clip_low"
            _require(False, missing, "(unset)", "both clip_low and clip_high when clipping gradients")
        if not conf.HasField("clip_low") or conf.clip_low == conf.clip_high == 0:
            return None
        _require(conf.clip_high > conf.clip_low, "clip_high", conf.clip_high,
                 f"a value > clip_low ({_show(conf.clip_low)})")
        return conf.clip_low, conf.clip_high

    def learning_rate(self, step: int) -> float:
        """LR(step), before the param's lr_scale."""
        return self.schedule(step)

    def update(self, step: int, param: Param, grad_scale: float = 1.0) -> None:
        """One step on ``param.data`` from ``param.grad`` (which is consumed, see the module doc)."""
        grad, data = param.grad, param.data
        if self.clips and self.clip is not None:
            np.clip(grad, self.clip[0], self.clip[1], out=grad)
        if grad_scale != 1.0:
            grad *= grad_scale
        wd = self.weight_decay * param.wd_scale
        if wd > 0:
            self.axpy(wd, data, grad)
        self.apply(param.name, data, grad, self.learning_rate(step) * param.lr_scale)

    def apply(self, name: str, data: np.ndarray, grad: np.ndarray, lr: float) -> None:
        """The updater's rule; ``grad`` already clipped, scaled and weight-decayed."""
        raise NotImplementedError

    # -------------------------------------------------------------- state
    def slot(self, name: str, key: str, shape: tuple[int, ...]) -> np.ndarray:
        slots = self._slots.setdefault(name, {})
        if key not in slots:
            slots[key] = np.zeros(shape, np.float32)
        elif slots[key].shape != shape:
            raise ValueError(f"updater state {key!r} of param {name!r} has shape {slots[key].shape}, "
                             f"the param {shape}: one updater serves each param shard once")
        return slots[key]

    def _scratch_like(self, array: np.ndarray) -> np.ndarray:
        """A reusable work array of ``array``'s shape and dtype (one buffer for all params)."""
        if self._scratch.size < array.size or self._scratch.dtype != array.dtype:
            self._scratch = np.empty(max(array.size, self._scratch.size), array.dtype)
        return self._scratch[:array.size].reshape(array.shape)

    def state(self, param_name: str) -> dict[str, np.ndarray]:
        """Copies of the param's state arrays, each of the param's shape (empty before its first update)."""
        return {key: value.copy() for key, value in self._slots.get(param_name, {}).items()}

    def load_state(self, param_name: str, state: dict[str, np.ndarray]) -> None:
        """Restore what ``state`` returned (as float32 copies); the next update continues from it."""
        self._slots[param_name] = {key: np.array(value, np.float32) for key, value in state.items()}

    def counters(self) -> dict[str, dict[str, int]]:
        """Integer per-param counters, {param name: {counter: value}} (empty for most updaters)."""
        return {name: dict(values) for name, values in self._counters.items()}

    def load_counters(self, counters: dict[str, dict[str, int]]) -> None:
        """Restore what ``counters`` returned."""
        for name, values in counters.items():
            self._counters[name] = {key: int(value) for key, value in values.items()}


_BLAS_AXPY: dict = {}


def load_blas() -> None:
    """Import scipy's BLAS ?axpy (0.2-0.3 s): the trainer calls this before its first step, so the
    import is not timed as training; `check` and `plan` never update and never pay it."""
    from scipy.linalg.blas import daxpy, saxpy

    _BLAS_AXPY.update({np.dtype(np.float32): saxpy, np.dtype(np.float64): daxpy})


def axpy(alpha: float, x: np.ndarray, y: np.ndarray) -> None:
    """y += alpha·x in place, in one pass over memory.

    numpy needs two (alpha·x into a temporary or into x, then the add); BLAS ?axpy reads x and y
    once and writes y once, which matters for updates of tens of MB that two ranks of a node run
    at the same time.  Falls back to numpy for arrays BLAS cannot take as they are."""
    if not _BLAS_AXPY:
        load_blas()
    blas = _BLAS_AXPY.get(y.dtype)
    if blas is None or x.dtype != y.dtype or x.shape != y.shape or not (x.flags.c_contiguous and y.flags.c_contiguous):
        y += alpha * x
        return
    flat = y.reshape(-1)  # a view: y is contiguous
    result = blas(x.reshape(-1), flat, a=alpha)
    if result is not flat:  # f2py returned a copy instead of writing in place
        flat[...] = result


def exact_axpy(alpha: float, x: np.ndarray, y: np.ndarray, scratch: np.ndarray | None = None) -> None:
    """y += alpha·x, each element rounded twice (the product, then the sum) wherever it sits: two
    passes over memory where :func:`axpy` takes one (see ``Updater.exact_elementwise``); the product
    in ``scratch`` (of y's shape) when given."""
    product = np.multiply(x, y.dtype.type(alpha), out=scratch)
    y += product


def _descend_by_rms(data, numerator, accumulator, delta: float, lr: float, scratch) -> None:
    """data -= lr·numerator / sqrt(accumulator + delta), in place through ``scratch``."""
    np.add(accumulator, delta, out=scratch)
    np.sqrt(scratch, out=scratch)
    np.divide(numerator, scratch, out=scratch)
    scratch *= lr
    data -= scratch


def _decay_into(average, decay: float, value) -> None:
    """average = decay·average + (1-decay)·value; ``value`` is overwritten."""
    value *= 1 - decay
    average *= decay
    average += value


@UPDATERS.register("kSGD")
class SGD(Updater):
    """Momentum SGD: h = m·h - lr·g; data += h (data -= lr·g without momentum)."""

    clips = True
    uses_scratch = False

    @classmethod
    def kept_arrays(cls, conf):
        return 1 if conf.momentum > 0 else 0  # no history without momentum

    def apply(self, name, data, grad, lr):
        if self.momentum > 0:
            history = self.slot(name, "history", data.shape)
            history *= self.momentum
            self.axpy(-lr, grad, history)
            data += history
        else:
            self.axpy(-lr, grad, data)


@UPDATERS.register("kNesterov")
class Nesterov(Updater):
    """h' = m·h + lr·g; data -= (1+m)·h' - m·h."""

    clips = True

    def apply(self, name, data, grad, lr):
        history = self.slot(name, "history", data.shape)
        previous = self._scratch_like(data)
        np.multiply(history, self.momentum, out=previous)  # m·h, before h changes
        grad *= lr
        history *= self.momentum
        history += grad
        data += previous
        np.multiply(history, 1 + self.momentum, out=grad)
        data -= grad


@UPDATERS.register("kAdaGrad")
class AdaGrad(Updater):
    """h += g²; data -= lr·g / sqrt(h + delta)."""

    clips = True
    divides = True

    def apply(self, name, data, grad, lr):
        history = self.slot(name, "history", data.shape)
        scratch = self._scratch_like(data)
        np.multiply(grad, grad, out=scratch)
        history += scratch
        _descend_by_rms(data, grad, history, self.delta, lr, scratch)


@UPDATERS.register("kRMSProp")
class RMSProp(Updater):
    """h = rho·h + (1-rho)·g²; data -= lr·g / sqrt(h + delta)."""

    clips = True
    divides = True

    def __init__(self, conf):
        super().__init__(conf)
        self.rho = _moving(conf.rmsprop_conf.rho, "rmsprop_conf.rho", _DIVIDES_BY_DELTA)

    def apply(self, name, data, grad, lr):
        history = self.slot(name, "history", data.shape)
        scratch = self._scratch_like(data)
        np.multiply(grad, grad, out=scratch)
        _decay_into(history, self.rho, scratch)
        _descend_by_rms(data, grad, history, self.delta, lr, scratch)


@UPDATERS.register("kAdaDelta")
class AdaDelta(Updater):
    """h = rho·h + (1-rho)·g²; t = g·sqrt(u+delta)/sqrt(h+delta); u = rho·u + (1-rho)·t²; data -= lr·t."""

    divides = True
    state_arrays = 2  # history and update

    def __init__(self, conf):
        super().__init__(conf)
        self.rho = _fraction(conf.adadelta_conf.rho, "adadelta_conf.rho")
        # u starts at 0, so t = g·sqrt(0)/sqrt(h) = 0 and u stays 0: with delta 0 no step ever moves a weight
        _require(self.delta > 0, "delta", self.delta, "a value > 0 for updater.type kAdaDelta (its first step "
                 "is g·sqrt(update + delta)/sqrt(history + delta) with update 0; default 1e-08)")

    def apply(self, name, data, grad, lr):
        history = self.slot(name, "history", data.shape)
        update = self.slot(name, "update", data.shape)
        scratch = self._scratch_like(data)
        np.multiply(grad, grad, out=scratch)
        _decay_into(history, self.rho, scratch)
        np.add(update, self.delta, out=scratch)
        np.sqrt(scratch, out=scratch)
        grad *= scratch
        np.add(history, self.delta, out=scratch)
        np.sqrt(scratch, out=scratch)
        grad /= scratch  # grad now holds t
        np.multiply(grad, grad, out=scratch)
        _decay_into(update, self.rho, scratch)
        grad *= lr
        data -= grad


@UPDATERS.register("kAdam")
class Adam(Updater):
    """h = b1·h + (1-b1)·g; u = b2·u + (1-b2)·g²; data -= lr·h / sqrt(u + delta) (see module doc)."""

    divides = True
    state_arrays = 2  # history and update

    def __init__(self, conf):
        super().__init__(conf)
        self.beta1 = _moving(conf.adam_conf.beta1, "adam_conf.beta1", _NEVER_MOVES)
        self.beta2 = _moving(conf.adam_conf.beta2, "adam_conf.beta2", _DIVIDES_BY_DELTA)
        self.bias_correction = conf.adam_conf.bias_correction  # divides by 1 - beta^t: betas below 1, as above

    def apply(self, name, data, grad, lr):
        history = self.slot(name, "history", data.shape)
        update = self.slot(name, "update", data.shape)
        scratch = self._scratch_like(data)
        np.multiply(grad, grad, out=scratch)
        _decay_into(update, self.beta2, scratch)
        _decay_into(history, self.beta1, grad)
        if not self.bias_correction:
            _descend_by_rms(data, history, update, self.delta, lr, scratch)
            return
        t = self._count(name)
        np.multiply(update, 1 / (1 - self.beta2 ** t), out=scratch)
        np.multiply(history, 1 / (1 - self.beta1 ** t), out=grad)
        _descend_by_rms(data, grad, scratch, self.delta, lr, scratch)

    def _count(self, name: str) -> int:
        """Updates of this param so far, including this one (a counter, saved for resume)."""
        counters = self._counters.setdefault(name, {})
        counters["steps"] = counters.get("steps", 0) + 1
        return counters["steps"]


@UPDATERS.register("kAdamMax")
class AdamMax(Updater):
    """h = b1·h + (1-b1)·g; u = max(b2·u, |g|) + delta; data -= lr·h / u."""

    divides = True
    state_arrays = 2  # history and update

    def __init__(self, conf):
        super().__init__(conf)
        self.beta1 = _moving(conf.adammax_conf.beta1, "adammax_conf.beta1", _NEVER_MOVES)
        self.beta2 = _fraction(conf.adammax_conf.beta2, "adammax_conf.beta2")  # 1: a maximum that never decays

    def apply(self, name, data, grad, lr):
        history = self.slot(name, "history", data.shape)
        update = self.slot(name, "update", data.shape)
        scratch = self._scratch_like(data)
        np.abs(grad, out=scratch)
        update *= self.beta2
        np.maximum(update, scratch, out=update)
        update += self.delta
        _decay_into(history, self.beta1, grad)
        np.divide(history, update, out=scratch)
        scratch *= lr
        data -= scratch


def zero_delta_warning(updater: Updater) -> str | None:
    """The one line to say when ``updater`` divides by a history plus a delta of 0: where a weight's
    gradient has been exactly 0 so far (an input that is always 0, a unit that never fires) its history
    is 0 too, and its step 0/0 = NaN.  Merely suspicious, not refused: with no such weight (dense inputs)
    the rule is the caller's choice (textbook Adam's delta sits outside the root, where 0 is common)."""
    if not updater.divides or updater.delta != 0:
        return None
    return (f"updater.delta = 0: {selected_name(updater.conf)} divides each step by its history plus delta, so a "
            f"weight whose gradient is exactly 0 so far (an input that is always 0, a unit that never fires) gets "
            f"0/0 = NaN; expected a small positive delta (default 1e-08)")


def make_updater(conf: job_pb2.UpdaterProto, exact: bool = False) -> Updater:
    """The updater of ``conf``; ConfigError naming the field and the valid types otherwise.
    ``exact``: deterministic mode (:meth:`Updater.exact_elementwise`)."""
    updater = UPDATERS.select(conf, where="updater.")(conf)
    if exact:
        updater.exact_elementwise()
    return updater
