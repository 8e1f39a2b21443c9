"""bench_scaling.py --collect: the table of a folder of worker results, each written whole (temporary
file and rename); a file that is no result (empty, cut short, another tool's) is skipped with a warning
that names it."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_scaling.py"
sys.path.insert(0, str(ROOT / "scripts"))

import bench_scaling  # noqa: E402


def result(net="mnist_mlp", scheme="data", ranks=1, sps=1000.0):
    return {"net": net, "scheme": scheme, "ranks": ranks, "batch": 64, "samples_per_s": sps, "step_ms": 64e3 / sps,
            "exposed_comm_share": 0.1, "bytes_per_step": 0.0, "cores": 16, "weak": False}


def collect(folder: pathlib.Path, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--collect", str(folder), *more], capture_output=True,
                          text=True, timeout=120)


def test_files_that_are_no_result_are_skipped_with_a_warning_naming_them(tmp_path):
    (tmp_path / "bench-mnist_mlp-data-n1.json").write_text(json.dumps(result()) + "\n")
    (tmp_path / "bench-mnist_mlp-data-n2.json").write_text(json.dumps(result(ranks=2, sps=1600.0)) + "\n")
    (tmp_path / "bench-mnist_mlp-feature-n2.json").write_text("")  # a task killed while writing (old workers)
    (tmp_path / "bench-cifar10_convnet-data-n2.json").write_text('{"net": "cifar10_convnet", "sch')
    (tmp_path / "scaling.json").write_text('{"summary": [], "runs": []}\n')  # another tool's
    out = collect(tmp_path)
    assert out.returncode == 0, out.stderr
    warnings = out.stderr.splitlines()
    assert len(warnings) == 3 and "Traceback" not in out.stderr, out.stderr
    for name in ("bench-mnist_mlp-feature-n2.json", "bench-cifar10_convnet-data-n2.json", "scaling.json"):
        assert (f"warning: {tmp_path / name}: skipped: expected the JSON result of one bench_scaling.py --worker run"
                in warnings), out.stderr
    assert "x1.60" in out.stdout


def test_a_result_is_written_whole_through_a_temporary_file(tmp_path):
    path = tmp_path / "sub" / "bench-mnist_mlp-data-n1.json"
    bench_scaling.write_atomically(path, "{}\n")
    bench_scaling.write_atomically(path, json.dumps(result()) + "\n")
    assert json.loads(path.read_text())["net"] == "mnist_mlp"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_a_campaign_s_missing_results_are_named_and_fail_the_collection(tmp_path):
    (tmp_path / "bench-mnist_mlp-data-n1.json").write_text(json.dumps(result()) + "\n")
    (tmp_path / "bench-mnist_mlp-data-n2.json").write_text(json.dumps(result(ranks=2, sps=1600.0)) + "\n")
    assert bench_scaling.missing_results([result(), result(ranks=2)], [1]) == [
        "mnist_mlp feature n=1", "mnist_mlp hybrid n=1", "cifar10_convnet data n=1", "cifar10_convnet feature n=1",
        "cifar10_convnet hybrid n=1"]
    out = collect(tmp_path, "--expect-ranks", "1", "2")
    assert out.returncode == 1
    assert "x1.60" in out.stdout  # the table of what there is
    assert out.stderr.startswith(f"{tmp_path}: no result from 10 task(s): mnist_mlp feature n=1, "), out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_the_campaign_s_tasks_are_bench_sbatch_s():
    """bench_scaling.CAMPAIGN_TASKS is slurm/bench.sbatch's NETS x SCHEMES table, in its order."""
    text = (ROOT / "slurm" / "bench.sbatch").read_text()
    table = {}
    for name in ("NETS", "SCHEMES"):
        [line] = [line for line in text.splitlines() if line.startswith(f"{name}=(")]
        table[name] = line.split("(", 1)[1].rstrip(")").split()
    assert list(zip(table["NETS"], table["SCHEMES"])) == bench_scaling.CAMPAIGN_TASKS
