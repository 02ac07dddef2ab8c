"""The HTTP management server over TLS (docs/management.md "TLS"), on real scale0-broker
processes: HTTPS with a self-signed certificate made here, the same roles, Secure cookies, no
plain HTTP on that port; and a broker that would serve management beyond loopback without a
certificate refuses to start, naming the setting (checked before anything binds)."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from scale0.testing import Family, broker_command, running_family, write_family_configs

pytestmark = pytest.mark.system

TIMEOUT_S = 15.0


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (IP SAN) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "scale0 management test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / "mgmt.pem"
    key_path = directory / "mgmt.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Family, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(directory)
    with running_family(
        directory,
        size=1,
        management_overrides=[{"tls_cert": str(cert), "tls_key": str(key)}],
    ) as started:
        yield started, cert


class Https:
    """An HTTPS client that trusts only the test's certificate; keeps the session cookie."""

    def __init__(self, base: str, cafile: Path) -> None:
        parts = urlsplit(base)
        assert parts.scheme == "https", base
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 443
        self.context = ssl.create_default_context(cafile=str(cafile))
        self.cookie: str | None = None
        self.csrf: str | None = None
        self.set_cookie: str | None = None

    def json(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Host": f"{self.host}:{self.port}"}
        data = None
        if method != "GET":
            data = json.dumps(body or {}).encode()
            headers |= {
                "Content-Type": "application/json",
                "Origin": f"https://{self.host}:{self.port}",
            }
            if self.csrf:
                headers["X-CSRF-Token"] = self.csrf
        if self.cookie:
            headers["Cookie"] = self.cookie
        connection = http.client.HTTPSConnection(
            self.host, self.port, timeout=TIMEOUT_S, context=self.context
        )
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            set_cookie = response.getheader("Set-Cookie")
            if set_cookie:
                self.set_cookie = set_cookie
                self.cookie = set_cookie.split(";", 1)[0]
            return response.status, json.loads(payload)
        finally:
            connection.close()

    def login(self, auth_id: str, password: str) -> int:
        status, document = self.json(
            "POST", "/api/login", {"auth_id": auth_id, "password": password}
        )
        if status == 200:
            self.csrf = document["csrf_token"]
        return status


def test_management_speaks_https_with_the_same_roles(tls_family: tuple[Family, Path]) -> None:
    family, cert = tls_family
    base = family["b1"].management
    assert base.startswith("https://127.0.0.1:")
    admin = Https(base, cert)
    assert admin.login("admin", family.admins["admin"][0]) == 200
    assert admin.set_cookie is not None and "Secure" in admin.set_cookie
    status, whoami = admin.json("GET", "/api/whoami")
    assert status == 200 and whoami["result"]["role"] == "admin"
    viewer = Https(base, cert)
    assert viewer.login("viewer", family.admins["viewer"][0]) == 200
    status, refused = viewer.json("POST", "/api/disable", {})
    assert status == 403, refused  # a read admin may not change: the same roles as over HTTP
    assert Https(base, cert).login("admin", "wrong") == 401


def test_no_plain_http_on_a_tls_port(tls_family: tuple[Family, Path]) -> None:
    family, _cert = tls_family
    parts = urlsplit(family["b1"].management)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=TIMEOUT_S)
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            connection.request("GET", "/api/session")
            connection.getresponse().read()
    finally:
        connection.close()


def test_an_untrusted_certificate_is_refused_by_a_checking_client(
    tls_family: tuple[Family, Path], tmp_path: Path
) -> None:
    family, _cert = tls_family
    other, _key = self_signed(tmp_path)  # a different certificate: not the server's
    with pytest.raises(ssl.SSLCertVerificationError):
        Https(family["b1"].management, other).json("GET", "/api/session")


def start_and_fail(broker_file: Path) -> str:
    done = subprocess.run(
        [broker_command(), "--config", str(broker_file)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done
    return done.stderr.decode()


def test_management_beyond_loopback_without_a_certificate_refuses_to_start(
    tmp_path: Path,
) -> None:
    files, _network, _config = write_family_configs(
        tmp_path, 1, management=True, management_overrides=[{"http_address": "0.0.0.0"}]
    )
    error = start_and_fail(files[0])
    assert "management.tls_cert" in error and "'0.0.0.0' is not loopback" in error, error
    assert "insecure: true" in error


def test_a_certificate_that_does_not_load_is_named(tmp_path: Path) -> None:
    files, _network, _config = write_family_configs(
        tmp_path, 1, management=True, management_overrides=[{"tls_cert": "garbage.pem"}]
    )
    (files[0].parent / "garbage.pem").write_text("not a certificate\n")
    error = start_and_fail(files[0])
    assert "cannot serve management over TLS" in error and "garbage.pem" in error, error
    document = yaml.safe_load(files[0].read_text())
    assert document["management"]["tls_cert"] == "garbage.pem"  # relative to the broker file
