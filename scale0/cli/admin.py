"""scale0ctl's commands that talk to running brokers: status, lists, disable/enable, config get.

Each sends one MANAGEMENTREQ (scale0.net.admin.call) to ``--broker`` and prints the answer as
a table (or one JSON object with ``--json``). Credentials come from ``SCALE0_AUTH_ID`` and
``SCALE0_AUTH_PASSWORD``, or from a credentials file of mode 0600 (``--credentials``,
``SCALE0_CREDENTIALS``, default ``~/.config/scale0/credentials``); never from the command line.

Exit codes (docs/admin.md): 0 success, 1 failure (refused, bad credentials, an error code),
2 usage, 3 partial answer (a family-wide command some broker did not answer or refused),
4 no answer from the broker within ``--timeout``.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import click

from scale0.cli.output import Output
from scale0.config.canonical import canonical_json, config_sha256
from scale0.config.errors import ConfigError, Problem
from scale0.config.loader import load
from scale0.config.signature import default_signature_path, read_signature
from scale0.core.commands import MAX_FAMILY_TIMEOUT_MS, MIN_FAMILY_TIMEOUT_MS
from scale0.crypto.curve import CurveKeyPair, curve_key_problem, load_curve_secret_key
from scale0.crypto.keys import CryptoError, SignatureError
from scale0.net.admin import NoAnswer, Refused, call
from scale0.wire.frames import JsonValue

__all__ = [
    "EXIT_FAILED",
    "EXIT_NO_ANSWER",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "AdminFailed",
    "Credentials",
    "add_admin_commands",
    "broker_params",
    "load_credentials",
    "table",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_PARTIAL: Final = 3
EXIT_NO_ANSWER: Final = 4

DEFAULT_BROKER: Final = "tcp://127.0.0.1:5555"
DEFAULT_TIMEOUT_S: Final = 5.0
DEFAULT_CREDENTIALS: Final = "~/.config/scale0/credentials"
MAX_CREDENTIALS_BYTES: Final = 8192


class AdminFailed(Exception):
    """The command failed; ``exit_code`` says how (1 or 4), ``message`` why."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.details = details


@dataclass(frozen=True, slots=True)
class Credentials:
    auth_id: str
    password: str


def load_credentials(path_option: str | None) -> Credentials:
    """From SCALE0_AUTH_ID/SCALE0_AUTH_PASSWORD, else the credentials file (mode 0600 only)."""
    auth_id = os.environ.get("SCALE0_AUTH_ID")
    password = os.environ.get("SCALE0_AUTH_PASSWORD")
    if auth_id and password is not None:
        return Credentials(auth_id, password)
    explicit = path_option or os.environ.get("SCALE0_CREDENTIALS")
    path = Path(os.path.expanduser(explicit or DEFAULT_CREDENTIALS))
    try:
        info = path.stat()
    except FileNotFoundError:
        if explicit:
            raise AdminFailed(f"{path}: credentials file not found") from None
        raise AdminFailed(
            "no credentials: set SCALE0_AUTH_ID and SCALE0_AUTH_PASSWORD, or write "
            f'{{"auth_id": ..., "password": ...}} to {path} (mode 0600)'
        ) from None
    except OSError as exc:
        raise AdminFailed(f"{path}: {exc.strerror}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AdminFailed(
            f"{path}: credentials file is open to group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 {path}"
        )
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CREDENTIALS_BYTES + 1)
        if len(raw) > MAX_CREDENTIALS_BYTES:
            raise AdminFailed(f"{path}: larger than {MAX_CREDENTIALS_BYTES} bytes")
        document = json.loads(raw)
    except OSError as exc:
        raise AdminFailed(f"{path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdminFailed(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise AdminFailed(f'{path}: expected {{"auth_id": ..., "password": ...}}')
    file_id, file_password = document.get("auth_id"), document.get("password")
    if not isinstance(file_id, str) or not file_id:
        raise AdminFailed(f"{path}: auth_id must be a non-empty string")
    if not isinstance(file_password, str):
        raise AdminFailed(f"{path}: password must be a string")
    return Credentials(file_id, file_password)


# ---- output ------------------------------------------------------------------------------------


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> list[str]:
    """Aligned text lines: a header of ``columns``' titles, then one line per row."""
    cells = [[title for _, title in columns]]
    for row in rows:
        cells.append([_text(row.get(key)) for key, _ in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}:{_text(v)}" for k, v in value.items())
    return str(value)


def _ms(seconds: Any) -> str:
    return f"{seconds * 1000:.1f}ms" if isinstance(seconds, int | float) else "-"


BROKER_COLUMNS: Final = (
    ("broker", "BROKER"),
    ("state", "STATE"),
    ("config", "CONFIG"),
    ("uptime", "UPTIME"),
    ("clients", "CLIENTS"),
    ("workers", "WORKERS"),
    ("requests", "REQUESTS"),
    ("replies", "REPLIES"),
    ("banned_senders", "BANNED"),
)
SERVICE_COLUMNS: Final = (
    ("service", "SERVICE"),
    ("workers", "WORKERS"),
    ("ready", "READY"),
    ("busy", "BUSY"),
    ("queued", "QUEUED"),
    ("latency_count", "ANSWERED"),
    ("p50", "P50"),
    ("p95", "P95"),
)
WORKER_COLUMNS: Final = (
    ("worker_id", "WORKER"),
    ("services", "SERVICES"),
    ("capacity", "CAPACITY"),
    ("in_flight", "IN_FLIGHT"),
    ("heartbeat", "HEARTBEAT"),
    ("idle_s", "IDLE_S"),
)
CLIENT_COLUMNS: Final = (
    ("client_id", "CLIENT"),
    ("requests", "REQUESTS"),
    ("idle_s", "IDLE_S"),
    ("config_version", "CONFIG"),
)


PEER_COLUMNS: Final = (
    ("broker_id", "PEER"),
    ("endpoint", "ENDPOINT"),
    ("linked", "LINKED"),
    ("state", "STATE"),
    ("config_version", "CONFIG"),
    ("services", "SERVICES"),
    ("forwarded", "FORWARDED"),
)


def _peer_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **r,
            "config_version": f"v{r.get('config_version')}",
            "services": " ".join(f"{k}:{v}" for k, v in (r.get("services") or {}).items()) or "-",
        }
        for r in rows
    ]


def _peers_lines(result: Mapping[str, Any]) -> list[str]:
    """list_peers: one line about the broker's own config, the peers' table, conflicts."""
    lines = [
        f"{result.get('broker')} ({result.get('state')}): config v{result.get('config_version')} "
        f"sha256 {str(result.get('sha256') or '-')[:12]} from {result.get('origin') or '-'}"
    ]
    peers = [r for r in result.get("peers") or [] if isinstance(r, dict)]
    lines.extend(table(_peer_rows(peers), PEER_COLUMNS) if peers else ["no peers"])
    for conflict in result.get("conflicts") or []:
        if isinstance(conflict, dict):
            lines.append(
                f"conflict at v{conflict.get('version')}: kept {str(conflict.get('kept'))[:12]} "
                f"over {str(conflict.get('dropped'))[:12]} (from {conflict.get('origin')})"
            )
    return lines


def _config_change_lines(result: Mapping[str, Any]) -> list[str]:
    """reload_config / set_config: applied or not, what changed, what needs a restart."""
    if result.get("applied"):
        lines = [
            f"applied: config v{result.get('config_version')} (was "
            f"v{result.get('previous_version')}), sha256 {str(result.get('sha256'))[:12]}",
            f"changed: {', '.join(result.get('changed') or []) or 'nothing'}",
            f"restart needed: {', '.join(result.get('restart_needed') or []) or 'nothing'}",
        ]
        if result.get("conflict"):
            lines.append(f"conflict: {_text(result.get('conflict'))}")
        return lines
    lines = [f"not applied: running config v{result.get('config_version')}"]
    for key in ("reason", "note"):
        if result.get(key):
            lines.append(f"{key}: {result[key]}")
    if result.get("asked"):
        lines.append(f"asked: {_text(result['asked'])}")
    return lines


def _broker_row(status: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **status,
        "config": f"v{status.get('config_version')} {str(status.get('sha256', ''))[:12]}",
        "uptime": f"{status.get('uptime_s', 0):.0f}s",
    }


def _service_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**r, "p50": _ms(r.get("latency_p50_s")), "p95": _ms(r.get("latency_p95_s"))} for r in rows
    ]


def _status_lines(status: Mapping[str, Any]) -> list[str]:
    by_status = status.get("replies_by_status") or {}
    lines = [
        f"broker:    {status.get('broker')} ({status.get('state')}), family {status.get('family')}",
        f"config:    v{status.get('config_version')} sha256 {status.get('sha256')}",
        f"uptime:    {status.get('uptime_s', 0):.0f} s",
        f"clients:   {status.get('clients')}   workers: {status.get('workers')}"
        f"   in flight: {status.get('in_flight')}   queued: {status.get('queued')}",
        f"requests:  {status.get('requests')}   replies: {status.get('replies')}"
        + (f" ({_text(by_status)})" if by_status else ""),
        f"banned:    {status.get('banned_senders')}   dropped: {status.get('dropped')}",
    ]
    lane = status.get("lane")
    if isinstance(lane, dict):  # the C lane runs (lane: true): what it took, what it passed
        lines.append(
            f"lane:      HEARTBEATs taken {lane.get('beats')}   answered {lane.get('answers')}"
            f"   passed to the loop {lane.get('passed')}   stalled {lane.get('stalled')}"
        )
        lines.append(
            f"           requests taken {lane.get('requests')}   answered {lane.get('replies')}"
            f"   waiting {lane.get('waiting')}   handed to the loop {lane.get('handed')}"
        )
        lines.append(
            f"           peers' FORWARDs taken {lane.get('forwards')}"
            f"   requests forwarded to peers {lane.get('forwarded')}"
        )
    services = status.get("services") or []
    if services:
        lines.append("")
        lines.extend(table(_service_rows(services), SERVICE_COLUMNS))
    return lines


@dataclass(frozen=True, slots=True)
class View:
    """How one command's result is printed: rows + columns, or lines."""

    key: str | None  # the list in the result to tabulate (None: custom lines)
    columns: Sequence[tuple[str, str]] = ()
    rows: Callable[[Sequence[Mapping[str, Any]]], list[dict[str, Any]]] | None = None


VIEWS: Final[dict[str, View]] = {
    "list_services": View("services", SERVICE_COLUMNS, _service_rows),
    "list_workers": View("workers", WORKER_COLUMNS),
    "list_clients": View("clients", CLIENT_COLUMNS),
}


def _generic_rows(result: JsonValue) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """A result holding one list of objects, as rows and columns (commands without a view)."""
    if isinstance(result, dict):
        lists = [v for v in result.values() if isinstance(v, list)]
        if len(lists) == 1:
            rows = [r for r in lists[0] if isinstance(r, dict)]
            keys = list(dict.fromkeys(k for r in rows for k in r))
            return rows, [(k, k.upper()) for k in keys]
    return [], []


def human_lines(command: str, result: JsonValue) -> list[str]:
    """The text for one broker's result of ``command``."""
    if command == "status" and isinstance(result, dict):
        return _status_lines(result)
    if command in ("disable", "enable") and isinstance(result, dict):
        changed = "" if result.get("changed") else " (unchanged)"
        return [f"{result.get('broker')}: {result.get('state')}{changed}"]
    if command == "get_config":
        return json.dumps(result, indent=2, ensure_ascii=False).splitlines()
    if command == "list_peers" and isinstance(result, dict):
        return _peers_lines(result)
    if command in ("reload_config", "set_config") and isinstance(result, dict):
        return _config_change_lines(result)
    view = VIEWS.get(command)
    if view is not None and isinstance(result, dict) and view.key is not None:
        listed = result.get(view.key)
        found = [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []
        return table(view.rows(found) if view.rows else found, view.columns)
    rows, columns = _generic_rows(result)
    if columns:
        return table(rows, columns)
    return json.dumps(result, indent=2, ensure_ascii=False).splitlines()


def family_lines(command: str, result: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Text for a family-wide answer: (stdout lines, stderr lines about missing brokers)."""
    entries = [e for e in result.get("brokers", []) if isinstance(e, dict)]
    problems = []
    for entry in entries:
        if entry.get("code") is None:
            problems.append(f"{entry['broker']}: did not answer")
        elif entry.get("code") != 200:
            problems.append(f"{entry['broker']}: {entry.get('code')} {entry.get('message')}")
    good = [e for e in entries if e.get("code") == 200 and isinstance(e.get("result"), dict)]
    if command == "status":
        rows = [_broker_row(e["result"]) for e in good]
        rows += [
            {"broker": e["broker"], "state": "not answering" if e.get("code") is None else "?"}
            for e in entries
            if e not in good
        ]
        return table(rows, BROKER_COLUMNS), problems
    view = VIEWS.get(command)
    if view is not None and view.key is not None:
        rows = []
        for entry in good:
            part = [r for r in entry["result"].get(view.key) or [] if isinstance(r, dict)]
            rows.extend({"broker": entry["broker"], **r} for r in (view.rows or list)(part))
        return table(rows, [("broker", "BROKER"), *view.columns]), problems
    lines = []
    for entry in good:
        lines.append(f"== {entry['broker']}")
        lines.extend(human_lines(command, entry["result"]))
    return lines, problems


# ---- running one command -----------------------------------------------------------------------


def _family_timeout_ms(timeout_s: float) -> int:
    """How long the asked broker waits for the others: 60 % of ours, so its answer is in time."""
    wanted = int(timeout_s * 600)
    return max(MIN_FAMILY_TIMEOUT_MS, min(MAX_FAMILY_TIMEOUT_MS, wanted))


def curve_settings() -> tuple[CurveKeyPair | None, str | None]:
    """CURVE for a broker that serves it: SCALE0_CURVE_KEY (our NAME.curve.key) and
    SCALE0_SERVER_KEY (the broker's public key, Z85), both or neither (AdminFailed)."""
    path, server_key = os.environ.get("SCALE0_CURVE_KEY"), os.environ.get("SCALE0_SERVER_KEY")
    if not path and not server_key:
        return None, None
    if not path or not server_key:
        raise AdminFailed("SCALE0_CURVE_KEY and SCALE0_SERVER_KEY go together", EXIT_FAILED)
    problem = curve_key_problem(server_key)
    if problem is not None:
        raise AdminFailed(f"SCALE0_SERVER_KEY: {problem}", EXIT_FAILED)
    try:
        return load_curve_secret_key(path), server_key
    except CryptoError as exc:
        raise AdminFailed(f"SCALE0_CURVE_KEY: {exc}", EXIT_FAILED) from None


def run_command(
    out: Output,
    command: str,
    args: dict[str, JsonValue],
    *,
    broker: str,
    timeout_s: float,
    credentials_path: str | None,
) -> int:
    """Send ``command`` and print its answer; returns the exit code."""
    payload: dict[str, Any] = {"broker": broker, "command": command, "args": args}
    try:
        credentials = load_credentials(credentials_path)
        curve, server_key = curve_settings()
        try:
            reply = call(
                broker,
                credentials.auth_id,
                credentials.password,
                command,
                args,
                timeout_s=timeout_s,
                curve=curve,
                server_key=server_key,
            )
        except NoAnswer as exc:
            raise AdminFailed(str(exc), EXIT_NO_ANSWER) from None
        except Refused as exc:
            raise AdminFailed(str(exc), code=exc.code) from None
    except AdminFailed as failure:
        payload.update(failure.details)
        out.fail([Problem(failure.message)], payload)
        return failure.exit_code
    payload.update({"code": reply.code, "message": reply.message, "result": reply.result})
    if reply.code != 200:
        problem = Problem(f"{broker}: {command} refused: {reply.code} {reply.message or ''}")
        out.fail([problem], payload)
        return EXIT_FAILED
    if args.get("family") and isinstance(reply.result, dict):
        lines, problems = family_lines(command, reply.result)
        complete = bool(reply.result.get("complete"))
        for line in lines:
            out.line(line)
        problem_list = [Problem(p) for p in problems]
        out.problems(problem_list)
        payload["complete"] = complete
        out.result(payload, problem_list)
        return EXIT_OK if complete else EXIT_PARTIAL
    for line in human_lines(command, reply.result):
        out.line(line)
    out.result(payload)
    return EXIT_OK


def config_set_args(path: Path, signature_path: Path | None) -> dict[str, JsonValue]:
    """set_config's arguments for a network config file in any format and its signature file.

    The document goes as canonical JSON, whose sha256 is the one signed (§6.2), so YAML, XML
    and ZFL files all work. Raises AdminFailed naming the file that is wrong.
    """
    sig_path = signature_path or default_signature_path(path)
    try:
        network = load(path, kind="network")
        signed = read_signature(sig_path)
    except ConfigError as exc:
        raise AdminFailed("; ".join(str(p) for p in exc.problems)) from None
    except SignatureError as exc:
        raise AdminFailed(str(exc)) from None
    sha256 = config_sha256(network)
    if (signed.family, signed.config_version, signed.sha256) != (
        network.family,
        network.config_version,
        sha256,
    ):
        raise AdminFailed(
            f"{sig_path}: signs {signed.family} v{signed.config_version} "
            f"{signed.sha256[:12]}…, but {path} is {network.family} v{network.config_version} "
            f"{sha256[:12]}… (sign it again: scale0ctl config sign)"
        )
    args: dict[str, JsonValue] = {
        "document": canonical_json(network).decode("utf-8"),
        "config_type": "json",
        "sha256": sha256,
        "signature": signed.signature,
    }
    if signed.view_signature is not None:  # a file made before views were signed has none
        args["view_signature"] = signed.view_signature
    return args


def _config_set(output: Callable[[], Output], json_param: click.Parameter) -> click.Command:
    def callback(
        file: Path,
        signature_path: Path | None,
        broker: str,
        timeout: float,
        credentials_path: str | None,
    ) -> None:
        try:
            args = config_set_args(file, signature_path)
        except AdminFailed as failure:
            out = output()
            out.fail([Problem(failure.message)], {"broker": broker, "command": "set_config"})
            click.get_current_context().exit(failure.exit_code)
        code = run_command(
            output(),
            "set_config",
            args,
            broker=broker,
            timeout_s=timeout,
            credentials_path=credentials_path,
        )
        click.get_current_context().exit(code)

    params: list[click.Parameter] = [
        click.Argument(["file"], type=click.Path(dir_okay=False, exists=True, path_type=Path)),
        click.Option(
            ["--signature", "signature_path"],
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            default=None,
            help="Its signature file (default: FILE.sig, as `scale0ctl config sign` writes).",
        ),
        *broker_params(family=False, target=False, json_param=json_param),
    ]
    help_text = (
        "Apply a signed network config FILE (any format) on a running broker; it is replicated "
        "to the whole family. Needs the admin role. The answer says whether it applied, what "
        "changed and what needs a restart, or why it was refused."
    )
    return click.Command(
        "set",
        callback=callback,
        params=params,
        help=help_text,
        short_help="Apply a signed network config on a running broker (and its family).",
    )


# ---- click wiring ------------------------------------------------------------------------------

_FAMILY_HELP: Final = (
    "Ask every broker of the family through this one (exit 3 if some did not answer)."
)
_TARGET_HELP: Final = "Run it on this broker of the family, through the one --broker names."


def broker_params(
    *, family: bool, target: bool, json_param: click.Parameter
) -> list[click.Parameter]:
    params: list[click.Parameter] = [
        click.Option(
            ["--broker"],
            default=DEFAULT_BROKER,
            envvar="SCALE0_BROKER",
            show_default=True,
            metavar="ENDPOINT",
            help="Frontend endpoint of the broker to ask (env SCALE0_BROKER).",
        ),
        click.Option(
            ["--timeout"],
            type=click.FloatRange(0.1, 120.0),
            default=DEFAULT_TIMEOUT_S,
            show_default=True,
            help="Seconds to wait for the answer (exit 4 when none comes).",
        ),
        click.Option(
            ["--credentials", "credentials_path"],
            type=click.Path(dir_okay=False),
            default=None,
            help="JSON credentials file, mode 0600 (env SCALE0_CREDENTIALS; default "
            f"{DEFAULT_CREDENTIALS}). SCALE0_AUTH_ID/SCALE0_AUTH_PASSWORD take precedence.",
        ),
    ]
    if family:
        params.append(click.Option(["--family", "family_flag"], is_flag=True, help=_FAMILY_HELP))
    if target:
        params.append(
            click.Option(["--target", "target_id"], metavar="BROKER_ID", help=_TARGET_HELP)
        )
    params.append(json_param)
    return params


def _command(
    name: str,
    command: str,
    help_text: str,
    output: Callable[[], Output],
    json_param: click.Parameter,
    *,
    family: bool = False,
    target: bool = False,
) -> click.Command:
    def callback(
        broker: str,
        timeout: float,
        credentials_path: str | None,
        family_flag: bool = False,
        target_id: str | None = None,
    ) -> None:
        args: dict[str, JsonValue] = {}
        if family_flag:
            args["family"] = True
            args["timeout_ms"] = _family_timeout_ms(timeout)
        if target_id is not None:
            args["broker"] = target_id
            args["timeout_ms"] = _family_timeout_ms(timeout)
        code = run_command(
            output(),
            command,
            args,
            broker=broker,
            timeout_s=timeout,
            credentials_path=credentials_path,
        )
        click.get_current_context().exit(code)

    return click.Command(
        name,
        callback=callback,
        params=broker_params(family=family, target=target, json_param=json_param),
        help=help_text,
        short_help=help_text.split(". ", maxsplit=1)[0].rstrip(".") + ".",
    )


def add_admin_commands(
    main: click.Group,
    config: click.Group,
    json_param: Callable[[], click.Parameter],
    output: Callable[[], Output],
) -> None:
    """Register the broker-talking commands on scale0ctl's groups (and ``config get``)."""
    for name, command, help_text, family, target in (
        (
            "status",
            "status",
            "Show a broker's state, config, counters and services. With --family, one line "
            "per broker of the family, and the brokers that did not answer.",
            True,
            False,
        ),
        (
            "services",
            "list_services",
            "List services: workers, ready and busy workers, queue depth, latency.",
            True,
            False,
        ),
        ("workers", "list_workers", "List the workers connected to the broker.", True, False),
        ("clients", "list_clients", "List the client sessions of the broker.", True, False),
        (
            "peers",
            "list_peers",
            "List the broker's peers: link, state, config version, services in their table; "
            "and the broker's config conflicts.",
            True,
            False,
        ),
        (
            "disable",
            "disable",
            "Disable a broker: its workers, waiting requests and clients are moved to active "
            "members (301) until enabled; requests at a worker finish. Needs the admin role.",
            False,
            True,
        ),
        ("enable", "enable", "Enable a disabled broker. Needs the admin role.", False, True),
        (
            "reload-config",
            "reload_config",
            "A config source reads its network config file again, signs and applies it (and "
            "says what changed and what needs a restart); another broker asks its peers for "
            "a newer config. Needs the admin role.",
            False,
            False,
        ),
    ):
        main.add_command(
            _command(name, command, help_text, output, json_param(), family=family, target=target)
        )
    config.add_command(_config_set(output, json_param()))
    config.add_command(
        _command(
            "get",
            "get_config",
            "Print the network config a running broker uses (password hashes redacted).",
            output,
            json_param(),
            family=True,
        )
    )
