"""scale0ctl tasks: list, info, cancel and explain the task coordinator's tasks (docs/tasks.md §11).

The coordinator is a worker of the family, so these commands reach it as a TaskClient does:
one vespid command (``task-list``, ``task-info``, ``task-cancel``, ``task-explain``) to the
``vespid`` service through the broker at ``--broker`` (any broker of the family). Options,
credentials and output follow the broker commands of scale0.cli.admin: ``--broker``,
``--timeout``, ``--credentials`` (or SCALE0_AUTH_ID / SCALE0_AUTH_PASSWORD), ``--json``.
Credentials are sent when there are some; a coordinator without ``admins_from`` needs none.

Exit codes (docs/admin.md): 0 success; 1 refused (unknown task, a finished task cancelled,
forbidden, bad credentials file); 2 usage; 4 no answer (the broker did not answer within
``--timeout``, or no coordinator serves the service in the family).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import click

from scale0.cli.admin import (
    DEFAULT_CREDENTIALS,
    EXIT_FAILED,
    EXIT_NO_ANSWER,
    EXIT_OK,
    AdminFailed,
    Credentials,
    broker_params,
    curve_settings,
    load_credentials,
    table,
)
from scale0.cli.output import Output
from scale0.config.errors import Problem
from scale0.crypto.keys import CryptoError
from scale0.net.client import Client, UntrustedConfig
from scale0.net.errors import (
    RequestTimeout,
    Scale0Error,
    ServiceNotFound,
    ServiceUnavailable,
    WorkerLost,
)
from scale0.net.security import load_trusted_key
from scale0.tasks.client import TaskClient, TaskError
from scale0.tasks.errors import ErrorCode
from scale0.tasks.model import TaskState

__all__ = ["add_task_commands", "optional_credentials"]

DEFAULT_SERVICE: Final = "vespid"

LIST_COLUMNS: Final = (
    ("name", "NAME"),
    ("protocol", "PROTOCOL"),
    ("state", "STATE"),
    ("success", "SUCCESS"),
    ("node", "NODE"),
    ("attempt", "ATTEMPT"),
    ("created", "CREATED"),
    ("started", "STARTED"),
    ("finished", "FINISHED"),
)
VERDICT_COLUMNS: Final = (
    ("node", "NODE"),
    ("fits", "FITS_NOW"),
    ("fits_idle", "FITS_IDLE"),
    ("reason", "REASON"),
)


class TasksFailed(Exception):
    """The command failed; ``exit_code`` 1 or 4, ``details`` go into the JSON object."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.details = details


def optional_credentials(path_option: str | None) -> Credentials | None:
    """The operator's credentials when any are configured (as for the broker commands), else
    None: a coordinator without ``admins_from`` asks for none. A credentials file that was
    named but is missing or unusable is an error (AdminFailed)."""
    named = (
        path_option
        or os.environ.get("SCALE0_CREDENTIALS")
        or (os.environ.get("SCALE0_AUTH_ID") and os.environ.get("SCALE0_AUTH_PASSWORD") is not None)
        or Path(os.path.expanduser(DEFAULT_CREDENTIALS)).exists()
    )
    return load_credentials(path_option) if named else None


def _time(value: Any, short: bool = False) -> str | None:
    """A coordinator time (seconds since the epoch) in UTC; None stays None (printed "-")."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    moment = datetime.datetime.fromtimestamp(value, datetime.UTC)
    return moment.strftime("%m-%d %H:%M:%S" if short else "%Y-%m-%dT%H:%M:%SZ")


def _slug(code: int) -> str:
    try:
        return ErrorCode(code).slug
    except ValueError:
        return "error"


def ask(
    command: str,
    fields: Mapping[str, Any],
    *,
    broker: str,
    service: str,
    timeout_s: float,
    credentials_path: str | None,
    trusted_key: str | None = None,
) -> dict[str, Any]:
    """One vespid command to the coordinator, with credentials; its reply or TasksFailed.

    CURVE comes from SCALE0_CURVE_KEY and SCALE0_SERVER_KEY (as for the admin commands);
    ``trusted_key`` (``--trusted-key``, SCALE0_TRUSTED_KEY) makes the client check the config's
    signature itself (S1-S4)."""
    try:
        credentials = optional_credentials(credentials_path)
        curve, server_key = curve_settings()
    except AdminFailed as failure:
        raise TasksFailed(failure.message) from None
    try:
        trusted = load_trusted_key(trusted_key) if trusted_key else None
    except CryptoError as exc:
        raise TasksFailed(f"--trusted-key: {exc}") from None
    # The client library logs its failovers; a command's stderr is its own (and empty with --json).
    quiet = logging.getLogger("scale0")
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    message = dict(fields)
    if credentials is not None:
        message.update(auth_id=credentials.auth_id, auth_password=credentials.password)
    client = TaskClient(
        broker,
        vespid_service=service,
        timeout=timeout_s,
        retry_s=timeout_s,
        client=Client(
            broker,
            timeout=timeout_s,
            heartbeat_interval=0.1,
            curve=curve,
            server_key=server_key,
            trusted_key=trusted,
        ),
    )
    try:
        return client.command(command, **message)
    except UntrustedConfig as exc:
        raise TasksFailed(f"{command} not sent: {exc}", EXIT_NO_ANSWER) from None
    except TaskError as exc:
        hint = ""
        if exc.code == ErrorCode.FORBIDDEN and credentials is None:
            hint = (
                " (no credentials were given: set SCALE0_AUTH_ID and SCALE0_AUTH_PASSWORD, "
                "or use --credentials FILE)"
            )
        raise TasksFailed(
            f"{command} refused: {exc.message}{hint}", code=exc.code, error=_slug(exc.code)
        ) from None
    except RequestTimeout:
        if client.broker_answered:
            raise TasksFailed(
                f"no task coordinator serving {service!r} answered through {broker} within "
                f"{timeout_s:g} s (is scale0-coordinator running, with that vespid_service?)",
                EXIT_NO_ANSWER,
            ) from None
        raise TasksFailed(
            f"no answer from {broker} within {timeout_s:g} s", EXIT_NO_ANSWER
        ) from None
    except (ServiceNotFound, ServiceUnavailable):
        raise TasksFailed(
            f"no task coordinator serves {service!r} in the family of {broker} "
            "(is scale0-coordinator running, with that vespid_service?)",
            EXIT_NO_ANSWER,
        ) from None
    except WorkerLost:
        raise TasksFailed(
            f"the coordinator serving {service!r} was lost before it answered", EXIT_NO_ANSWER
        ) from None
    except Scale0Error as exc:
        raise TasksFailed(f"{broker}: {exc}") from None
    finally:
        client.close()


# ---- the four commands: (vespid command, fields) and how their answer is printed ----


def _list_lines(reply: Mapping[str, Any], state: str | None) -> list[str]:
    rows = [r for r in reply.get("tasks") or [] if isinstance(r, dict)]
    rows.sort(key=lambda r: (r.get("time-create") or 0.0, str(r.get("name"))))
    shown = [
        {
            **r,
            "created": _time(r.get("time-create"), short=True),
            "started": _time(r.get("time-start"), short=True),
            "finished": _time(r.get("time-finish"), short=True),
        }
        for r in rows
    ]
    lines = table(shown, LIST_COLUMNS) if shown else [f"no {state + ' ' if state else ''}tasks"]
    counts = reply.get("counts") or {}
    if isinstance(counts, dict):
        states = ", ".join(f"{s.value} {counts.get(s.value, 0)}" for s in TaskState)
        lines.append(
            f"all tasks: {states}; re-runs {counts.get('reruns', 0)}, refused reports "
            f"{counts.get('refused', 0)}; nodes connected {counts.get('nodes', 0)}"
        )
    return lines


_INFO_ORDER: Final = (
    "name",
    "protocol",
    "state",
    "status",
    "success",
    "attempt",
    "node",
    "reruns",
    "refused",
    "owner",
    "method",
    "params",
    "name_pretty",
    "parent",
    "requirements",
    "repositories",
    "environment",
    "time-create",
    "time-start",
    "time-finish",
    "error",
    "explain",
)


def _value(key: str, value: Any) -> str:
    if key.startswith("time-"):
        return _time(value) or "-"
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True) if value else "-"
    return str(value)


def _info_lines(reply: Mapping[str, Any]) -> list[str]:
    keys = [k for k in _INFO_ORDER if k in reply]
    keys += sorted(
        k for k in reply if k not in _INFO_ORDER and k not in ("command", "executable_pyscript")
    )
    width = max(len(k) for k in keys) + 1
    lines = [f"{k + ':':<{width}} {_value(k, reply[k])}" for k in keys]
    script = reply.get("executable_pyscript")
    if isinstance(script, str):
        lines.append("executable_pyscript:")
        lines.extend(f"    {line}" for line in script.splitlines())
    return lines


def _cancel_lines(reply: Mapping[str, Any]) -> list[str]:
    was = reply.get("was")
    where = f"it was {was}"
    if was == "running" and reply.get("node"):
        where += (
            f": attempt {reply.get('attempt')} on node {reply.get('node')}, "
            "which is told to kill it"
        )
    return [f"{reply.get('name')}: cancelled ({where}); success {reply.get('success')}"]


def _explain_lines(reply: Mapping[str, Any]) -> list[str]:
    head = f"{reply.get('name')}: {reply.get('state')} ({reply.get('protocol')})"
    if reply.get("state") == "running":
        head += f", attempt {reply.get('attempt')} on node {reply.get('node')}"
    elif reply.get("state") == "complete":
        head += f", success {reply.get('success')}"
    lines = [head, f"why: {reply.get('explain')}"]
    verdicts = [v for v in reply.get("nodes") or [] if isinstance(v, dict)]
    if verdicts:
        lines.append("")
        lines.extend(table(verdicts, VERDICT_COLUMNS))
    elif reply.get("state") in ("pending", "waiting"):
        lines.append("no node is known to the coordinator")
    return lines


def _unknown_info(reply: Mapping[str, Any], name: str) -> None:
    """task-info answers ``status: "invalid"`` for an unknown name (V3): a failure here."""
    if reply.get("status") == "invalid":
        raise TasksFailed(
            f"no task {name!r}",
            code=int(ErrorCode.UNKNOWN_TASK),
            error=ErrorCode.UNKNOWN_TASK.slug,
        )


def _run(
    output: Callable[[], Output],
    label: str,
    command: str,
    fields: dict[str, Any],
    lines: Callable[[dict[str, Any]], list[str]],
    payload_of: Callable[[dict[str, Any]], dict[str, Any]],
    options: Mapping[str, Any],
    check: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    out = output()
    payload: dict[str, Any] = {"broker": options["broker"], "command": label}
    try:
        reply = ask(
            command,
            fields,
            broker=options["broker"],
            service=options["service"],
            timeout_s=options["timeout"],
            credentials_path=options["credentials_path"],
            trusted_key=options.get("trusted_key"),
        )
        if check is not None:
            check(reply)
    except TasksFailed as failure:
        payload.update(failure.details)
        out.fail([Problem(failure.message)], payload)
        click.get_current_context().exit(failure.exit_code)
    for line in lines(reply):
        out.line(line)
    reply.pop("command", None)
    out.result({**payload, **payload_of(reply)})
    click.get_current_context().exit(EXIT_OK)


def _params(json_param: click.Parameter, *extra: click.Parameter) -> list[click.Parameter]:
    service = click.Option(
        ["--service"],
        default=DEFAULT_SERVICE,
        envvar="SCALE0_VESPID_SERVICE",
        show_default=True,
        help="The coordinator's vespid service (its config's vespid_service).",
    )
    trusted_key = click.Option(
        ["--trusted-key"],
        default=None,
        envvar="SCALE0_TRUSTED_KEY",
        help="The family's config-signing public key (a .pub file or its 'ed25519 <base64>' "
        "text): the config the broker hands us is checked against it before any other broker "
        "it names is used (docs/protocol.md §2.5). With SCALE0_CURVE_KEY and SCALE0_SERVER_KEY "
        "for a family that serves CURVE.",
    )
    return [
        *extra,
        *broker_params(family=False, target=False, json_param=json_param),
        service,
        trusted_key,
    ]


def add_task_commands(
    main: click.Group,
    json_param: Callable[[], click.Parameter],
    output: Callable[[], Output],
) -> None:
    """Register ``scale0ctl tasks list|info|cancel|explain``."""

    group = click.Group(
        "tasks",
        params=[json_param()],
        help="The task coordinator's tasks (both protocols), through any broker of the family "
        "(docs/tasks.md).",
        short_help="List, show, cancel and explain the task coordinator's tasks.",
    )

    def list_cb(state: str | None, **options: Any) -> None:
        fields = {} if state is None else {"state": state}
        _run(
            output,
            "tasks list",
            "task-list",
            fields,
            lambda reply: _list_lines(reply, state),
            lambda reply: {"state": state, **reply},
            options,
        )

    def info_cb(name: str, **options: Any) -> None:
        _run(
            output,
            "tasks info",
            "task-info",
            {"name": name},
            _info_lines,
            lambda reply: {"task": reply},
            options,
            lambda reply: _unknown_info(reply, name),
        )

    def cancel_cb(name: str, **options: Any) -> None:
        _run(
            output,
            "tasks cancel",
            "task-cancel",
            {"name": name},
            _cancel_lines,
            lambda reply: {"cancelled": reply},
            options,
        )

    def explain_cb(name: str, **options: Any) -> None:
        _run(
            output,
            "tasks explain",
            "task-explain",
            {"name": name},
            _explain_lines,
            lambda reply: {"explain": reply},
            options,
        )

    states = click.Choice([s.value for s in TaskState])
    commands: Sequence[tuple[str, Callable[..., None], str, list[click.Parameter]]] = (
        (
            "list",
            list_cb,
            "List the tasks: name, protocol, state, success, node, attempt and the times "
            "created, started, finished (UTC); then the counts of all tasks. Needs any admin "
            "role when the coordinator checks credentials.",
            [click.Option(["--state"], type=states, help="Only tasks in this state.")],
        ),
        (
            "info",
            info_cb,
            "Show one task whole (a vespid name or a zerotask task id): its fields, state, "
            "success, attempt, node, times, error and why it is where it is.",
            [click.Argument(["name"])],
        ),
        (
            "cancel",
            cancel_cb,
            "Cancel a waiting or pending task, or terminate a running one (its node kills the "
            "process); a finished task is refused. Needs the role that may create tasks.",
            [click.Argument(["name"])],
        ),
        (
            "explain",
            explain_cb,
            "Say why a task is where it is; for a task waiting for a node, per node which "
            "requirement fails now and whether it would fit an idle node. Needs any admin "
            "role when the coordinator checks credentials.",
            [click.Argument(["name"])],
        ),
    )
    for name, callback, help_text, extra in commands:
        group.add_command(
            click.Command(
                name,
                callback=callback,
                params=_params(json_param(), *extra),
                help=help_text,
                short_help=help_text.split(": ", maxsplit=1)[0].split(". ", maxsplit=1)[0] + ".",
            )
        )
    main.add_command(group)
