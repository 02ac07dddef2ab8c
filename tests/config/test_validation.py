"""Bad configs: every problem is reported, naming file, field path and line; nothing is returned."""

from __future__ import annotations

from pathlib import Path

import pytest

from scale0.config.errors import ConfigError, Problem
from scale0.config.loader import load, loads
from scale0.config.model import NetworkConfig
from tests.config.conftest import CONF


def problems(path: Path) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load(path)
    return list(info.value.problems)


def only(found: list[Problem], field: str) -> Problem:
    matching = [p for p in found if p.path == field]
    assert len(matching) == 1, [str(p) for p in found]
    return matching[0]


BROKER = """\
  - identity: {ident}
    frontend: tcp://127.0.0.1:{p0}
    backend: tcp://127.0.0.1:{p1}
    peer: tcp://127.0.0.1:{p2}
    config_pub: tcp://127.0.0.1:{p3}
    config_source: {source}
"""


def network_yaml(*brokers: str, extra: str = "") -> str:
    return "family: f\nconfig_version: 1\nbrokers:\n" + "".join(brokers) + extra


def broker(ident: str, base: int, source: bool = True) -> str:
    return BROKER.format(
        ident=ident, p0=base, p1=base + 1, p2=base + 2, p3=base + 3, source=str(source).lower()
    )


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_unknown_key_is_named_with_a_suggestion_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "n.yaml", network_yaml(broker("a", 5000), extra="livenes: 3\n"))
    p = only(problems(path), "livenes")
    assert p.file == str(path) and p.line == 10
    assert "did you mean 'liveness'" in p.message
    assert str(p).startswith(f"{path}:10: livenes: unknown key")


def test_wrong_type_names_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "n.yaml", network_yaml(broker("a", 5000), extra="liveness: three\n"))
    assert "expected an integer" in only(problems(path), "liveness").message


def test_bool_is_not_an_integer(tmp_path: Path) -> None:
    path = write(tmp_path, "n.json", '{"family":"f","config_version":true,"brokers":[]}')
    assert "expected an integer" in only(problems(path), "config_version").message


def test_every_structural_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000), extra="liveness: x\nerror_ban_s: y\nbogus: 1\n")
    found = problems(write(tmp_path, "n.yaml", text))
    assert {p.path for p in found} == {"liveness", "error_ban_s", "bogus"}


def test_port_out_of_range_in_a_list_item_names_the_index(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000), broker("b", 6000, source=False)).replace("6000", "99999")
    p = only(problems(write(tmp_path, "n.yaml", text)), "brokers[1].frontend")
    assert "out of range" in p.message and p.line == 11


def test_reused_endpoint(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000), broker("b", 5003, source=False))
    p = only(problems(write(tmp_path, "n.yaml", text)), "brokers[1].frontend")
    assert "already used by brokers[0].config_pub" in p.message


def test_duplicate_identity(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000), broker("a", 6000))
    p = only(problems(write(tmp_path, "n.yaml", text)), "brokers[1].identity")
    assert "duplicate identity 'a'" in p.message


def test_family_without_config_source(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000, source=False))
    assert "no config source" in only(problems(write(tmp_path, "n.yaml", text)), "brokers").message


def test_plain_text_password_is_refused(tmp_path: Path) -> None:
    text = network_yaml(
        broker("a", 5000),
        extra="admins:\n  - auth_id: root\n    password: hunter2\n",
    )
    found = problems(write(tmp_path, "n.yaml", text))
    assert "plain-text passwords are refused" in only(found, "admins[0].password").message


def test_plain_text_in_password_hash_is_refused(tmp_path: Path) -> None:
    text = network_yaml(
        broker("a", 5000),
        extra="admins:\n  - auth_id: root\n    password_hash: hunter2\n",
    )
    p = only(problems(write(tmp_path, "n.yaml", text)), "admins[0].password_hash")
    assert "not a scrypt hash" in p.message and p.line == 12


def test_admins_are_never_in_the_client_view(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000), extra="client_view: [family, config_version, admins]\n")
    p = only(problems(write(tmp_path, "n.yaml", text)), "client_view[2]")
    assert "never shown" in p.message


def test_peer_link_to_unknown_broker(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000), extra="peers:\n  - {source: a, target: zz}\n")
    p = only(problems(write(tmp_path, "n.yaml", text)), "peers[0].target")
    assert "'zz' is not a broker" in p.message


def test_reserved_service_names(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000), extra="services: [echo, mmi.service]\n")
    assert "reserved" in only(problems(write(tmp_path, "n.yaml", text)), "services[1]").message


def test_values_every_format_cannot_carry(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000)).replace("family: f", 'family: "f\\tg"')
    found = problems(write(tmp_path, "n.yaml", text))
    assert any(
        p.path == "family" and "printable characters, found U+0009" in p.message for p in found
    )


def test_broker_ports_reused_and_missing_source_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b.yaml",
        "identity: x\nfrontend_port: 7000\nbackend_port: 7000\nconfig_source: true\n",
    )
    found = problems(path)
    assert "already used by frontend_port" in only(found, "backend_port").message
    assert only(found, "backend_port").line == 3
    assert {"network_config", "signing_key", "trusted_keys"} <= {p.path for p in found}


def test_port_zero_may_repeat(tmp_path: Path) -> None:
    text = (
        "identity: x\nfrontend_port: 0\nbackend_port: 0\npeer_port: 0\nconfig_pub_port: 0\n"
        "trusted_keys: [k.pub]\nfamily: f\nseeds: ['tcp://127.0.0.1:5557']\n"
    )
    assert load(write(tmp_path, "b.yaml", text)).frontend_port == 0


def test_a_joining_broker_names_its_family_and_where_to_join_from(tmp_path: Path) -> None:
    text = "identity: x\ntrusted_keys: [k.pub]\n"
    found = {p.path: p.message for p in problems(write(tmp_path, "b.yaml", text))}
    assert "name the family" in found["family"]
    assert "seeds or config_sub_ports" in found["seeds"]


def test_xml_errors_carry_lines(tmp_path: Path) -> None:
    text = (
        (CONF / "network.xml")
        .read_text()
        .replace("<liveness>3</liveness>", "<liveness>3x</liveness>")
    )
    path = write(tmp_path, "n.xml", text)
    p = only(problems(path), "liveness")
    assert p.line == text.splitlines().index("  <liveness>3x</liveness>") + 1


def test_xml_list_item_lines(tmp_path: Path) -> None:
    text = (CONF / "network.xml").read_text().replace("<role>read</role>", "<role>root</role>")
    p = only(problems(write(tmp_path, "n.xml", text)), "admins[1].role")
    assert p.line == text.splitlines().index("      <role>root</role>") + 1


def test_zfl_errors_carry_lines(tmp_path: Path) -> None:
    text = (CONF / "network.zfl").read_text().replace("role = read", "role = root")
    p = only(problems(write(tmp_path, "n.zfl", text)), "admins[1].role")
    assert p.line == text.splitlines().index("        role = root") + 1


def test_json_errors_carry_lines(tmp_path: Path) -> None:
    text = (CONF / "network.json").read_text().replace('"liveness": 3', '"liveness": "3"')
    p = only(problems(write(tmp_path, "n.json", text)), "liveness")
    assert p.line == next(i for i, s in enumerate(text.splitlines(), 1) if '"liveness"' in s)


def test_json_syntax_error_has_line(tmp_path: Path) -> None:
    path = write(tmp_path, "n.json", '{\n  "family": "f",\n  "x": ,\n}')
    (p,) = problems(path)
    assert p.line == 3 and "invalid JSON" in p.message


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    (p,) = problems(write(tmp_path, "n.yaml", "family: a\nfamily: b\n"))
    assert "duplicate key 'family'" in p.message and p.line == 2
    (p,) = problems(write(tmp_path, "n.json", '{"family": "a", "family": "b"}'))
    assert "duplicate key" in p.message


def test_xml_root_names_the_kind(tmp_path: Path) -> None:
    text = (
        (CONF / "network.xml")
        .read_text()
        .replace("<network>", "<net>")
        .replace("</network>", "</net>")
    )
    (p,) = problems(write(tmp_path, "n.xml", text))
    assert "<net>" in p.message


def test_expected_kind_is_checked() -> None:
    data = (CONF / "broker.xml").read_bytes()
    with pytest.raises(ConfigError, match="a network config was expected"):
        loads(data, "xml", kind="network")


def test_unknown_extension(tmp_path: Path) -> None:
    (p,) = problems(write(tmp_path, "n.toml", "x = 1"))
    assert "extension '.toml'" in p.message


def test_missing_file(tmp_path: Path) -> None:
    (p,) = problems(tmp_path / "nope.yaml")
    assert "cannot read" in p.message and p.file == str(tmp_path / "nope.yaml")


def test_valid_hash_is_accepted(tmp_path: Path) -> None:
    from scale0.crypto.passwords import hash_password

    good = hash_password("pw", n=2**10)
    text = network_yaml(
        broker("a", 5000), extra=f"admins:\n  - auth_id: root\n    password_hash: '{good}'\n"
    )
    config = load(write(tmp_path, "n.yaml", text))
    assert config.admins[0].password_hash == good


def test_trend_summary_is_optional_and_never_empty(tmp_path: Path) -> None:
    text = (
        "identity: x\ntrusted_keys: [k.pub]\nfamily: f\nseeds: ['tcp://127.0.0.1:5557']\n"
        "management: {enabled: true, trend_summary: ../trend/summary.json}\n"
    )
    loaded = load(write(tmp_path, "b.yaml", text))
    assert loaded.management.trend_summary == "../trend/summary.json"
    assert (
        load(
            write(tmp_path, "c.yaml", text.replace(", trend_summary: ../trend/summary.json", ""))
        ).management.trend_summary
        is None
    )
    found = problems(write(tmp_path, "d.yaml", text.replace("../trend/summary.json", "''")))
    assert "must not be empty" in only(found, "management.trend_summary").message


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.1.2.3", "mgmt.example.org"])
def test_management_beyond_loopback_needs_a_certificate_or_insecure(
    tmp_path: Path, address: str
) -> None:
    base = "identity: x\ntrusted_keys: [k.pub]\nfamily: f\nseeds: ['tcp://127.0.0.1:5557']\n"
    text = base + f"management: {{enabled: true, http_address: '{address}'}}\n"
    problem = only(problems(write(tmp_path, "b.yaml", text)), "management.tls_cert")
    assert "is not loopback" in problem.message and "insecure: true" in problem.message
    with_cert = text.replace("}", ", tls_cert: mgmt.pem, tls_key: mgmt.key}")
    assert load(write(tmp_path, "c.yaml", with_cert)).management.tls_cert == "mgmt.pem"
    insecure = text.replace("}", ", insecure: true}")
    assert load(write(tmp_path, "d.yaml", insecure)).management.insecure is True
    # Off, it binds nothing: no certificate needed.
    assert (
        load(write(tmp_path, "e.yaml", text.replace("true", "false"))).management.tls_cert is None
    )


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_management_on_loopback_needs_no_certificate(tmp_path: Path, address: str) -> None:
    base = "identity: x\ntrusted_keys: [k.pub]\nfamily: f\nseeds: ['tcp://127.0.0.1:5557']\n"
    text = base + f"management: {{enabled: true, http_address: '{address}'}}\n"
    assert load(write(tmp_path, "b.yaml", text)).management.http_address == address


def test_management_tls_settings_that_contradict_are_named(tmp_path: Path) -> None:
    base = "identity: x\ntrusted_keys: [k.pub]\nfamily: f\nseeds: ['tcp://127.0.0.1:5557']\n"
    key_only = base + "management: {enabled: true, tls_key: mgmt.key}\n"
    assert (
        "tls_cert is not"
        in only(problems(write(tmp_path, "b.yaml", key_only)), "management.tls_key").message
    )
    both = base + "management: {enabled: true, tls_cert: m.pem, insecure: true}\n"
    assert (
        "contradicts"
        in only(problems(write(tmp_path, "c.yaml", both)), "management.insecure").message
    )


def test_tasks_service_and_timeout_are_checked(tmp_path: Path) -> None:
    head = "identity: x\ntrusted_keys: [k.pub]\nfamily: f\nseeds: ['tcp://127.0.0.1:5557']\n"
    loaded = load(write(tmp_path, "a.yaml", head + "management: {enabled: true}\n"))
    assert (loaded.management.tasks_service, loaded.management.tasks_timeout_ms) == (
        "vespid",
        2000,
    )
    text = head + "management: {enabled: true, tasks_service: tasks, tasks_timeout_ms: 500}\n"
    loaded = load(write(tmp_path, "b.yaml", text))
    assert (loaded.management.tasks_service, loaded.management.tasks_timeout_ms) == ("tasks", 500)
    found = problems(write(tmp_path, "c.yaml", text.replace("tasks,", "'two words',")))
    assert "'two words' must be 1-255 printable" in only(found, "management.tasks_service").message
    found = problems(write(tmp_path, "d.yaml", text.replace("500", "99")))
    assert "99 is out of range 100-30000" in only(found, "management.tasks_timeout_ms").message


# ---- CURVE keys and grants (issue 15): malformed key lists are refused, the field named ----

GOOD_KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"


def test_malformed_key_lists_are_refused_naming_each_field(tmp_path: Path) -> None:
    extra = (
        "workers:\n"
        f'  - key: "{GOOD_KEY[:-1]}"\n'
        "    services: [echo]\n"
        '  - key: "*"\n'
        '    services: ["has space"]\n'
        "clients:\n"
        f'  - key: "{"~" * 40}"\n'
        "    until: -5\n"
        f'  - key: "{GOOD_KEY}"\n'
        "    services: []\n"
    )
    found = problems(write(tmp_path, "n.yaml", network_yaml(broker("a", 5000), extra=extra)))
    assert "40 Z85 characters, got 39" in only(found, "workers[0].key").message
    assert "printable ASCII" in only(found, "workers[1].services[0]").message
    assert "not Z85" in only(found, "clients[0].key").message
    assert "UNIX time" in only(found, "clients[0].until").message
    assert "grants nothing" in only(found, "clients[1].services").message
    assert len(found) == 5


def test_a_broken_broker_key_and_curve_without_every_key_are_refused(tmp_path: Path) -> None:
    text = network_yaml(broker("a", 5000), broker("b", 5010, False), extra="curve: true\n")
    text = text.replace(
        "    config_source: false\n", '    config_source: false\n    curve_public_key: "short"\n'
    )
    found = problems(write(tmp_path, "n.yaml", text))
    assert "curve is on for the family" in only(found, "brokers[0].curve_public_key").message
    assert "got 5" in only(found, "brokers[1].curve_public_key").message


def test_key_grants_load_in_every_format(tmp_path: Path) -> None:
    from scale0.config.loader import dumps

    extra = (
        f'curve: false\nworkers:\n  - key: "{GOOD_KEY}"\n    services: ["echo.*"]\n'
        "    until: 1790000000\n"
        '  - key: "*"\n'
    )
    loaded = load(write(tmp_path, "n.yaml", network_yaml(broker("a", 5000), extra=extra)))
    for fmt in ("json", "xml", "zfl"):
        again = loads(dumps(loaded, fmt), fmt)
        assert again == loaded, fmt
    assert loaded.workers[0].services == ("echo.*",) and loaded.workers[1].services == "all"


def test_seed_curve_keys_need_one_key_per_seed(tmp_path: Path) -> None:
    text = (
        "identity: b\nfamily: f\nseeds: [tcp://127.0.0.1:5001, tcp://127.0.0.1:5002]\n"
        f'seed_curve_keys: ["{GOOD_KEY}"]\ntrusted_keys: [k.pub]\n'
    )
    found = problems(write(tmp_path, "b.yaml", text))
    assert "one per seed" in only(found, "seed_curve_keys").message


@pytest.mark.parametrize("ext", ["json", "xml", "yaml", "zfl"])
def test_idle_heartbeat_interval_in_every_format(tmp_path: Path, ext: str) -> None:
    """The example config carries idle beating (5000, in its client view); a value below the
    heartbeat interval is refused naming the field and its line, and nothing is returned."""
    source = (CONF / f"network.{ext}").read_text()
    config = load(CONF / f"network.{ext}")
    assert isinstance(config, NetworkConfig) and config.idle_heartbeat_interval_ms == 5000
    assert "idle_heartbeat_interval_ms" in config.client_view
    for bad, why in (("500", "at least default_heartbeat_interval_ms (1000), got 500"),):
        assert source.count("5000") == 1
        path = write(tmp_path, f"bad.{ext}", source.replace("5000", bad))
        found = problems(path)
        p = only(found, "idle_heartbeat_interval_ms")
        assert why in p.message and p.line is not None
        assert source.splitlines()[p.line - 1].strip().find("5000") >= 0
    off = write(tmp_path, f"off.{ext}", source.replace("5000", "0"))
    off_config = load(off)
    assert isinstance(off_config, NetworkConfig) and off_config.idle_heartbeat_interval_ms == 0
