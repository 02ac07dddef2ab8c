"""The HTTP management server: JSON API, login, CSRF, web page, /metrics (docs/management.md).

It runs on the broker's own IOLoop and decides nothing itself: every API call becomes a
``ManagementSubmit`` event for the core, which runs the same command table and the same checks
(M1-M6, scale0/core/admin.py) as MANAGEMENTREQ; the core's answer comes back on
``Channel.HTTP`` through the node's sink and is mapped to the waiting HTTP request.

What this module owns is HTTP's own defences:

- Host: only the names of the bound address (and localhost, when bound to loopback), so a
  DNS-rebinding page cannot talk to it.
- Every API call but login needs a session: an HttpOnly, SameSite=Strict cookie holding a random
  session id, signed with a per-process random secret. The session lives in memory only.
- Every state-changing request (POST) must carry a same-origin ``Origin`` header, a JSON body
  and, once logged in, the session's CSRF token in ``X-CSRF-Token``. ``Sec-Fetch-Site:
  cross-site`` is refused on every API call.
- Logins go through the core's credential check, so failures count towards the same ban as
  MANAGEMENTREQ; a banned address gets HTTP 403 for everything until the ban ends (§8).
- Static files come from a fixed allow-list read once at start; no path reaches the disk.

``GET /api/trends`` is the one route that reads a file: the trend summary named by
``management.trend_summary`` (scale0-trend's ``summary.json``), per request, bounded and
checked by scale0.trend.summary, off the I/O thread.

``GET /api/tasks`` is the one route that asks outside the broker: the task coordinator's
``task-stats``, through the family, as a client of this broker (scale0/mgmt/tasks.py), after
the core has checked the session's admin (``whoami``: M3, M4).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import itertools
import json
import secrets
import shlex
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Final

import tornado.http1connection
import tornado.httpserver
import tornado.httputil
import tornado.netutil
import tornado.web

from scale0.config.model import ManagementSettings
from scale0.core.commands import COMMANDS, Command
from scale0.core.effects import Channel, ManagementSubmit
from scale0.mgmt.http import SECURITY_HEADERS, allowed_hosts, base_url, bind
from scale0.mgmt.metrics import render_metrics
from scale0.mgmt.tasks import TaskPanel
from scale0.net.node import BrokerNode
from scale0.tasks.vespid import DEFAULT_RECENT, MAX_RECENT
from scale0.trend.summary import SummaryError, SummaryMissing, read_summary
from scale0.wire.admin import MAX_PASSWORD_CHARS, ManagementReply, ManagementRequest
from scale0.wire.client import DisconnectError
from scale0.wire.frames import JsonValue, Message

__all__ = ["ManagementServer", "api_routes"]

SESSION_COOKIE: Final = "scale0_session"
CSRF_HEADER: Final = "X-CSRF-Token"
#: A session ends after this long without a request, and at most this many live at once.
SESSION_IDLE_S: Final = 30 * 60
MAX_SESSIONS: Final = 256
#: Largest JSON body the API reads; a longer one is answered 413.
MAX_BODY_BYTES: Final = 64 * 1024
#: Largest body read (and dropped) to answer 413 cleanly; beyond it the connection is closed,
#: since reading more would let anyone make the broker read without end.
MAX_DRAINED_BYTES: Final = 1024 * 1024
#: How long an API call waits for the core beyond the command's own family timeout.
CALL_SLACK_S: Final = 5.0

#: The only files served: URL path -> (package file, content type). Nothing else is read.
STATIC_FILES: Final[dict[str, tuple[str, str]]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}


_HTTP_STATUS: Final = {200: 200, 400: 400, 401: 401, 403: 403, 429: 429, 501: 404, 503: 503}


@dataclass(slots=True)
class WebSession:
    """One logged-in browser. The password stays in memory (never in the cookie) because
    family-wide commands pass the admin's credentials on to the other brokers (§7.1)."""

    auth_id: str
    password: str
    role: str
    csrf: str
    last_used: float


def api_routes() -> dict[str, set[str]]:
    """Every API path and its methods, derived from the command table (the OpenAPI file's
    paths are checked against this)."""
    routes: dict[str, set[str]] = {
        "/api/login": {"post"},
        "/api/logout": {"post"},
        "/api/session": {"get"},
        "/api/commands": {"get"},
        "/api/trends": {"get"},
        "/api/tasks": {"get"},
        "/metrics": {"get"},
    }
    for command in COMMANDS.values():
        routes[f"/api/{command.name}"] = {"get" if command.role == "read" else "post"}
    return routes


class _TooLarge(tornado.httputil.HTTPMessageDelegate):
    """A request whose Content-Length is over MAX_BODY_BYTES: drop its body, answer 413.

    Tornado alone would close the connection mid-request (the client sees a reset); reading the
    body (up to MAX_DRAINED_BYTES) before answering lets the client read a real answer.
    """

    def __init__(self, connection: tornado.httputil.HTTPConnection, length: int) -> None:
        self.connection = connection
        self.length = length

    def data_received(self, chunk: bytes) -> None:
        return None  # dropped: the answer does not depend on it

    def finish(self) -> None:
        body = json.dumps(
            {
                "code": 413,
                "message": f"the body is {self.length} bytes; the limit is {MAX_BODY_BYTES}",
            }
        ).encode()
        headers = tornado.httputil.HTTPHeaders(
            {
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
                **SECURITY_HEADERS,
            }
        )
        self.connection.write_headers(
            tornado.httputil.ResponseStartLine("HTTP/1.1", 413, "Content Too Large"), headers, body
        )
        self.connection.finish()

    def on_connection_close(self) -> None:
        return None


class _BodyLimit(tornado.httputil.HTTPMessageDelegate):
    """Passes a request to the application unless its declared body is over the limit."""

    def __init__(
        self, app: tornado.web.Application, server: Any, connection: tornado.httputil.HTTPConnection
    ) -> None:
        self._app = app
        self._server = server
        self._connection = connection
        self._inner: tornado.httputil.HTTPMessageDelegate | None = None

    def headers_received(
        self,
        start_line: tornado.httputil.RequestStartLine | tornado.httputil.ResponseStartLine,
        headers: tornado.httputil.HTTPHeaders,
    ) -> Awaitable[None] | None:
        declared = headers.get("Content-Length", "")
        if declared.isdigit() and MAX_BODY_BYTES < int(declared) <= MAX_DRAINED_BYTES:
            connection = self._connection
            if isinstance(connection, tornado.http1connection.HTTP1Connection):
                connection.set_max_body_size(MAX_DRAINED_BYTES)
            self._inner = _TooLarge(connection, int(declared))
            return None
        self._inner = self._app.start_request(self._server, self._connection)
        return self._inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        if self._inner is None:  # tornado calls headers_received first; never here
            return None
        return self._inner.data_received(chunk)

    def finish(self) -> None:
        if self._inner is not None:
            self._inner.finish()

    def on_connection_close(self) -> None:
        if self._inner is not None:
            self._inner.on_connection_close()


class _LimitedApp(tornado.httputil.HTTPServerConnectionDelegate):
    """The application behind a 413 check on each request's declared body length."""

    def __init__(self, app: tornado.web.Application) -> None:
        self.app = app

    def start_request(
        self, server_conn: object, request_conn: tornado.httputil.HTTPConnection
    ) -> tornado.httputil.HTTPMessageDelegate:
        return _BodyLimit(self.app, server_conn, request_conn)

    def on_close(self, server_conn: object) -> None:
        self.app.on_close(server_conn)


class ManagementServer:
    """The HTTP server of one broker node; ``start()`` binds, ``stop()`` closes."""

    def __init__(
        self,
        node: BrokerNode,
        settings: ManagementSettings,
        *,
        trend_summary: Path | None = None,
        event_log_dir: Path | None = None,
    ) -> None:
        """``trend_summary`` is ``settings.trend_summary`` resolved against the broker file's
        directory (None: no Trends panel); ``event_log_dir`` only goes into the advice of how
        to make a missing summary."""
        self.node = node
        self.settings = settings
        self.trend_summary = trend_summary
        self.event_log_dir = event_log_dir
        # One thread reads, checks and encodes the summary: requests for it queue there, so
        # however many pages ask at once, one file's worth of memory and one core at most.
        self._trend_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trends")
        #: The Tasks panel: the task coordinator's numbers, through the family.
        self.tasks = TaskPanel(
            self._frontend,
            node.broker.identity,
            settings.tasks_service,
            settings.tasks_timeout_ms / 1000,
        )
        self.sessions: dict[str, WebSession] = {}
        self._waiting: dict[bytes, asyncio.Future[Message]] = {}
        self._ids = itertools.count(1)
        self._static = {
            path: (resources.files("scale0.mgmt").joinpath("static", name).read_bytes(), ctype)
            for path, (name, ctype) in STATIC_FILES.items()
        }
        self._server: tornado.httpserver.HTTPServer | None = None
        self.port = 0
        self.allowed_hosts: frozenset[str] = frozenset()
        node.add_sink(Channel.HTTP, self._deliver)
        context: dict[str, Any] = {"server": self}
        handlers: list[Any] = [
            (r"/", StaticHandler, context),
            (r"/static/app\.js", StaticHandler, context),
            (r"/static/app\.css", StaticHandler, context),
            (r"/api/login", LoginHandler, context),
            (r"/api/logout", LogoutHandler, context),
            (r"/api/session", SessionHandler, context),
            (r"/api/commands", CommandsHandler, context),
            (r"/api/trends", TrendsHandler, context),
            (r"/api/tasks", TasksHandler, context),
            (r"/metrics", MetricsHandler, context),
        ]
        for command in COMMANDS.values():
            handlers.append(
                (f"/api/{command.name}", CommandHandler, {**context, "command": command})
            )
        self.app = tornado.web.Application(
            handlers,
            cookie_secret=secrets.token_bytes(32),  # per process: a restart logs everyone out
            default_handler_class=NotFoundHandler,
            default_handler_args=context,
            xsrf_cookies=False,  # our own token, tied to the server-side session
            compress_response=False,
        )

    @property
    def url(self) -> str:
        return base_url(self.settings.http_address, self.port)

    def start(self) -> str:
        """Bind ``http_address:http_port`` (0 picks a port) and serve; returns the base URL.

        Raises OSError when the address cannot be bound (the port is in use, ...).
        """
        sockets, self.port = bind(self.settings.http_address, self.settings.http_port)
        self.allowed_hosts = allowed_hosts(self.settings.http_address, self.port)
        self._server = tornado.httpserver.HTTPServer(
            _LimitedApp(self.app), max_body_size=MAX_BODY_BYTES, xheaders=False
        )
        self._server.add_sockets(sockets)
        return self.url

    def _frontend(self) -> str | None:
        """The frontend this broker bound (the Tasks panel connects to it), once bound."""
        return self.node.endpoints.get(Channel.FRONTEND)

    async def close(self) -> None:
        """``stop()``, then close the Tasks panel's client (it says DISCONNECT)."""
        self.stop()
        await self.tasks.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        for future in self._waiting.values():
            if not future.done():
                future.cancel()
        self._waiting.clear()
        self._trend_reader.shutdown(wait=False, cancel_futures=True)

    # ---- the core round trip ------------------------------------------------------------------

    async def call(
        self, sender: bytes, request: ManagementRequest, *, session_ok: bool, timeout_s: float
    ) -> Message:
        """Submit ``request`` to the core and wait for its answer (ManagementReply, or the
        DISCONNECTERROR 429 of a ban). Raises TimeoutError."""
        routing_id = b"\x00http-req-%d" % next(self._ids)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[routing_id] = future
        try:
            self.node.feed(ManagementSubmit(Channel.HTTP, routing_id, sender, request, session_ok))
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._waiting.pop(routing_id, None)

    def _deliver(self, routing_id: bytes, message: Message) -> None:
        future = self._waiting.get(routing_id)
        if future is not None and not future.done():
            future.set_result(message)

    def request_id(self) -> str:
        return f"http-{next(self._ids)}"

    # ---- the trend summary ----------------------------------------------------------------------

    async def trends_answer(self) -> tuple[int, bytes]:
        """``GET /api/trends``: (HTTP status, the JSON body encoded), made in the reader thread
        (reading, checking and encoding a summary of megabytes would stall the loop)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._trend_reader, self._encoded_trends)

    def _encoded_trends(self) -> tuple[int, bytes]:
        status, body = self.trends()
        return status, json.dumps(body, ensure_ascii=False).encode("utf-8")

    def trends(self) -> tuple[int, dict[str, JsonValue]]:
        """The answer to ``GET /api/trends``: (HTTP status, JSON body). Blocking (it reads the
        file): call it off the loop. Never raises."""
        path = self.trend_summary
        if path is None:
            return 404, {
                "code": 404,
                "message": (
                    "no trend summary is configured: set management.trend_summary in this "
                    "broker's file to the summary.json that scale0-trend writes, then restart "
                    "the broker (docs/management.md)"
                ),
                "result": {"configured": False, "file": None},
            }
        try:
            summary, info = read_summary(path)
        except SummaryMissing:
            command = self.trend_command(path)
            return 404, {
                "code": 404,
                "message": f"{path} does not exist yet: make it with `{command}`",
                "result": {"configured": True, "file": str(path), "command": command},
            }
        except SummaryError as exc:
            return 422, {
                "code": 422,
                "message": str(exc),
                "result": {
                    "configured": True,
                    "file": str(path),
                    "problems": list(exc.problems),
                    "newer": exc.newer,
                },
            }
        except Exception as exc:  # a bad file must never become a 500
            return 422, {
                "code": 422,
                "message": f"{path}: cannot read it: {type(exc).__name__}: {exc}",
                "result": {"configured": True, "file": str(path)},
            }
        modified = datetime.fromtimestamp(info.st_mtime, UTC).isoformat(timespec="seconds")
        return 200, {
            "code": 200,
            "message": "ok",
            "result": {
                "configured": True,
                "file": str(path),
                "size_bytes": info.st_size,
                "modified": modified,
                "summary": summary,
            },
        }

    def trend_command(self, path: Path) -> str:
        """The scale0-trend command that writes ``path`` (its directory is ``--out``)."""
        source = str(self.event_log_dir) if self.event_log_dir is not None else "EVENT_LOG_DIR"
        command = f"scale0-trend {shlex.quote(source)} --out {shlex.quote(str(path.parent))}"
        if path.name != "summary.json":
            command += (
                f" && cp {shlex.quote(str(path.parent / 'summary.json'))} {shlex.quote(str(path))}"
            )
        return command

    # ---- sessions -----------------------------------------------------------------------------

    def new_session(self, auth_id: str, password: str, role: str) -> tuple[str, WebSession]:
        now = time.monotonic()
        self._expire(now)
        while len(self.sessions) >= MAX_SESSIONS:
            del self.sessions[min(self.sessions, key=lambda k: self.sessions[k].last_used)]
        session_id = secrets.token_urlsafe(32)
        session = WebSession(auth_id, password, role, secrets.token_urlsafe(32), now)
        self.sessions[session_id] = session
        return session_id, session

    def session(self, session_id: str | None) -> WebSession | None:
        if session_id is None:
            return None
        now = time.monotonic()
        self._expire(now)
        session = self.sessions.get(session_id)
        if session is not None:
            session.last_used = now
        return session

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self.sessions.items() if now - s.last_used > SESSION_IDLE_S]:
            del self.sessions[key]


# ---- handlers ----------------------------------------------------------------------------------


class Refusal(Exception):
    """End this request with ``status`` and a JSON ``{code, message}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BaseHandler(tornado.web.RequestHandler):
    """Host, ban, cross-site and session checks shared by every route."""

    server: ManagementServer
    #: Whether this route needs a logged-in session.
    needs_session: ClassVar[bool] = True
    web_session: WebSession | None = None
    session_id: str | None = None

    def initialize(self, server: ManagementServer, **_: Any) -> None:
        self.server = server

    def set_default_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)

    @property
    def sender(self) -> bytes:
        """What the error score and ban count against: the client's address (a zero first
        byte, which no ZeroMQ routing id may have, keeps it apart from socket senders)."""
        return b"\x00http:" + (self.request.remote_ip or "?").encode()

    def prepare(self) -> Awaitable[None] | None:
        try:
            self._check_request()
        except Refusal as refusal:
            self.refuse(refusal)
        return None

    def _check_request(self) -> None:
        host = self.request.headers.get("Host", "")
        if host not in self.server.allowed_hosts:
            raise Refusal(403, f"Host {host!r} is not this server")
        if self.server.node.broker.is_banned(self.sender, time.monotonic()):
            raise Refusal(403, "this address is banned for a while after too many errors")
        if self.request.headers.get("Sec-Fetch-Site") == "cross-site":
            raise Refusal(403, "cross-site requests are refused")
        if self.request.method not in ("GET", "HEAD"):
            origin = self.request.headers.get("Origin")
            if origin != f"http://{host}":
                raise Refusal(403, f"cross-site request refused: Origin {origin!r} is not ours")
            ctype = self.request.headers.get("Content-Type", "").split(";")[0].strip()
            if ctype != "application/json":
                raise Refusal(415, "send the body as application/json")
        if self.needs_session:
            self.session_id = self._cookie_session_id()
            self.web_session = self.server.session(self.session_id)
            if self.web_session is None and not self.other_auth():
                raise Refusal(401, "log in first (POST /api/login)")
            if self.request.method not in ("GET", "HEAD") and self.web_session is not None:
                token = self.request.headers.get(CSRF_HEADER, "")
                if not hmac.compare_digest(token.encode(), self.web_session.csrf.encode()):
                    raise Refusal(403, f"missing or wrong {CSRF_HEADER} header")

    def other_auth(self) -> bool:
        """Whether the route accepts credentials other than the session (only /metrics)."""
        return False

    def _cookie_session_id(self) -> str | None:
        raw = self.get_signed_cookie(SESSION_COOKIE, max_age_days=1)
        return raw.decode("ascii", "replace") if raw is not None else None

    def refuse(self, refusal: Refusal) -> None:
        self.send_json(refusal.status, {"code": refusal.status, "message": refusal.message})

    def send_json(self, status: int, body: JsonValue) -> None:
        if self._finished:
            return
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(body, ensure_ascii=False).encode("utf-8"))

    def json_body(self) -> dict[str, JsonValue]:
        if not self.request.body:
            return {}
        try:
            value = json.loads(self.request.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Refusal(400, f"the body is not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise Refusal(400, "the body must be a JSON object")
        return value

    async def run(
        self,
        command: str,
        args: dict[str, JsonValue],
        *,
        auth_id: str,
        password: str,
        session_ok: bool,
    ) -> ManagementReply:
        """One management command through the core; a refusal becomes a Refusal."""
        request = ManagementRequest(
            auth_id=auth_id,
            auth_password=password,
            command=command,
            request_id=self.server.request_id(),
            args=args,
        )
        timeout_ms = args.get("timeout_ms")
        wait_s = (timeout_ms / 1000 if isinstance(timeout_ms, int) else 2.0) + CALL_SLACK_S
        try:
            answer = await self.server.call(
                self.sender, request, session_ok=session_ok, timeout_s=wait_s
            )
        except TimeoutError:
            raise Refusal(504, "the broker did not answer in time") from None
        if isinstance(answer, DisconnectError):
            raise Refusal(answer.code, answer.message)
        if not isinstance(answer, ManagementReply):
            raise Refusal(500, "unexpected answer from the broker")
        return answer

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.send_json(status_code, {"code": status_code, "message": self._reason})


class NotFoundHandler(BaseHandler):
    needs_session = False

    def prepare(self) -> None:
        self.refuse(Refusal(404, "no such page"))


class StaticHandler(BaseHandler):
    """The page and its two files, from memory (STATIC_FILES); nothing else on disk is served."""

    needs_session = False

    def get(self) -> None:
        body, ctype = self.server._static[self.request.path]
        self.set_header("Content-Type", ctype)
        if self.request.path != "/":
            self.set_header("Cache-Control", "no-cache")
        self.finish(body)


class LoginHandler(BaseHandler):
    """POST {auth_id, password}: the credentials go through the core's check (M1, bans)."""

    needs_session = False

    async def post(self) -> None:
        try:
            body = self.json_body()
            auth_id, password = body.get("auth_id"), body.get("password")
            if not isinstance(auth_id, str):
                raise Refusal(400, "auth_id must be a string")
            size = len(auth_id.encode("utf-8", "replace"))
            if not 1 <= size <= 255 or not auth_id.isprintable():
                raise Refusal(400, "auth_id must be 1..255 bytes of printable characters")
            if not isinstance(password, str) or len(password) > MAX_PASSWORD_CHARS:
                raise Refusal(400, f"password must be a string of at most {MAX_PASSWORD_CHARS}")
            reply = await self.run(
                "whoami", {}, auth_id=auth_id, password=password, session_ok=False
            )
            if reply.code != 200 or not isinstance(reply.result, dict):
                raise Refusal(_HTTP_STATUS.get(reply.code, 500), reply.message or "refused")
            role = str(reply.result.get("role"))
            session_id, session = self.server.new_session(auth_id, password, role)
            self.set_signed_cookie(
                SESSION_COOKIE,
                session_id,
                expires_days=None,
                httponly=True,
                samesite="Strict",
                path="/",
            )
            self.send_json(200, {**reply.result, "csrf_token": session.csrf})
        except Refusal as refusal:
            self.refuse(refusal)


class LogoutHandler(BaseHandler):
    def post(self) -> None:
        if self.session_id is not None:
            self.server.sessions.pop(self.session_id, None)
        self.clear_cookie(SESSION_COOKIE, path="/")
        self.send_json(200, {"logged_out": True})


class SessionHandler(BaseHandler):
    """GET: who is logged in, and the CSRF token the page sends with every change."""

    def get(self) -> None:
        session = self.web_session
        if session is None:  # pragma: no cover - prepare() refused already
            return
        broker = self.server.node.broker
        self.send_json(
            200,
            {
                "auth_id": session.auth_id,
                "role": session.role,
                "broker": broker.identity,
                "family": broker.network.family,
                "csrf_token": session.csrf,
            },
        )


class CommandsHandler(BaseHandler):
    """GET: the command table as the API offers it (name, role, method, args)."""

    def get(self) -> None:
        self.send_json(
            200,
            {
                "commands": [
                    {
                        "name": c.name,
                        "role": c.role,
                        "summary": c.summary,
                        "method": "GET" if c.role == "read" else "POST",
                        "path": f"/api/{c.name}",
                        "args": {
                            name: {"type": arg.kind.__name__, "doc": arg.doc}
                            for name, arg in c.accepted().items()
                        },
                    }
                    for c in COMMANDS.values()
                ]
            },
        )


class TrendsHandler(BaseHandler):
    """GET: the trend summary (management.trend_summary), read and checked per request, in a
    thread so that a slow disk never stalls the broker's loop."""

    async def get(self) -> None:
        status, body = await self.server.trends_answer()
        if self._finished:
            return
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(body)


class TasksHandler(BaseHandler):
    """GET: the task coordinator's numbers (scale0/mgmt/tasks.py), for any logged-in admin
    whose session the core still accepts (``whoami`` through M3/M4, no scrypt); the
    coordinator checks the same credentials itself (V5)."""

    async def get(self) -> None:
        session = self.web_session
        if session is None:  # pragma: no cover - prepare() refused already
            return
        try:
            recent = self._recent()
            reply = await self.run(
                "whoami",
                {},
                auth_id=session.auth_id,
                password=session.password,
                session_ok=True,
            )
            if reply.code == 401 and self.session_id is not None:
                self.server.sessions.pop(self.session_id, None)  # gone from the config
            if reply.code != 200:
                raise Refusal(_HTTP_STATUS.get(reply.code, 500), reply.message or "refused")
        except Refusal as refusal:
            self.refuse(refusal)
            return
        status, body = await self.server.tasks.ask(session.auth_id, session.password, recent)
        self.send_json(status, body)

    def _recent(self) -> int:
        """The ``recent`` query argument (how many recent tasks), the only one there is."""
        recent = DEFAULT_RECENT
        for name, values in self.request.query_arguments.items():
            text = values[-1].decode("utf-8", "replace")
            if name != "recent":
                raise Refusal(400, f"unknown argument {name!r}: only 'recent' is taken")
            if not text.isascii() or not text.isdigit() or int(text) > MAX_RECENT:
                raise Refusal(
                    400,
                    f"argument 'recent' must be an integer from 0 to {MAX_RECENT}, got {text!r}",
                )
            recent = int(text)
        return recent


class CommandHandler(BaseHandler):
    """/api/COMMAND: GET for read commands (args in the query), POST for changes (JSON body)."""

    command: Command

    def initialize(self, server: ManagementServer, **kwargs: Any) -> None:
        super().initialize(server)
        self.command = kwargs["command"]

    async def get(self) -> None:
        if self.command.role != "read":
            self.refuse(Refusal(405, f"{self.command.name} changes state: use POST"))
            return
        try:
            await self._run(self._query_args())
        except Refusal as refusal:
            self.refuse(refusal)

    async def post(self) -> None:
        if self.command.role == "read":
            self.refuse(Refusal(405, f"{self.command.name} only reads: use GET"))
            return
        try:
            await self._run(self.json_body())
        except Refusal as refusal:
            self.refuse(refusal)

    def _query_args(self) -> dict[str, JsonValue]:
        """Query parameters typed by the command's argument table (the core validates them)."""
        accepted = self.command.accepted()
        args: dict[str, JsonValue] = {}
        for name, values in self.request.query_arguments.items():
            text = values[-1].decode("utf-8", "replace")
            spec = accepted.get(name)
            if spec is None:
                args[name] = text  # the core names the unknown argument
            elif spec.kind is bool:
                if text not in ("true", "false"):
                    raise Refusal(400, f"argument {name!r} must be true or false, got {text!r}")
                args[name] = text == "true"
            elif spec.kind is int:
                if not text.isascii() or not text.lstrip("-").isdigit() or len(text) > 12:
                    raise Refusal(400, f"argument {name!r} must be an integer, got {text!r}")
                args[name] = int(text)
            else:
                args[name] = text
        return args

    async def _run(self, args: dict[str, JsonValue]) -> None:
        session = self.web_session
        if session is None:  # pragma: no cover - prepare() refused already
            return
        reply = await self.run(
            self.command.name,
            args,
            auth_id=session.auth_id,
            password=session.password,
            session_ok=True,
        )
        if reply.code == 401 and self.session_id is not None:
            self.server.sessions.pop(self.session_id, None)  # the admin is gone from the config
        status = _HTTP_STATUS.get(reply.code, reply.code if 400 <= reply.code < 600 else 500)
        self.send_json(
            status, {"code": reply.code, "message": reply.message, "result": reply.result}
        )


class MetricsHandler(BaseHandler):
    """GET /metrics: Prometheus text, rendered from the ``status`` command's counters.

    A session, or HTTP Basic credentials of any admin (Prometheus' ``basic_auth``); Basic
    credentials go through the core's check, and its ban, on every scrape.
    """

    _basic: tuple[str, str] | None = None

    def refuse(self, refusal: Refusal) -> None:
        if refusal.status == 401:
            self.set_header("WWW-Authenticate", 'Basic realm="scale0"')
        super().refuse(refusal)

    def other_auth(self) -> bool:
        header = self.request.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        auth_id, sep, password = decoded.partition(":")
        if not sep or not auth_id:
            return False
        self._basic = (auth_id, password)
        return True

    async def get(self) -> None:
        try:
            if self.web_session is not None:
                session = self.web_session
                reply = await self.run(
                    "status",
                    {},
                    auth_id=session.auth_id,
                    password=session.password,
                    session_ok=True,
                )
            elif self._basic is not None:
                auth_id, password = self._basic
                reply = await self.run(
                    "status", {}, auth_id=auth_id, password=password, session_ok=False
                )
            else:  # pragma: no cover - prepare() refused already
                return
            if reply.code != 200 or not isinstance(reply.result, dict):
                raise Refusal(_HTTP_STATUS.get(reply.code, 500), reply.message or "refused")
        except Refusal as refusal:
            self.refuse(refusal)
            return
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(render_metrics(reply.result).encode("utf-8"))
