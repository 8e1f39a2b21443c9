"""`check` on neuralnet.pipeline, and the planner, which refuses the same: one line naming file:line,
the field or layer, and what was expected."""
import pytest

import nets
from singa_mpi.checks.job import validate
from singa_mpi.errors import ConfigError


def _mlp(micro=2, schedule="1f1b", batch=16, updater=nets.UPDATER):
    return nets.pipelined(nets.mlp("/tmp/unused.h5", batch, "stages", 2, steps=2, updater=updater), micro, schedule)


def _refusal(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate(nets.job(text, "job.conf"))
    message = str(err.value)
    assert "\n" not in message and message.startswith("job.conf:")
    return message


def test_a_pipelined_mlp_passes():
    validate(nets.job(_mlp(8, "gpipe")))
    validate(nets.job(_mlp(16, "1f1b")))  # one row per micro-batch


def test_an_unknown_schedule_names_the_valid_ones():
    message = _refusal(_mlp(2, "chimera"))
    assert "neuralnet.pipeline.schedule = 'chimera': expected one of 'gpipe', '1f1b', 'zb', 'interleaved'" in message
    line = next(i for i, text in enumerate(_mlp(2, "chimera").splitlines(), 1) if "chimera" in text)
    column = _mlp(2, "chimera").splitlines()[line - 1].index("schedule") + 1
    assert message.startswith(f"job.conf:{line}:{column}: ")  # where the schedule is written


@pytest.mark.parametrize("micro", [0, -3])
def test_a_count_below_one_is_refused(micro):
    assert f"neuralnet.pipeline.micro_batches = {micro}: expected a positive count" in _refusal(_mlp(micro))


def test_more_micro_batches_than_rows_is_refused():
    message = _refusal(_mlp(17, batch=16))
    assert "micro_batches = 17: expected at most the training batch's 16 rows" in message


def test_batch_norm_is_refused_naming_the_layer_and_why():
    text = nets.pipelined(nets.convnet("/tmp/unused.h5", 8, "stages", 2, bn=True), 2)
    message = _refusal(text)
    assert "layer 'bn1' (#2, kCudnnBM)" in message
    assert "mean and variance of the whole batch" in message and "remove neuralnet.pipeline" in message


def test_contrastive_divergence_is_refused_saying_why():
    text = nets.pipelined(nets.rbm("/tmp/unused.h5", 8, "data", steps=2), 2)
    message = _refusal(text)
    assert "a pipeline cannot run kCD: contrastive divergence runs Gibbs rounds" in message


def test_one_micro_batch_is_the_unpipelined_step_and_refuses_nothing():
    validate(nets.job(nets.pipelined(nets.convnet("/tmp/unused.h5", 8, "stages", 2, bn=True), 1)))


def test_the_planner_refuses_what_check_refuses_however_the_job_was_made():
    from singa_mpi.planner import partition

    text = nets.pipelined(nets.convnet("/tmp/unused.h5", 8, "stages", 2, bn=True), 2)
    with pytest.raises(ConfigError, match="layer 'bn1' .*mean and variance of the whole batch"):
        partition(nets.job(text), 2)
