"""The task coordinator's HTTP endpoint: ``/metrics`` (Prometheus text) and a read-only page.

Off unless the coordinator's config sets ``http_port`` (docs/tasks.md §11.2). Both show the
numbers of :func:`scale0.tasks.report.report`, taken on the coordinator's own event loop, so a
scrape sees one consistent state. Nothing here changes anything: GET and HEAD only, no
session, no task names or scripts (only counts and node names). Like the broker's management
server it answers only Host headers naming its own address and sends the same security headers
(scale0/mgmt/http.py); it binds 127.0.0.1 unless the config says otherwise.
"""

from __future__ import annotations

import html
import socket
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, Final

import tornado.httpserver
import tornado.web

from scale0.mgmt.http import SECURITY_HEADERS, allowed_hosts, base_url, bind
from scale0.mgmt.metrics import MetricsWriter

__all__ = ["METRIC_NAMES", "TaskStatusServer", "render_task_metrics", "render_task_page"]

#: Every metric /metrics exposes (docs/tasks.md lists them; a test checks both ways).
METRIC_NAMES: Final = (
    "scale0_tasks",
    "scale0_tasks_created_total",
    "scale0_tasks_completed_total",
    "scale0_tasks_failed_total",
    "scale0_tasks_reruns_total",
    "scale0_tasks_stale_reports_refused_total",
    "scale0_tasks_queue_depth",
    "scale0_task_nodes_connected",
    "scale0_task_node_connected",
    "scale0_task_node_running_tasks",
    "scale0_task_node_memory_mb",
    "scale0_task_node_memory_reserved_mb",
    "scale0_task_node_cores",
    "scale0_task_node_cores_reserved",
)

Report = Mapping[str, Any]

#: Nothing is posted here; a request body beyond this is refused unread.
MAX_BODY_BYTES: Final = 4096


def render_task_metrics(report: Report) -> str:
    """The exposition text of a coordinator report (scale0.tasks.report)."""
    w = MetricsWriter()
    w.family(
        "scale0_tasks",
        "gauge",
        "Tasks in each state now (waiting, pending, running, complete).",
        (({"state": state}, n) for state, n in report["tasks"].items()),
    )
    w.family(
        "scale0_tasks_created_total",
        "counter",
        "Tasks created (both protocols).",
        [({}, report["created"])],
    )
    w.family(
        "scale0_tasks_completed_total",
        "counter",
        "Tasks completed, by success (ok, warning, error, fatal, terminated).",
        (({"success": success}, n) for success, n in report["completed"].items()),
    )
    w.family(
        "scale0_tasks_failed_total",
        "counter",
        "Tasks completed with error, fatal or terminated (cancelled ones included).",
        [({}, report["failed"])],
    )
    w.family(
        "scale0_tasks_reruns_total",
        "counter",
        "Attempts lost with their node and run again.",
        [({}, report["reruns"])],
    )
    w.family(
        "scale0_tasks_stale_reports_refused_total",
        "counter",
        "Status reports and results refused as coming from a stale attempt (F3).",
        [({}, report["refused"])],
    )
    w.family(
        "scale0_tasks_queue_depth",
        "gauge",
        "Tasks ready to run and waiting for a node, by protocol.",
        (({"protocol": protocol}, n) for protocol, n in report["queue"].items()),
    )
    w.family(
        "scale0_task_nodes_connected",
        "gauge",
        "Nodes connected to the coordinator.",
        [({}, report["nodes_connected"])],
    )
    nodes = list(report["nodes"])
    for name, key, kind, text in (
        ("scale0_task_node_connected", "connected", "gauge", "1 while the node is connected."),
        ("scale0_task_node_running_tasks", "running", "gauge", "Tasks running on the node."),
        ("scale0_task_node_memory_mb", "memory", "gauge", "The node's memory capability, MB."),
        (
            "scale0_task_node_memory_reserved_mb",
            "memory_reserved",
            "gauge",
            "Memory its running tasks reserve, MB.",
        ),
        ("scale0_task_node_cores", "cores", "gauge", "The node's cores capability."),
        (
            "scale0_task_node_cores_reserved",
            "cores_reserved",
            "gauge",
            "Cores its running tasks reserve.",
        ),
    ):
        w.family(name, kind, text, (({"node": str(n["node"])}, n[key]) for n in nodes))
    return w.text()


def render_task_page(report: Report, refresh_s: int = 5) -> str:
    """The read-only HTML page: queue depth, running, failed, per-node load."""
    tasks = report["tasks"]
    queue = report["queue"]
    queued = sum(queue.values())
    summary = [
        ("queue-depth", "Queue depth (pending)", f"{queued}"),
        ("queue-by-protocol", "… by protocol", ", ".join(f"{k} {v}" for k, v in queue.items())),
        ("waiting", "Waiting for a parent", f"{tasks.get('waiting', 0)}"),
        ("running", "Running", f"{tasks.get('running', 0)}"),
        ("complete", "Complete", f"{tasks.get('complete', 0)}"),
        ("failed", "Failed (error, fatal, terminated)", f"{report['failed']}"),
        ("created", "Created", f"{report['created']}"),
        ("reruns", "Re-run attempts", f"{report['reruns']}"),
        ("refused", "Stale reports refused", f"{report['refused']}"),
        ("nodes-connected", "Nodes connected", f"{report['nodes_connected']}"),
    ]
    rows = "\n".join(
        f'<tr><th scope="row">{label}</th><td class="num" id="{key}">{html.escape(value)}</td></tr>'
        for key, label, value in summary
    )
    node_rows = "\n".join(
        "<tr>"
        f"<td>{html.escape(str(n['node']))}</td>"
        f"<td>{'yes' if n['connected'] else 'no'}</td>"
        f'<td class="num">{int(n["running"])}</td>'
        f'<td class="num">{int(n["memory_reserved"])} / {int(n["memory"])}</td>'
        f'<td class="num">{int(n["cores_reserved"])} / {int(n["cores"])}</td>'
        "</tr>"
        for n in report["nodes"]
    )
    if not node_rows:
        node_rows = '<tr><td colspan="5" class="muted">no node has connected</td></tr>'
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{int(refresh_s)}">
<title>Scale0 task coordinator</title>
<link rel="stylesheet" href="/static/app.css">
</head>
<body>
<header><h1>Scale0 task coordinator</h1></header>
<main>
<h2>Tasks</h2>
<table id="summary">
{rows}
</table>
<h2>Nodes</h2>
<table id="nodes">
<thead><tr><th>Node</th><th>Connected</th><th>Running</th><th>Memory MB (reserved / total)</th>
<th>Cores (reserved / total)</th></tr></thead>
<tbody>
{node_rows}
</tbody>
</table>
<p class="muted">Read-only; refreshes every {int(refresh_s)} s. The same numbers:
<a href="/metrics">/metrics</a>. Tasks themselves: <code>scale0ctl tasks list</code>.</p>
</main>
</body>
</html>
"""


class _Handler(tornado.web.RequestHandler):
    """GET/HEAD only, Host checked, security headers on every answer."""

    server: TaskStatusServer

    def initialize(self, server: TaskStatusServer) -> None:
        self.server = server

    def set_default_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)

    def prepare(self) -> None:
        host = self.request.headers.get("Host", "")
        if host not in self.server.allowed_hosts:
            self.send_error(403, reason=f"Host {host!r} is not this server")
        elif self.request.method not in ("GET", "HEAD"):
            self.set_header("Allow", "GET, HEAD")
            self.send_error(405, reason="read-only: GET or HEAD")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code} {self._reason}\n")


class _Metrics(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(render_task_metrics(self.server.source()).encode("utf-8"))


class _Page(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(render_task_page(self.server.source()).encode("utf-8"))


class _Css(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/css; charset=utf-8")
        self.finish(self.server.css)


class _NotFound(_Handler):
    def prepare(self) -> None:
        super().prepare()
        if not self._finished:
            self.send_error(404, reason="not found: / and /metrics are served")


class TaskStatusServer:
    """``listen()`` binds ``address:port`` (0 picks one), ``serve()`` serves, ``stop()`` closes."""

    def __init__(self, source: Callable[[], Report], address: str, port: int) -> None:
        self.source = source
        self.address = address
        self.port = port
        self.allowed_hosts: frozenset[str] = frozenset()
        # The broker page's stylesheet, read once: one look for both pages.
        self.css = resources.files("scale0.mgmt").joinpath("static", "app.css").read_bytes()
        context = {"server": self}
        self.app = tornado.web.Application(
            [
                (r"/", _Page, context),
                (r"/metrics", _Metrics, context),
                (r"/static/app\.css", _Css, context),
            ],
            default_handler_class=_NotFound,
            default_handler_args=context,
            compress_response=False,
        )
        self._server: tornado.httpserver.HTTPServer | None = None
        self._sockets: list[socket.socket] = []

    @property
    def url(self) -> str:
        return base_url(self.address, self.port)

    def listen(self) -> str:
        """Bind (before the loop runs, so a bad port fails at start); the base URL.

        Raises OSError when the address cannot be bound.
        """
        self._sockets, self.port = bind(self.address, self.port)
        self.allowed_hosts = allowed_hosts(self.address, self.port)
        return self.url

    def serve(self) -> None:
        """Serve the bound sockets on the running loop."""
        self._server = tornado.httpserver.HTTPServer(
            self.app, xheaders=False, max_body_size=MAX_BODY_BYTES
        )
        self._server.add_sockets(self._sockets)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        for sock in self._sockets:
            sock.close()
        self._sockets = []
