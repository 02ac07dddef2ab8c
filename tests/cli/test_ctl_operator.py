"""scale0ctl as an operator meets it (issue 11): signature files among configs, one hash across
formats (--same), the help's exit codes, and tables instead of raw JSON for peers and reloads."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner, Result

from scale0.cli.admin import human_lines
from scale0.cli.ctl import main

CONF = Path(__file__).resolve().parents[2] / "conf"
FORMATS = ("yaml", "json", "xml", "zfl")


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_a_signature_file_among_configs_is_named_as_one(tmp_path: Path) -> None:
    config = tmp_path / "network.yaml"
    shutil.copyfile(CONF / "family" / "network.yaml", config)
    key_dir = tmp_path / "keys"
    assert run("keys", "generate", key_dir).exit_code == 0
    assert run("config", "sign", config, "--key", key_dir / "signing.key").exit_code == 0
    result = run("config", "check", config, f"{config}.sig")
    assert result.exit_code == 1
    assert "network.yaml: ok" in result.stdout
    assert "network.yaml.sig: a signature file, not a config" in result.stderr
    assert "scale0ctl config verify" in result.stderr


def test_hash_same_passes_for_one_config_in_four_formats() -> None:
    for stem in (CONF / "network", CONF / "family" / "network"):
        result = run("config", "hash", "--same", *(f"{stem}.{fmt}" for fmt in FORMATS))
        assert result.exit_code == 0, result.stderr
        assert len({line.split()[0] for line in result.stdout.splitlines()}) == 1


def test_hash_same_fails_naming_the_file_that_differs(tmp_path: Path) -> None:
    changed = tmp_path / "network.yaml"
    text = (CONF / "network.yaml").read_text()
    changed.write_text(text.replace("liveness: 3", "liveness: 4"))
    assert changed.read_text() != text
    result = run("config", "hash", "--same", CONF / "network.json", changed)
    assert result.exit_code == 1
    assert f"{changed}: sha256" in result.stderr and "not the same config" in result.stderr
    # Without --same it only prints the hashes, as sha256sum does.
    assert run("config", "hash", CONF / "network.json", changed).exit_code == 0


def test_help_lists_every_exit_code() -> None:
    result = run("--help")
    text = " ".join(result.stdout.split())
    for code in ("0 on success", "1 when", "2 on a usage error", "3 when", "4 when"):
        assert code in text, text


def test_config_help_lists_set_in_one_sentence() -> None:
    result = run("config", "--help")
    (line,) = [line for line in result.stdout.splitlines() if line.strip().startswith("set ")]
    assert line.rstrip().endswith("."), line


def test_peers_human_output_is_a_table() -> None:
    result = {
        "broker": "b1",
        "state": "active",
        "config_version": 2,
        "sha256": "ab" * 32,
        "origin": "b2",
        "peers": [
            {
                "broker_id": "b2",
                "endpoint": "tcp://127.0.0.1:7003",
                "linked": True,
                "state": "active",
                "config_version": 2,
                "services": {"echo": 1},
                "forwarded": 0,
            }
        ],
        "conflicts": [{"version": 2, "kept": "aa" * 32, "dropped": "bb" * 32, "origin": "b3"}],
    }
    lines = human_lines("list_peers", result)
    assert lines[0].startswith("b1 (active): config v2 sha256 abababababab from b2")
    assert lines[1].split() == [
        "PEER",
        "ENDPOINT",
        "LINKED",
        "STATE",
        "CONFIG",
        "SERVICES",
        "FORWARDED",
    ]
    assert lines[2].split() == ["b2", "tcp://127.0.0.1:7003", "yes", "active", "v2", "echo:1", "0"]
    assert lines[3] == "conflict at v2: kept aaaaaaaaaaaa over bbbbbbbbbbbb (from b3)"
    assert not any(line.lstrip().startswith("{") for line in lines)


def test_reload_config_human_output_says_what_happened() -> None:
    applied = {
        "applied": True,
        "config_version": 3,
        "previous_version": 2,
        "sha256": "cd" * 32,
        "changed": ["config_version", "liveness"],
        "restart_needed": [],
        "conflict": None,
    }
    assert human_lines("reload_config", applied) == [
        "applied: config v3 (was v2), sha256 cdcdcdcdcdcd",
        "changed: config_version, liveness",
        "restart needed: nothing",
    ]
    unchanged = {"applied": False, "config_version": 3, "reason": "same config"}
    assert human_lines("reload_config", unchanged) == [
        "not applied: running config v3",
        "reason: same config",
    ]
