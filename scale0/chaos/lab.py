"""A network lab of namespaces: one per host, a hub joining them by veth links, faults on demand.

:class:`Lab` makes, for one run, ``HUB`` (the hub's namespace) and one namespace per host, each
joined to the hub by a veth pair (``eth0`` in the host, ``pN`` in the hub) and given an address
``10.213.S.N/24`` that exists only inside these namespaces (``S`` is drawn per run). In the hub
runs :mod:`scale0.chaos.switch`, the learning switch that forwards frames and applies loss and
delay; cutting a link is ``ip link set pN down`` in the hub. Every name carries the run's token,
so two runs never meet; :meth:`Lab.close` (also on ``with`` exit, however it ends) stops every
process the lab started (by PID) and deletes every namespace, which takes their veths with them.

Needs root and ``ip netns``: :func:`require_namespaces` says precisely what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Self

__all__ = ["Lab", "LabError", "Spawned", "require_namespaces"]

#: How long a process the lab started may take to stop after SIGTERM before SIGKILL.
STOP_TIMEOUT_S: Final = 8.0
#: Prefix of every namespace a lab creates: ``s0p<token>-<name>``.
PREFIX: Final = "s0p"
#: iproute2's ip, by full path where it is installed.
_IP: Final = shutil.which("ip") or "/usr/sbin/ip"


class LabError(RuntimeError):
    """The lab cannot be built here (not root, no ``ip netns``...); the message says why."""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(  # noqa: S603 - fixed ip/tc arguments built here
        list(args), capture_output=True, text=True, timeout=30, check=False
    )
    if check and result.returncode != 0:
        raise LabError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def require_namespaces() -> None:
    """Raise :class:`LabError` naming what is missing to make network namespaces here."""
    if sys.platform != "linux":
        raise LabError(f"network namespaces need Linux, this is {sys.platform}")
    if os.geteuid() != 0:
        raise LabError(
            "network namespaces need root (ip netns add): run as root, or in a container "
            "with CAP_SYS_ADMIN and CAP_NET_ADMIN"
        )
    if shutil.which("ip") is None:
        raise LabError("the ip command (iproute2) is not installed")
    probe = f"{PREFIX}probe{secrets.token_hex(3)}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        raise LabError(f"ip netns add failed: {made.stderr.strip()}")
    try:
        veth = _run(
            "ip",
            "-n",
            probe,
            "link",
            "add",
            "a0",
            "type",
            "veth",
            "peer",
            "name",
            "b0",
            check=False,
        )
        if veth.returncode != 0:
            raise LabError(f"cannot make a veth pair: {veth.stderr.strip()}")
    finally:
        _run("ip", "netns", "del", probe, check=False)


@dataclass
class Spawned:
    """A process the lab started inside a namespace (stopped by PID on close)."""

    name: str
    namespace: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        process = self.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout_s)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return process.returncode


@dataclass
class Lab:
    """Hosts in namespaces joined through a hub; see the module docstring."""

    hosts: Sequence[str]
    directory: Path
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: int = field(default_factory=lambda: 1 + secrets.randbelow(254))
    spawned: list[Spawned] = field(default_factory=list)
    made: list[str] = field(default_factory=list)
    _switch: Spawned | None = None
    _switch_in: IO[bytes] | None = None
    _switch_out: IO[bytes] | None = None

    @property
    def hub(self) -> str:
        return f"{PREFIX}{self.token}-hub"

    def namespace(self, host: str) -> str:
        return f"{PREFIX}{self.token}-{host}"

    def address(self, host: str) -> str:
        """The host's address: 10.213.S.N, N its place in ``hosts`` (from 1)."""
        return f"10.213.{self.subnet}.{list(self.hosts).index(host) + 1}"

    def port(self, host: str) -> str:
        """The hub-side end of the host's veth link."""
        return f"p{list(self.hosts).index(host) + 1}"

    # ---- build and tear down ----

    def __enter__(self) -> Self:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def build(self) -> None:
        require_namespaces()
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in [self.hub, *(self.namespace(h) for h in self.hosts)]:
            _run("ip", "netns", "add", name)
            self.made.append(name)
            _run("ip", "-n", name, "link", "set", "lo", "up")
        for host in self.hosts:
            ns, port = self.namespace(host), self.port(host)
            # Both ends are made directly in their namespaces: nothing appears in the root one.
            _run(
                "ip",
                "-n",
                self.hub,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _run("ip", "-n", self.hub, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
        switch = self.spawn(
            "switch",
            self.hub,
            [sys.executable, "-m", "scale0.chaos.switch", *(self.port(h) for h in self.hosts)],
            pipes=True,
        )
        self._switch = switch
        self._switch_in = switch.process.stdin
        self._switch_out = switch.process.stdout
        ready = self._switch_line(timeout_s=20.0)
        if not ready.get("ready"):
            raise LabError(f"the hub's switch did not start: {ready}")

    def close(self) -> None:
        """Stop every process (by PID, newest first), then delete every namespace. Idempotent."""
        for spawned in reversed(self.spawned):
            with contextlib.suppress(Exception):
                spawned.stop()
        for stream in (self._switch_in, self._switch_out):
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()
        for name in reversed(self.made):
            _run("ip", "netns", "del", name, check=False)
        self.made.clear()

    def leftovers(self) -> list[str]:
        """This run's namespaces still present (empty after close)."""
        listing = _run("ip", "netns", "list", check=False).stdout
        mine = f"{PREFIX}{self.token}-"
        return [line.split()[0] for line in listing.splitlines() if line.startswith(mine)]

    # ---- processes ----

    def spawn(
        self,
        name: str,
        namespace: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        pipes: bool = False,
    ) -> Spawned:
        """Start ``argv`` inside ``namespace`` (``ip netns exec`` execs it: the PID is its own).

        Its stderr (and stdout unless ``pipes``) goes to ``directory/NAME.log``.
        """
        log_path = self.directory / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(  # noqa: S603 - our own commands
                [_IP, "netns", "exec", namespace, *argv],
                stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipes else log,
                stderr=log,
                env={**os.environ, **(env or {})},
            )
        spawned = Spawned(name, namespace, process, log_path)
        self.spawned.append(spawned)
        return spawned

    def run_in(self, host: str, argv: Sequence[str], timeout_s: float = 30.0) -> str:
        """Run ``argv`` in ``host``'s namespace to completion; its stdout (raises on failure)."""
        result = subprocess.run(  # noqa: S603 - our own commands
            [_IP, "netns", "exec", self.namespace(host), *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise LabError(f"{' '.join(argv)} in {host} failed: {result.stderr.strip()[-2000:]}")
        return result.stdout

    # ---- faults ----

    def _switch_line(self, timeout_s: float = 10.0) -> dict[str, Any]:
        assert self._switch is not None and self._switch_out is not None
        ready, _, _ = select.select([self._switch_out], [], [], timeout_s)
        if not ready:
            raise LabError(f"the hub's switch said nothing within {timeout_s} s")
        line = self._switch_out.readline()
        if not line:
            raise LabError(
                "the hub's switch exited: " + self._switch.log_path.read_text(errors="replace")
            )
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise LabError(f"the hub's switch answered {line!r}")
        return answer

    def switch(self, **order: Any) -> dict[str, Any]:
        """Send one command to the hub's switch (see scale0.chaos.switch) and return its answer."""
        if self._switch_in is None:
            raise LabError("the lab is not built")
        self._switch_in.write(json.dumps(order).encode() + b"\n")
        self._switch_in.flush()
        answer = self._switch_line()
        if not answer.get("ok"):
            raise LabError(f"the hub's switch refused {order}: {answer.get('error')}")
        return answer

    def cut(self, host: str) -> None:
        """Take ``host``'s link down at the hub: it and its namespace hear no one, both ways."""
        _run("ip", "-n", self.hub, "link", "set", self.port(host), "down")

    def heal(self, host: str) -> None:
        """Bring ``host``'s link up again."""
        _run("ip", "-n", self.hub, "link", "set", self.port(host), "up")

    def loss(self, host: str, *, to_host: float = 0.0, from_host: float = 0.0) -> None:
        """Drop this share of the frames towards ``host`` / from ``host`` (0..1)."""
        self.switch(port=self.port(host), loss_out=to_host, loss_in=from_host)

    def delay(self, host: str, *, to_host_ms: float = 0.0, from_host_ms: float = 0.0) -> None:
        """Hold back the frames towards / from ``host`` by these many milliseconds."""
        self.switch(port=self.port(host), delay_out_ms=to_host_ms, delay_in_ms=from_host_ms)

    def clear(self) -> None:
        """Every link up, no loss, no delay."""
        for host in self.hosts:
            self.heal(host)
        self.switch(clear=True)

    def link_up(self, host: str) -> bool:
        out = _run("ip", "-n", self.hub, "-j", "link", "show", self.port(host)).stdout
        flags = json.loads(out)[0].get("flags", [])
        return "UP" in flags
