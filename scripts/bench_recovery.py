"""How long a self-healing run takes to recover: ``singa-mpi run -n N --elastic`` on a job, one rank
SIGKILLed mid-training, and the time from its death to the first step after the restart (the
supervisor's summary: WORKSPACE/supervisor/summary.json), with the newest checkpoint's load time
(``train`` prints when it resumes) and the steps trained again.

    python scripts/bench_recovery.py                       # digits MLP and MNIST MLP, 2 ranks
    python scripts/bench_recovery.py --ranks 3 --shrink    # 3 ranks, restarted on the 2 survivors
    python scripts/bench_recovery.py --jobs digits --repeat 3
    python scripts/bench_recovery.py --no-shm              # over messages: the survivors' emergency checkpoint

The MNIST MLP trains on random data of MNIST's shapes (`singa-mpi data synthetic`), written into the
scratch folder; nothing is downloaded.  Goal (issue #32): under 10 s plus the checkpoint's load time.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from mpi_jobs import ranks_of  # noqa: E402  (tests/: the pid of a rank below a launcher)

from benchkit import bench_env  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOAL = 10.0  # seconds, plus the checkpoint's load
# job -> (conf file, steps, checkpoint every, kill after the report of this step, disp_freq, data)
JOBS = {"digits": ("digits_mlp.conf", 20000, 2000, 5000, 500, "digits"),
        "mnist": ("mnist_mlp.conf", 400, 50, 120, 10, "synthetic")}


def job_file(folder: pathlib.Path, name: str) -> str:
    conf, steps, every, _, disp, data = JOBS[name]
    text = (ROOT / "conf" / conf).read_text()
    text = re.sub(r"(?m)^train_steps: \d+", f"train_steps: {steps}\ncheckpoint_freq: {every}", text)
    text = re.sub(r"(?m)^disp_freq: \d+", f"disp_freq: {disp}", text)
    text = re.sub(r"(?m)^test_freq: \d+", f"test_freq: {steps}", text)
    text = text.replace('path: "data/', f'path: "{folder}/data/')
    path = folder / f"{name}.conf"
    path.write_text(text)
    if data == "synthetic":
        subprocess.run([sys.executable, "-m", "singa_mpi", "data", "synthetic", "--like", str(path), "--count",
                        "2000"], check=True, capture_output=True, env=bench_env())
    return str(path)


def one_recovery(folder: pathlib.Path, name: str, ranks: int, shrink: bool, no_shm: bool) -> dict:
    job, workspace = job_file(folder, name), folder / f"ws-{name}"
    kill_after = JOBS[name][3]
    command = [sys.executable, "-m", "singa_mpi", "run", "-n", str(ranks), "--elastic"]
    command += ["--shrink"] if shrink else []
    proc = subprocess.Popen(command + [job, "--workspace", str(workspace), "--overwrite"], cwd=folder,
                            env=dict(bench_env(), **({"SINGA_MPI_SHM": "0"} if no_shm else {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while True:
        try:
            steps = [json.loads(line)["step"] for line in (workspace / "metrics.jsonl").read_text().splitlines()
                     if line.endswith("}")]
        except OSError:
            steps = []
        if steps and max(steps) >= kill_after:
            break
        if proc.poll() is not None:
            raise SystemExit(f"{name}: the run ended before step {kill_after}:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.02)
    os.kill(ranks_of(proc.pid)[1], signal.SIGKILL)
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: the supervised run failed:\n{out[-3000:]}")
    summary = json.loads((workspace / "supervisor" / "summary.json").read_text())
    (attempt,) = summary["attempts"]
    return {"job": name, "ranks": ranks, "relaunched_on": attempt["relaunched_on"],
            "recovery_s": attempt["recovery_seconds"], "lost_steps": attempt["lost_steps"],
            "resumed_from": attempt["resumed_from"], "load_s": load_seconds(workspace, attempt["resumed_from"]),
            "from": "emergency" if (attempt.get("emergency") or "").startswith("emergency checkpoint") else "periodic"}


def load_seconds(workspace: pathlib.Path, step: int) -> float:
    """How long reading and verifying the checkpoint resumed from takes in one process (what each rank
    of the restart does before its first step)."""
    from singa_mpi.checkpoints import hdf5

    began = time.perf_counter()
    hdf5.read(hdf5.checkpoint_path(str(workspace), step))
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=sorted(JOBS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--shrink", action="store_true", help="restart on the survivors (default: as many ranks)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-shm", action="store_true",
                        help="sum over messages (SINGA_MPI_SHM=0), where every rank updates whole replicas: the "
                             "survivors' emergency checkpoint applies (one node's default shares the update)")
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    rows = []
    print(f"{'job':<8} {'ranks':>5} {'then':>5} {'recovery':>9} {'load':>7} {'lost steps':>10} {'from':>10}  "
          f"goal: < {GOAL:.0f} s + load")
    for name in args.jobs:
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="singa-recovery-") as scratch:
                row = one_recovery(pathlib.Path(scratch), name, args.ranks, args.shrink, args.no_shm)
            rows.append(row)
            met = row["recovery_s"] < GOAL + row["load_s"]
            print(f"{row['job']:<8} {row['ranks']:>5} {row['relaunched_on']:>5} {row['recovery_s']:>8.2f}s "
                  f"{row['load_s']:>6.2f}s {row['lost_steps']:>10} {row['from']:>10}  {'met' if met else 'MISSED'}",
                  flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
