"""A run that fails inside a benchmark script is said in one line (the run, and the line of its output
that says why), the other runs go on, and the table and --json of what was measured are still written
(exit 1).  The loops are run in this process with the launches replaced; one real failed launch."""
import json
import pathlib
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_cost  # noqa: E402
import bench_peer  # noqa: E402
import bench_scaling  # noqa: E402

MPICH_BANNER = """Traceback (most recent call last):
  File "bench_scaling.py", line 287, in measure
statistics.StatisticsError: no median for empty data

===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   EXIT CODE: 1
===================================================================================
"""


def fake_run(net, scheme, ranks, sps=1000.0, impl=None):
    run = {"net": net, "scheme": scheme, "ranks": ranks, "batch": 64, "samples_per_s": sps, "step_ms": 64e3 / sps,
           "exposed_comm_share": 0.0, "bytes_per_step": 0.0, "cores": 16, "weak": False}
    return dict(run, impl=impl) if impl else run


def test_the_error_line_is_found_above_the_launcher_s_banner():
    assert bench_scaling.error_tail(MPICH_BANNER) == "statistics.StatisticsError: no median for empty data"
    assert bench_scaling.error_tail("singa-mpi: error: job.conf:3: bad\nmore\n") == "singa-mpi: error: job.conf:3: bad"
    assert bench_scaling.error_tail("") == "no output"


def test_a_failed_launch_is_one_line_naming_the_run():
    with pytest.raises(bench_scaling.RunFailed) as err:
        bench_scaling.launch("mnist_mlp", "data", 1, -1)  # the worker refuses --steps -1
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("mnist_mlp data n=1 failed (exit "), message
    assert "argument --steps: '-1'" in message


def test_bench_scaling_goes_on_after_a_failed_run_and_writes_what_it_measured(tmp_path, monkeypatch, capsys):
    def launch(net, scheme, ranks, steps, weak=0):
        if scheme == "feature":
            raise bench_scaling.RunFailed(f"{net} {scheme} n={ranks} failed (exit 1): ValueError: boom")
        return fake_run(net, scheme, ranks)

    monkeypatch.setattr(bench_scaling, "launch", launch)
    monkeypatch.setattr(bench_scaling, "refusal", lambda *args: None)
    out = tmp_path / "runs.json"
    monkeypatch.setattr(sys, "argv", ["bench_scaling.py", "--ranks", "1", "--repeat", "1", "--nets", "mnist_mlp",
                                      "--schemes", "feature", "data", "--json", str(out)])
    assert bench_scaling.main() == 1
    printed = capsys.readouterr().out
    assert "  mnist_mlp feature n=1 failed (exit 1): ValueError: boom\n" in printed
    assert "measured mnist_mlp data n=1" in printed
    assert "1 run(s) failed: mnist_mlp feature n=1 failed (exit 1): ValueError: boom" in printed
    written = json.loads(out.read_text())
    assert [row["scheme"] for row in written["summary"]] == ["data"]
    assert written["failed"] == ["mnist_mlp feature n=1 failed (exit 1): ValueError: boom"]


def test_bench_peer_goes_on_after_a_failed_singa_run(tmp_path, monkeypatch, capsys):
    def launch_singa(net, scheme, ranks, steps, weak):
        if ranks == 2:
            raise bench_scaling.RunFailed(f"{net} {scheme} n={ranks} failed (exit 1): ValueError: boom")
        return fake_run(net, scheme, ranks)

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # the peer's runs are replaced too
    monkeypatch.setattr(bench_peer, "launch_singa", launch_singa)
    monkeypatch.setattr(bench_peer, "launch_torch", lambda net, ranks, steps, weak: fake_run(net, None, ranks, 500,
                                                                                              "pytorch"))
    out = tmp_path / "peer.json"
    monkeypatch.setattr(sys, "argv", ["bench_peer.py", "--ranks", "1", "2", "--repeat", "1", "--nets", "mnist_mlp",
                                      "--json", str(out)])
    assert bench_peer.main() == 1
    printed = capsys.readouterr().out
    assert "  mnist_mlp data n=2 failed (exit 1): ValueError: boom\n" in printed
    rows = [line for line in printed.splitlines() if line.startswith("| mnist_mlp")]
    assert rows[0] == "| mnist_mlp | 1 | 64 | 1,000 (data) | 500 | 2.00 |"
    assert rows[1].startswith("| mnist_mlp | 2 | 64 | n/a (-) | 500 | n/a |"), rows
    written = json.loads(out.read_text())
    assert written["table"][1]["ratio"] is None and written["failed"]


def test_bench_cost_goes_on_after_a_failed_run(monkeypatch, capsys):
    def launch(net, scheme, ranks, steps):
        raise bench_scaling.RunFailed(f"{net} {scheme} n={ranks} failed (exit 1): ValueError: boom")

    monkeypatch.setattr(bench_cost, "launch", launch)
    monkeypatch.setattr(bench_cost, "predicted", lambda *args: 0.01)
    monkeypatch.setattr(sys, "argv", ["bench_cost.py", "--ranks", "1", "2", "--nets", "mnist_mlp", "--schemes", "data",
                                      "--repeat", "1"])
    assert bench_cost.main() == 1
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert [line for line in lines if line.startswith("  mnist_mlp data n=")] == [
        f"  mnist_mlp data n={n} failed (exit 1): ValueError: boom" for n in (1, 2)]
    assert any(line.startswith("2 run(s) failed: ") for line in lines)
