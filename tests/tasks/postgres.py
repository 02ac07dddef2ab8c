"""A throwaway PostgreSQL server for the store tests: Debian's postgresql, initdb into a fresh
directory, listening only on a Unix socket there, stopped by PID however the tests end.

A machine without the server fails here, saying what to install, rather than skipping (as the
browser tests do for Chromium): ``apt-get install postgresql``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
USER = "scale0"


def postgres_bin() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if not candidates:
        raise RuntimeError(
            "PostgreSQL is missing: apt-get install postgresql (its initdb and postgres binaries "
            "run the PostgreSQL store tests)"
        )
    return candidates[0].parent


def _owner() -> dict[str, str]:
    """initdb refuses root: run the server as the ``postgres`` user when we are root."""
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


class Server:
    """A running server; :meth:`database` makes a fresh, empty database and returns its DSN."""

    def __init__(self, base: Path, process: subprocess.Popen[bytes]) -> None:
        self.base = base
        self.process = process
        self._names = itertools.count(1)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.base} dbname={dbname} user={USER}"

    def database(self) -> str:
        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.dsn(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')  # a generated name, not input
        return self.dsn(name)


@contextlib.contextmanager
def running_postgres() -> Iterator[Server]:
    binaries = postgres_bin()
    base = Path(tempfile.mkdtemp(prefix="scale0-pg-"))
    owner = _owner()
    if owner:
        shutil.chown(base, owner["user"], owner["group"])
    process: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [
                str(binaries / "initdb"),
                "-D",
                str(base / "data"),
                "-A",
                "trust",
                "-U",
                USER,
                "--no-sync",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            **owner,  # type: ignore[arg-type]
        )
        with (base / "server.log").open("wb") as log:
            process = subprocess.Popen(
                [
                    str(binaries / "postgres"),
                    "-D",
                    str(base / "data"),
                    "-k",
                    str(base),
                    "-c",
                    "listen_addresses=",
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=50",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                **owner,  # type: ignore[arg-type]
            )
        server = Server(base, process)
        limit = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                psycopg.connect(server.dsn(), connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > limit:
                    raise RuntimeError(
                        "PostgreSQL did not start: " + (base / "server.log").read_text()[-2000:]
                    ) from None
                time.sleep(0.1)
        yield server
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # "fast" shutdown
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        shutil.rmtree(base, ignore_errors=True)
