"""Smoke test of scripts/profile_convnet.py: the per-layer table and the convolutions against sgemm."""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_profile_convnet_prints_layers_and_the_convolutions_against_the_gemm_rate(tmp_path):
    batch = 13  # what one of 8 data-parallel ranks runs of the conf's 100 (the default)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # PyTorch's side only where installed
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_convnet.py"), "--steps", "2",
                          "--batch", str(batch)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    table = out.stdout.split("fwd ms", 1)[1].split("\nsum", 1)[0].splitlines()[1:]
    layers = {cells[0]: cells[3] for cells in map(str.split, table)}  # layer, forward, backward, total
    assert set(layers) >= {"conv1", "conv2", "conv3", "pool1", "pool2", "pool3", "norm1", "norm2"}, out.stdout
    rows = re.findall(r"^(conv\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out.stdout, re.M)
    assert [r[0] for r in rows] == ["conv1", "conv2", "conv3"], out.stdout
    # direct-convolution FLOPs: 2 x batch x filters x output pixels x channels x 25, times 2 passes for
    # conv1 (no input gradient: its source is the data) and 3 for the others
    assert f"at batch {batch}," in out.stdout
    expected = {"conv1": 2 * batch * 32 * 32 * 32 * 3 * 25 * 2, "conv2": 2 * batch * 32 * 15 * 15 * 32 * 25 * 3,
                "conv3": 2 * batch * 64 * 7 * 7 * 32 * 25 * 3}
    for name, gflop, ms, rate, sgemm in rows:
        assert abs(float(gflop) - expected[name] / 1e9) < 0.01
        assert float(ms) > 0 and float(sgemm) > 0
        assert abs(float(rate) - expected[name] / 1e6 / float(ms)) < 0.02 * float(rate) + 0.1  # ms printed to 0.01
        assert abs(float(ms) - float(layers[name])) < 0.02  # the same measurement as the layer table
