"""The Majordomo brokers tools/bench measures against, as real processes: the C strict-LRU floor
(tools/mdp_lru.c, built here with gcc), the same routing inside a Python event loop
(tools/mdp_lru_loop.c, a CPython extension built here with gcc, run by tools/mdp_lru_loop.py)
and majortomo (PyPI, pinned in setup.cfg); and the C liveness floor of ``tools/bench idle``
(tools/idle_floor.c, built the same way).

Each runs as its own process bound to 127.0.0.1 on ports it picks, prints
``frontend <endpoint>`` and ``backend <endpoint>`` when bound, and is stopped by PID (SIGTERM,
then SIGKILL after a bounded wait). ``python tools/mdp_brokers.py majortomo`` is majortomo's
runner: its own CLI cannot bind a port it picks, nor report it.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
C_SOURCE = HERE / "mdp_lru.c"
IDLE_SOURCE = HERE / "idle_floor.c"
LOOP_SOURCE = HERE / "mdp_lru_loop.c"
LOOP_HOST = HERE / "mdp_lru_loop.py"
#: The loops tools/mdp_lru_loop.py runs the C routing in (its ``--loop``).
LOOPS = ("tornado", "asyncio", "thread")
MAJORTOMO_VERSION = "0.2.0"


class BrokerUnavailable(RuntimeError):
    """A broker cannot be built or started here (the text says why)."""


def find_libzmq() -> Path:
    """The libzmq this Python process uses through pyzmq (its bundled copy in pyzmq.libs, or
    the system's), so the C broker and the Python drivers run the same libzmq."""
    import zmq  # noqa: PLC0415 (loads libzmq into this process)

    zmq.zmq_version()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libzmq" in path and Path(path).is_file():
                return Path(path)
    raise BrokerUnavailable("pyzmq has no libzmq loaded that /proc/self/maps shows")


def build_c_broker(directory: Path, source: Path = C_SOURCE) -> Path:
    """Compile ``source`` (tools/mdp_lru.c unless told; tools/idle_floor.c) into ``directory``,
    as the file's name with "-" for "_"; ``BrokerUnavailable`` without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BrokerUnavailable(f"gcc not found: {source.name} cannot be built")
    libzmq = find_libzmq()
    binary = directory / source.stem.replace("_", "-")
    command = [gcc, *C_FLAGS, "-o", str(binary), str(source), str(libzmq)]
    _gcc(source, [*command, f"-Wl,-rpath,{libzmq.parent}"])
    return binary


C_FLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra", "-Werror")


def _gcc(source: Path, command: list[str]) -> None:
    done = subprocess.run(  # noqa: S603 (gcc, fixed arguments, no shell)
        command, capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"building {source.name} failed:\n{done.stderr}")


def build_c_loop_module(directory: Path, defines: tuple[str, ...] = ()) -> Path:
    """Compile tools/mdp_lru_loop.c into the extension ``_mdp_lru_loop`` in ``directory``,
    against this Python's headers and the libzmq pyzmq loads (the socket handles it is given
    are that libzmq's); ``BrokerUnavailable`` without gcc or Python.h. ``defines``: ``-D``
    macros (the tests' ``MAX_ROUNDS=0``, ``DRAIN_BUDGET=1``)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BrokerUnavailable(f"gcc not found: {LOOP_SOURCE.name} cannot be built")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise BrokerUnavailable(f"no Python.h in {include}: {LOOP_SOURCE.name} cannot be built")
    libzmq = find_libzmq()
    module = directory / ("_mdp_lru_loop" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    _gcc(
        LOOP_SOURCE,
        [
            gcc,
            *C_FLAGS,
            "-shared",
            "-fPIC",
            "-pthread",
            f"-I{include}",
            *(f"-D{define}" for define in defines),
            "-o",
            str(module),
            str(LOOP_SOURCE),
            str(libzmq),
            f"-Wl,-rpath,{libzmq.parent}",
        ],
    )
    return module


@dataclass
class RunningBroker:
    """A broker process: where clients and workers connect, and how to stop it."""

    name: str
    process: subprocess.Popen[bytes]
    frontend: str
    backend: str
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 5.0) -> str:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; its stderr."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.stderr_path.read_text(errors="replace")

    def stats(self) -> dict[str, int]:
        """The C broker's counters from its ``stats`` line (after ``stop``); {} if none."""
        text = self.stderr_path.read_text(errors="replace")
        found = re.search(r"^stats (.*)$", text, re.MULTILINE)
        if found is None:
            return {}
        pairs = (item.split("=", 1) for item in found.group(1).split())
        return {key: int(value) for key, value in pairs}


def _start(
    name: str, command: list[str], directory: Path, timeout_s: float = 30.0
) -> RunningBroker:
    stderr_path = directory / f"{name}.stderr"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(  # noqa: S603 (our broker's fixed command, no shell)
            command, stdout=subprocess.PIPE, stderr=stderr
        )
    assert process.stdout is not None
    endpoints: dict[str, str] = {}
    buffered = b""
    deadline = time.monotonic() + timeout_s
    try:
        while len(endpoints) < 2:
            left = deadline - time.monotonic()
            if left <= 0 or process.poll() is not None:
                raise BrokerUnavailable(
                    f"{name} did not report its endpoints within {timeout_s} s: "
                    + stderr_path.read_text(errors="replace")[-2000:]
                )
            readable, _, _ = select.select([process.stdout], [], [], min(left, 0.5))
            if readable:
                chunk = os.read(process.stdout.fileno(), 4096)
                buffered += chunk
                *lines, rest = buffered.split(b"\n")
                buffered = rest
                for line in lines:
                    key, _, value = line.decode().partition(" ")
                    if key in ("frontend", "backend"):
                        endpoints[key] = value.strip()
    except BaseException:
        process.kill()
        process.wait(5)
        raise
    return RunningBroker(name, process, endpoints["frontend"], endpoints["backend"], stderr_path)


@contextmanager
def running_c_broker(
    binary: Path, directory: Path, *, heartbeat_ms: int = 2500, liveness: int = 3
) -> Iterator[RunningBroker]:
    """The C strict-LRU broker: frontend (clients) and backend (workers) on two ports."""
    broker = _start(
        "c-lru",
        [
            str(binary),
            "-i",
            str(heartbeat_ms),
            "-l",
            str(liveness),
            "tcp://127.0.0.1:*",
            "tcp://127.0.0.1:*",
        ],
        directory,
    )
    try:
        yield broker
    finally:
        broker.stop()


@contextmanager
def running_c_loop_broker(
    module: Path,
    directory: Path,
    *,
    loop: str = "tornado",
    heartbeat_ms: int = 2500,
    liveness: int = 3,
) -> Iterator[RunningBroker]:
    """The C strict-LRU routing inside a Python event loop (``loop``: "tornado" or "asyncio"),
    or in a C thread of its own beside a Tornado loop ("thread"; tools/mdp_lru_loop.py), the
    extension ``module`` from :func:`build_c_loop_module`."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS}, not {loop!r}")
    broker = _start(
        f"c-lru-{loop}",
        [
            sys.executable,
            str(LOOP_HOST),
            "--module-dir",
            str(module.parent),
            "--loop",
            loop,
            "-i",
            str(heartbeat_ms),
            "-l",
            str(liveness),
            "tcp://127.0.0.1:*",
            "tcp://127.0.0.1:*",
        ],
        directory,
    )
    try:
        yield broker
    finally:
        broker.stop()


@contextmanager
def running_idle_floor(
    binary: Path,
    directory: Path,
    *,
    heartbeat_ms: int = 1000,
    liveness: int = 3,
    silent: bool = False,
    promise_ms: int = 0,
    zmtp_ms: int = 0,
) -> Iterator[RunningBroker]:
    """The C liveness floor (tools/idle_floor.c): frontend (clients) and backend (workers).
    ``silent``: it sends nothing after CONFIG (what reading the HEARTBEATs alone costs);
    ``promise_ms``: its HEARTBEATs say ``interval_ms`` (idle beating, docs/protocol.md §3.4);
    ``zmtp_ms``: libzmq's own ZMTP heartbeats on both sockets at that interval."""
    broker = _start(
        "c-idle",
        [
            str(binary),
            "-i",
            str(heartbeat_ms),
            "-l",
            str(liveness),
            "-s",
            str(int(silent)),
            "-p",
            str(promise_ms),
            "-z",
            str(zmtp_ms),
            "tcp://127.0.0.1:*",
            "tcp://127.0.0.1:*",
        ],
        directory,
    )
    try:
        yield broker
    finally:
        broker.stop()


@contextmanager
def running_majortomo(
    directory: Path, *, heartbeat_ms: int = 2500, liveness: int = 4
) -> Iterator[RunningBroker]:
    """majortomo's broker: one ROUTER for clients and workers (frontend == backend).

    Logging at WARNING: at its CLI's default (INFO) it logs two lines per request, which is
    not how anyone would measure it."""
    broker = _start(
        "majortomo",
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "majortomo",
            str(heartbeat_ms),
            str(liveness),
        ],
        directory,
    )
    try:
        yield broker
    finally:
        broker.stop()


def majortomo_main(heartbeat_ms: int, liveness: int) -> None:
    """Run majortomo's Broker on a port it picks; print the endpoint; stop on SIGTERM."""
    import logging  # noqa: PLC0415
    from importlib.metadata import version  # noqa: PLC0415

    from majortomo import broker as mt  # noqa: PLC0415 (only this runner needs it)

    if version("majortomo") != MAJORTOMO_VERSION:
        sys.exit(f"majortomo {version('majortomo')} installed; the bench pins {MAJORTOMO_VERSION}")
    logging.basicConfig(level=logging.WARNING)

    class Broker(mt.Broker):  # type: ignore[misc,name-defined]
        def bind(self) -> None:
            super().bind()
            endpoint = self._socket.last_endpoint.decode()
            print(f"frontend {endpoint}\nbackend {endpoint}", flush=True)

    interval_s = heartbeat_ms / 1000
    broker = Broker(
        bind="tcp://127.0.0.1:*",
        heartbeat_interval=interval_s,
        heartbeat_timeout=interval_s * liveness,
    )
    signal.signal(signal.SIGTERM, lambda *_: broker.stop())
    broker.run()


if __name__ == "__main__":
    if sys.argv[1:2] == ["majortomo"]:
        majortomo_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit("usage: python tools/mdp_brokers.py majortomo HEARTBEAT_MS LIVENESS")
