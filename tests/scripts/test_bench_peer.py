"""scripts/bench_peer.py and the weak-scaling/memory columns of scripts/bench_scaling.py.

The table logic is checked on hand-made runs (no PyTorch needed).  Where PyTorch is installed, a short
serial comparison runs for real; without it the script must refuse in one line (exit 3).
"""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_peer  # noqa: E402
import bench_scaling  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None


def run(ranks, sps, impl="singa_mpi", scheme="data", net="mnist_mlp", weak=False):
    return {"net": net, "ranks": ranks, "batch": 64, "samples_per_s": sps, "impl": impl, "scheme": scheme,
            "weak": weak, "step_ms": 64e3 / sps, "exposed_comm_share": 0.1, "bytes_per_step": 1.0, "cores": 16,
            "peak_rss_max": 100 * 2**20 * ranks}


def test_compare_takes_the_fastest_scheme_and_the_median_of_repeats():
    runs = [run(2, 1000, scheme="data"), run(2, 1200, scheme="feature"), run(2, 1400, scheme="feature"),
            run(2, 500, impl="pytorch"), run(2, 700, impl="pytorch")]
    [row] = bench_peer.compare(runs)
    assert row["scheme"] == "feature"
    assert row["singa_mpi"] == 1300 and row["pytorch"] == 600
    assert row["ratio"] == pytest.approx(1300 / 600)


def test_weak_and_strong_runs_are_summarized_apart_with_peak_memory():
    runs = [run(1, 1000), run(2, 1600), run(1, 1000, weak=True), run(2, 1900, weak=True)]
    rows = {(r["weak"], r["ranks"]): r for r in bench_scaling.summarize(runs)}
    assert rows[(False, 2)]["speedup"] == pytest.approx(1.6)
    assert rows[(True, 2)]["speedup"] == pytest.approx(1.9)
    assert rows[(True, 2)]["speedup_best"] == pytest.approx(1.9)
    assert rows[(True, 2)]["peak_rss_max"] == 200 * 2**20


def test_weak_batch_multiplies_every_store_batch():
    from singa_mpi.config.load import parse_job

    cfg = parse_job((ROOT / "conf" / "mnist_mlp.conf").read_text(), "mnist_mlp.conf")
    bench_scaling.weak_batch(cfg, 4)
    sizes = [list(layer.store_conf.batchsize) for layer in cfg.proto.neuralnet.layer if layer.HasField("store_conf")]
    assert sizes == [[256], [400]]


@pytest.mark.skipif(HAS_TORCH, reason="checks the message shown without PyTorch")
def test_without_pytorch_the_script_says_how_to_install_it():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_peer.py"), "--ranks", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
    assert "pip install -e '.[bench]'" in out.stderr


@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed (the bench extra)")
def test_serial_comparison_prints_a_ratio_per_net(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_peer.py"), "--ranks", "1", "--repeat", "1",
                          "--steps", "4", "--json", str(tmp_path / "peer.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert {row.split("|")[1].strip() for row in rows} == {"mnist_mlp", "cifar10_convnet"}
    assert all(float(row.split("|")[6]) > 0 for row in rows)


def test_a_peer_that_never_ran_reads_n_a_and_its_json_holds_null(tmp_path, monkeypatch, capsys):
    """Every PyTorch run failed: the row says n/a (not nan), the JSON is strict (null, not NaN), exit 1."""
    import json
    import types

    def launch_torch(net, ranks, steps, weak):
        raise bench_scaling.RunFailed(f"PyTorch {net} n={ranks} failed (exit 3): no torch in the ranks' Python")

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setattr(bench_peer, "launch_singa", lambda net, scheme, ranks, steps, weak: run(ranks, 1000))
    monkeypatch.setattr(bench_peer, "launch_torch", launch_torch)
    out = tmp_path / "peer.json"
    monkeypatch.setattr(sys, "argv", ["bench_peer.py", "--ranks", "1", "--repeat", "1", "--nets", "mnist_mlp",
                                      "--json", str(out)])
    assert bench_peer.main() == 1
    printed = capsys.readouterr().out
    assert "| mnist_mlp | 1 | 64 | 1,000 (data) | n/a | n/a |" in printed and "nan" not in printed
    [row] = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))["table"]
    assert row["pytorch"] is None and row["ratio"] is None


def test_a_speedup_without_a_one_rank_run_is_none_and_the_hint_fits_where_it_ran(capsys):
    import json

    [row] = bench_scaling.summarize([run(2, 1600)])
    assert row["speedup"] is None and row["speedup_best"] is None and row["speedup_range"] is None
    json.dumps(row, allow_nan=False)  # strict JSON
    bench_scaling.print_table([row])
    printed = capsys.readouterr().out
    assert "x n/a" in printed and "(run the baselines: include 1 in --ranks)" in printed
    bench_scaling.print_table([row], collected=True)
    assert "(run the baselines: sbatch --ntasks=1 slurm/bench.sbatch)" in capsys.readouterr().out
