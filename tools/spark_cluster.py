"""A real Spark standalone cluster on loopback (a master and one worker), the trend job run on it.

Run it as ``tools/spark-cluster [SOURCE] [--out DIR]`` (it makes .venv first). It starts
``org.apache.spark.deploy.master.Master`` and ``...worker.Worker`` with the installed pyspark's
``bin/spark-class`` (no Spark download), waits until the worker has registered, runs
``scale0-trend SOURCE --master spark://127.0.0.1:PORT``, checks from the master's log that the
application ran there, and stops the worker and the master by PID however it ends. Without
SOURCE it generates a small log first. Everything else goes in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: exited with {proc.returncode} before {text!r}")
        time.sleep(0.2)
    raise RuntimeError(f"{log.name}: no {text!r} within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 20 s; by PID (spark-class execs java, so it is the JVM)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", help="event log directory (default: generate one)")
    parser.add_argument("--out", type=Path, help="job output (default: a temporary directory)")
    parser.add_argument("--cores", type=int, default=2, help="the worker's cores")
    parser.add_argument("--timeout", type=float, default=900, help="bound on the job, seconds")
    args = parser.parse_args()
    began = time.monotonic()
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_NO_DAEMONIZE": "1",
        # No REST submission server: it listens on a fixed port (6066) two runs would share.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }
    with tempfile.TemporaryDirectory(prefix="scale0-spark-") as tmp_name:
        tmp = Path(tmp_name)
        env["SPARK_WORKER_DIR"] = str(tmp / "work")
        env["SPARK_LOG_DIR"] = str(tmp / "logs")
        source = args.source
        if source is None:
            source = str(tmp / "events")
            subprocess.run(  # noqa: S603 (fixed arguments, no shell)
                [
                    sys.executable,
                    "-m",
                    "scale0.trend.synth",
                    "--out",
                    source,
                    "--days",
                    "0.25",
                    "--rate",
                    "2",
                    "--corrupt",
                    "2",
                ],
                check=True,
                timeout=600,
            )
        out = args.out or tmp / "out"
        port, ui, worker_ui = free_port(), free_port(), free_port()
        master_url = f"spark://127.0.0.1:{port}"
        master_log, worker_log = tmp / "master.log", tmp / "worker.log"
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with master_log.open("wb") as log:
                procs.append(
                    subprocess.Popen(  # noqa: S603 (pyspark's own spark-class)
                        [
                            str(SPARK_CLASS),
                            "org.apache.spark.deploy.master.Master",
                            "--host",
                            "127.0.0.1",
                            "--port",
                            str(port),
                            "--webui-port",
                            str(ui),
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
            wait_for(master_log, "I have been elected leader", procs[0], 120)
            print(f"master {master_url} up after {time.monotonic() - began:.1f} s", flush=True)
            with worker_log.open("wb") as log:
                procs.append(
                    subprocess.Popen(  # noqa: S603 (pyspark's own spark-class)
                        [
                            str(SPARK_CLASS),
                            "org.apache.spark.deploy.worker.Worker",
                            master_url,
                            "--host",
                            "127.0.0.1",
                            "--cores",
                            str(args.cores),
                            "--memory",
                            "2g",
                            "--webui-port",
                            str(worker_ui),
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
            wait_for(worker_log, "Successfully registered with master", procs[1], 120)
            print(f"worker registered after {time.monotonic() - began:.1f} s", flush=True)
            job_began = time.monotonic()
            done = subprocess.run(  # noqa: S603 (our installed command)
                [
                    str(Path(sys.executable).parent / "scale0-trend"),
                    source,
                    "--out",
                    str(out),
                    "--master",
                    master_url,
                    "--shuffle-partitions",
                    "4",
                ],
                env=env,
                timeout=args.timeout,
                check=False,
            )
            job_s = time.monotonic() - job_began
            ran_there = "Registering app scale0-trend" in master_log.read_text(errors="replace")
        finally:
            for proc in reversed(procs):
                stop(proc)
        total_s = time.monotonic() - began
        print(
            f"job on {master_url}: exit {done.returncode} in {job_s:.1f} s "
            f"(registered with the master: {'yes' if ran_there else 'NO'}); "
            f"cluster up, job and shutdown: {total_s:.1f} s"
        )
        return 0 if done.returncode == 0 and ran_there else 1


if __name__ == "__main__":
    sys.exit(main())
