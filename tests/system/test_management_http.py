"""The HTTP management server of a real scale0-broker process: login, sessions, CSRF, cross-site
and path-traversal refusals, bans, /metrics, the OpenAPI file, and nothing listening when off."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scale0.core.commands import COMMANDS
from scale0.mgmt.server import api_routes
from scale0.testing import Family, FamilyMember, running_family
from tests.conftest import SPARK_TIMEOUT_S

pytestmark = pytest.mark.system

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "management.openapi.json"
TIMEOUT_S = 15.0


class Http:
    """A browser-ish HTTP client for one server: keeps the session cookie, sends Origin."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.origin = f"http://{self.host}:{self.port}"
        self.cookie: str | None = None
        self.csrf: str | None = None
        self.last_set_cookie: str | None = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        origin: bool = True,
        csrf: bool = True,
    ) -> tuple[int, dict[str, str], bytes]:
        all_headers = {"Host": f"{self.host}:{self.port}"}
        data: bytes | None = None
        if method != "GET":
            all_headers["Content-Type"] = "application/json"
            data = json.dumps(body if body is not None else {}).encode()
            if origin:
                all_headers["Origin"] = self.origin
            if csrf and self.csrf is not None:
                all_headers["X-CSRF-Token"] = self.csrf
        if self.cookie is not None:
            all_headers["Cookie"] = self.cookie
        all_headers.update(headers or {})
        connection = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in all_headers.items():
                connection.putheader(name, value)
            if data is not None:
                connection.putheader("Content-Length", str(len(data)))
            connection.endheaders(data)
            response = connection.getresponse()
            payload = response.read()
            got = {k.lower(): v for k, v in response.getheaders()}
            set_cookie = response.getheader("Set-Cookie")
            if set_cookie:
                self.last_set_cookie = set_cookie
                self.cookie = set_cookie.split(";", 1)[0]
            return response.status, got, payload
        finally:
            connection.close()

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, headers, payload = self.request(method, path, body, **kw)
        assert headers["content-type"].startswith("application/json"), (status, payload)
        return status, json.loads(payload)

    def login(self, auth_id: str, password: str) -> tuple[int, Any]:
        status, document = self.json(
            "POST", "/api/login", {"auth_id": auth_id, "password": password}
        )
        if status == 200:
            self.csrf = document["csrf_token"]
        return status, document


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    # b1 shows the trend summary at ../trend/summary.json (relative to its file); b2 has none.
    with running_family(
        tmp_path_factory.mktemp("http"),
        size=2,
        management_overrides=[{"trend_summary": "../trend/summary.json"}, {}],
    ) as started:
        yield started


@pytest.fixture
def b1(family: Family) -> FamilyMember:
    return family["b1"]


def admin(family: Family) -> Http:
    client = Http(family["b1"].management)
    status, _ = client.login("admin", family.admins["admin"][0])
    assert status == 200
    return client


# ---- unauthenticated ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(p for p, m in api_routes().items() if "get" in m))
def test_every_get_route_but_the_page_needs_a_session(b1: FamilyMember, path: str) -> None:
    status, document = Http(b1.management).json("GET", path)
    assert status == 401 and document["code"] == 401


@pytest.mark.parametrize("path", sorted(p for p, m in api_routes().items() if "post" in m))
def test_every_post_route_refuses_strangers(b1: FamilyMember, path: str) -> None:
    client = Http(b1.management)
    status, _ = client.json("POST", path, {})
    assert status in (400, 401), status  # login: 400 (no credentials); the rest 401
    assert client.cookie is None


def test_metrics_without_credentials_asks_for_basic_auth(b1: FamilyMember) -> None:
    status, headers, _ = Http(b1.management).request("GET", "/metrics")
    assert status == 401 and headers["www-authenticate"] == 'Basic realm="scale0"'


# ---- login and session -------------------------------------------------------------------------


def test_login_sets_an_httponly_samesite_strict_signed_cookie(family: Family) -> None:
    client = Http(family["b1"].management)
    status, document = client.login("admin", family.admins["admin"][0])
    assert status == 200
    assert (document["auth_id"], document["role"], document["broker"]) == ("admin", "admin", "b1")
    cookie = client.last_set_cookie or ""
    attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= attributes
    assert family.admins["admin"][0] not in cookie  # the password never leaves the server
    status, session = client.json("GET", "/api/session")
    assert status == 200 and session["csrf_token"] == client.csrf
    # A cookie whose signature does not match is no session.
    assert client.cookie is not None
    name, _, value = client.cookie.partition("=")
    client.cookie = f"{name}={value[:-3]}abc"
    assert client.json("GET", "/api/session")[0] == 401


def test_login_with_a_wrong_password_or_unknown_id_is_401(b1: FamilyMember) -> None:
    for auth_id, password in (("admin", "nope"), ("nobody", "nope")):
        client = Http(b1.management)
        status, document = client.login(auth_id, password)
        assert (status, document["message"]) == (401, "bad credentials")
        assert client.cookie is None


def test_login_rejects_bad_bodies_naming_the_field(b1: FamilyMember) -> None:
    client = Http(b1.management)
    status, document = client.json("POST", "/api/login", {"auth_id": 5, "password": "x"})
    assert status == 400 and "auth_id" in document["message"]
    status, _, _ = client.request("POST", "/api/login", headers={"Content-Type": "text/plain"})
    assert status == 415


def test_logout_ends_the_session(family: Family) -> None:
    client = admin(family)
    assert client.json("POST", "/api/logout")[0] == 200
    assert client.json("GET", "/api/session")[0] == 401


# ---- commands over HTTP ------------------------------------------------------------------------


def test_read_commands_are_get_with_query_args(family: Family) -> None:
    client = admin(family)
    status, document = client.json("GET", "/api/status")
    assert status == 200 and document["result"]["broker"] == "b1"
    status, document = client.json("GET", "/api/list_services?family=true&timeout_ms=2000")
    assert status == 200
    assert [b["broker"] for b in document["result"]["brokers"]] == ["b1", "b2"]
    status, document = client.json("GET", "/api/status?family=maybe")
    assert status == 400 and "'family' must be true or false" in document["message"]
    status, document = client.json("GET", "/api/status?bogus=1")
    assert status == 400 and "unknown argument 'bogus'" in document["message"]


def test_wrong_method_is_405_and_unknown_path_404(family: Family) -> None:
    client = admin(family)
    assert client.json("GET", "/api/disable")[0] == 405
    assert client.json("POST", "/api/status")[0] == 405
    assert client.json("GET", "/api/no_such_command")[0] == 404


def test_admin_disables_and_enables_another_broker_over_http(family: Family) -> None:
    client = admin(family)
    status, document = client.json("POST", "/api/disable", {"broker": "b2"})
    try:
        assert status == 200 and document["result"]["state"] == "disabled"
        _, family_status = client.json("GET", "/api/status?family=true")
        states = {b["broker"]: b["result"]["state"] for b in family_status["result"]["brokers"]}
        assert states == {"b1": "active", "b2": "disabled"}
    finally:
        status, document = client.json("POST", "/api/enable", {"broker": "b2"})
    assert status == 200 and document["result"]["state"] == "active"


def test_read_user_sees_but_the_api_refuses_changes(family: Family) -> None:
    client = Http(family["b1"].management)
    status, document = client.login("viewer", family.admins["viewer"][0])
    assert status == 200 and document["role"] == "read"
    assert client.json("GET", "/api/status")[0] == 200
    status, document = client.json("POST", "/api/disable", {})
    assert status == 403 and "needs role admin" in document["message"]
    _, status_doc = client.json("GET", "/api/status")
    assert status_doc["result"]["state"] == "active"


# ---- CSRF and cross-site -----------------------------------------------------------------------


def test_changes_need_the_csrf_token(family: Family) -> None:
    client = admin(family)
    status, document = client.json("POST", "/api/disable", {}, csrf=False)
    assert status == 403 and "X-CSRF-Token" in document["message"]
    status, _ = client.json("POST", "/api/disable", {}, headers={"X-CSRF-Token": "forged"})
    assert status == 403
    assert client.json("GET", "/api/status")[1]["result"]["state"] == "active"


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
def test_cross_site_changes_are_refused_even_with_a_session(
    family: Family, headers: dict[str, str]
) -> None:
    client = admin(family)
    status, document = client.json("POST", "/api/disable", {}, headers=headers)
    assert status == 403 and "cross-site" in document["message"]
    assert client.json("GET", "/api/status")[1]["result"]["state"] == "active"


def test_missing_origin_is_refused(family: Family) -> None:
    client = admin(family)
    status, _ = client.json("POST", "/api/disable", {}, origin=False)
    assert status == 403


def test_cross_site_reads_and_logins_are_refused(family: Family) -> None:
    client = admin(family)
    status, _ = client.json("GET", "/api/status", headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403
    stranger = Http(family["b1"].management)
    status, _ = stranger.json(
        "POST",
        "/api/login",
        {"auth_id": "admin", "password": family.admins["admin"][0]},
        headers={"Origin": "http://evil.example"},
    )
    assert status == 403 and stranger.cookie is None


def test_a_foreign_host_header_is_refused(family: Family) -> None:
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example."""
    client = admin(family)
    status, _ = client.json("GET", "/api/status", headers={"Host": "evil.example:80"})
    assert status == 403
    status, _, _ = client.request("GET", "/", headers={"Host": "evil.example"})
    assert status == 403


# ---- static files ------------------------------------------------------------------------------


def test_the_page_and_its_files_are_served_with_security_headers(b1: FamilyMember) -> None:
    client = Http(b1.management)
    status, headers, body = client.request("GET", "/")
    assert status == 200 and b"<title>Scale0 management</title>" in body
    assert headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    for path, kind in (("/static/app.js", "text/javascript"), ("/static/app.css", "text/css")):
        status, headers, _ = client.request("GET", path)
        assert status == 200 and headers["content-type"].startswith(kind)


@pytest.mark.parametrize(
    "path",
    [
        "/static/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%2f..%2f..%2fetc%2fpasswd",
        "/static/app.js/../../../setup.cfg",
        "/../../../../etc/passwd",
        "//etc/passwd",
        "/static/",
        "/static/index.html",
        "/static/app.js%00.png",
        "/index.html",
        "/static/..\\..\\setup.cfg",
        "/setup.cfg",
    ],
)
def test_path_traversal_is_refused(b1: FamilyMember, path: str) -> None:
    status, _, body = Http(b1.management).request("GET", path)
    assert status in (400, 404), (path, status)
    assert b"root:" not in body and b"[metadata]" not in body


# ---- /metrics ----------------------------------------------------------------------------------


def _basic(auth_id: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{auth_id}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_metrics_with_basic_auth_parse_as_prometheus_text(family: Family) -> None:
    client = Http(family["b1"].management)
    status, headers, body = client.request(
        "GET", "/metrics", headers=_basic("viewer", family.admins["viewer"][0])
    )
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    expected = {
        "scale0_broker_state",
        "scale0_config_version",
        "scale0_requests",
        "scale0_replies",
        "scale0_request_latency_seconds",
        "scale0_service_workers",
        "scale0_queue_depth",
        "scale0_banned_senders",
        "scale0_connections",
        "scale0_unnegotiated_connections",
        "scale0_dropped_messages",
    }
    assert expected <= set(families), sorted(families)
    state = {s.labels["state"]: s.value for s in families["scale0_broker_state"].samples}
    assert state["active"] == 1 and state["disabled"] == 0
    assert families["scale0_config_version"].samples[0].value == 1
    bad = client.request("GET", "/metrics", headers=_basic("viewer", "wrong"))
    assert bad[0] == 401


def test_metrics_with_a_session_too(family: Family) -> None:
    status, _, body = admin(family).request("GET", "/metrics")
    assert status == 200 and b"scale0_requests_total" in body


# ---- bans --------------------------------------------------------------------------------------


def test_repeated_failed_logins_ban_the_address(tmp_path: Path) -> None:
    with running_family(tmp_path, size=1, error_threshold=2, error_ban_s=30.0) as small:
        client = Http(small["b1"].management)
        assert client.login("admin", "guess-1")[0] == 401
        assert client.login("admin", "guess-2")[0] == 401
        assert client.login("admin", "guess-3")[0] == 429
        # From now on everything from this address is 403, even the right password.
        assert client.login("admin", small.admins["admin"][0])[0] == 403
        assert client.request("GET", "/")[0] == 403


# ---- the trend summary (GET /api/trends) -------------------------------------------------------


@pytest.fixture
def summary_path(family: Family) -> Iterator[Path]:
    """Where b1 reads its trend summary; whatever a test leaves there is removed after it."""
    path = family["b1"].directory.parent / "trend" / "summary.json"
    path.parent.mkdir(exist_ok=True)
    yield path
    if path.is_dir():
        path.rmdir()
    path.unlink(missing_ok=True)


def trends(family: Family, broker: str = "b1", user: str = "viewer") -> tuple[int, Any]:
    client = Http(family[broker].management)
    assert client.login(user, family.admins[user][0])[0] == 200
    return client.json("GET", "/api/trends")


def test_trends_on_a_broker_without_a_summary_say_how_to_configure_one(family: Family) -> None:
    status, document = trends(family, "b2")
    assert status == 404 and document["code"] == 404
    assert document["result"] == {"configured": False, "file": None}
    assert "set management.trend_summary" in document["message"]


def test_a_missing_summary_names_the_scale0_trend_command_that_makes_it(
    family: Family, summary_path: Path
) -> None:
    status, document = trends(family)
    assert status == 404
    command = f"scale0-trend {family['b1'].directory / 'events'} --out {summary_path.parent}"
    assert document["result"] == {
        "configured": True,
        "file": str(summary_path),
        "command": command,
    }
    assert document["message"] == f"{summary_path} does not exist yet: make it with `{command}`"


@pytest.mark.timeout(SPARK_TIMEOUT_S)
def test_the_summary_the_job_made_is_served_as_it_is_read_per_request(
    family: Family, summary_path: Path, trend_summary: Path
) -> None:
    shutil.copyfile(trend_summary, summary_path)
    client = Http(family["b1"].management)
    assert client.login("viewer", family.admins["viewer"][0])[0] == 200  # role read is enough
    status, headers, payload = client.request("GET", "/api/trends")
    assert status == 200
    assert headers["cache-control"] == "no-store"
    assert headers["content-type"].startswith("application/json")
    document = json.loads(payload)
    result = document["result"]
    assert result["summary"] == json.loads(trend_summary.read_text())
    assert result["file"] == str(summary_path)
    assert result["size_bytes"] == trend_summary.stat().st_size
    assert result["modified"].endswith("+00:00")
    # A new run of the job replaces the file: the next request sees it, no restart.
    changed = json.loads(trend_summary.read_text())
    changed["generated_at"] = "2030-01-01T00:00:00+00:00"
    summary_path.write_text(json.dumps(changed))
    status, document = client.json("GET", "/api/trends")
    assert status == 200 and document["result"]["summary"]["generated_at"].startswith("2030")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"schema_version": 1, "generated_at": "2026-', "not valid JSON"),
        (b'{"schema_version": 2, "totals": {}}', "schema_version 2 is newer than this Scale0"),
        (b'{"schema_version": 1, "services": "many"}', "services: expected a list"),
        (b" " * (9 * 1024 * 1024), "bytes; the limit is 8388608"),
        (None, "not a regular file"),
    ],
    ids=["cut-short", "newer", "wrong-shape", "too-large", "a-directory"],
)
def test_a_bad_summary_is_a_422_naming_the_file_and_the_problem(
    family: Family, summary_path: Path, content: bytes | None, expected: str
) -> None:
    if content is None:
        summary_path.mkdir()
    else:
        summary_path.write_bytes(content)
    status, document = trends(family)
    assert status == 422 and document["code"] == 422, document
    assert document["message"].startswith(f"{summary_path}: ")
    assert expected in document["message"]
    assert document["result"]["file"] == str(summary_path)
    assert document["result"]["newer"] is (expected.startswith("schema_version 2"))
    # The broker is unharmed: it still answers.
    assert Http(family["b1"].management).login("admin", family.admins["admin"][0])[0] == 200


# ---- the OpenAPI file --------------------------------------------------------------------------


def test_openapi_paths_match_the_server_routes() -> None:
    document = json.loads(OPENAPI.read_text())
    assert document["openapi"].startswith("3.")
    documented = {
        path: {m for m in methods if m in ("get", "post")}
        for path, methods in document["paths"].items()
    }
    assert documented == api_routes()
    for name, command in COMMANDS.items():
        operation = document["paths"][f"/api/{name}"]["get" if command.role == "read" else "post"]
        assert operation["summary"] == command.summary, name
        documented_args = {p["name"] for p in operation.get("parameters", [])}
        if command.role != "read":
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            documented_args = set(schema.get("properties", {}))
        assert documented_args == set(command.accepted()), name


# ---- off by default ----------------------------------------------------------------------------


def _listening_ports(pid: int) -> set[int]:
    """TCP ports in LISTEN state on sockets the process holds (from /proc, no tools needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        match = re.fullmatch(r"socket:\[(\d+)\]", target)
        if match:
            inodes.add(match.group(1))
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_nothing_listens_for_http_when_management_is_off(tmp_path: Path) -> None:
    with running_family(tmp_path, size=1, management=False) as small:
        member = small["b1"]
        assert "management" not in member.endpoints
        assert member.process is not None
        expected = {int(e.rsplit(":", 1)[1]) for e in member.endpoints.values()}
        assert _listening_ports(member.process.pid) == expected


def test_the_management_port_is_the_only_extra_listener_when_on(b1: FamilyMember) -> None:
    assert b1.process is not None
    ports = _listening_ports(b1.process.pid)
    http_port = urlsplit(b1.management).port
    assert urlsplit(b1.management).hostname == "127.0.0.1"
    zmq_ports = {
        int(b1.endpoints[c].rsplit(":", 1)[1])
        for c in ("frontend", "backend", "peer", "config_pub")
    }
    assert ports == zmq_ports | {http_port}
