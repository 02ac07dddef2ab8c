"""scale0ctl: config check/convert/hash/sign/verify, keys generate and passwd, through click's
CliRunner, plus the installed console script as a real process."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from scale0.cli.ctl import main
from scale0.config.canonical import client_view_sha256, config_sha256
from scale0.config.loader import load
from scale0.config.signature import (
    SignatureFileError,
    parse_signature,
    signature_for,
    verify_signature,
)
from scale0.crypto.keys import (
    SignatureError,
    key_id,
    load_private_key,
    load_public_key,
    verify_view,
)
from scale0.crypto.passwords import verify_password

CONF = Path(__file__).resolve().parents[2] / "conf"
CONF_FILES = sorted(p for p in CONF.iterdir() if p.is_file())
FAMILY_FILES = sorted((CONF / "family").iterdir())
NETWORK_FILES = [p for p in CONF_FILES if p.stem == "network"]
FORMATS = ("yaml", "json", "xml", "zfl")


def run(*args: str | Path, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], input=stdin, catch_exceptions=False)


def run_json(*args: str | Path, stdin: str | None = None) -> tuple[Result, dict[str, Any]]:
    result = run("--json", *args, stdin=stdin)
    obj = json.loads(result.stdout)
    assert isinstance(obj, dict)
    assert obj["ok"] is (result.exit_code == 0)
    assert result.stderr == ""
    return result, obj


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)


@pytest.fixture
def network_yaml(tmp_path: Path) -> Path:
    copy = tmp_path / "network.yaml"
    shutil.copyfile(CONF / "network.yaml", copy)
    return copy


@pytest.fixture
def keypair(tmp_path: Path) -> tuple[Path, Path]:
    result = run("keys", "generate", tmp_path / "keys")
    assert result.exit_code == 0, result.output
    return tmp_path / "keys" / "signing.key", tmp_path / "keys" / "signing.pub"


def test_conf_holds_both_kinds_in_four_formats() -> None:
    assert sorted(p.name for p in CONF_FILES) == sorted(
        f"{kind}.{fmt}" for kind in ("network", "broker") for fmt in FORMATS
    )


def test_conf_family_holds_three_brokers_and_one_network_config_in_four_formats() -> None:
    assert [p.name for p in FAMILY_FILES] == sorted(
        ["a.yaml", "b.yaml", "c.yaml", *(f"network.{fmt}" for fmt in FORMATS)]
    )
    hashes = run("config", "hash", *(p for p in FAMILY_FILES if p.stem == "network"))
    assert hashes.exit_code == 0, hashes.output
    assert len({line.split()[0] for line in hashes.stdout.splitlines()}) == 1


# ---------------------------------------------------------------------------------------------
# config check


@pytest.mark.parametrize("path", CONF_FILES, ids=lambda p: p.name)
def test_check_ok(path: Path) -> None:
    result = run("config", "check", path)
    assert result.exit_code == 0, result.output
    config = load(path)
    detail = "network demo v1" if path.stem == "network" else "broker solo"
    assert result.stdout == f"{path}: ok ({detail}, sha256 {config_sha256(config)})\n"
    assert result.stderr == ""


def test_check_broken_file_reports_every_problem_and_checks_the_rest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = (CONF / "network.yaml").read_text()
    text = text.replace("frontend: tcp://127.0.0.1:5555", "frontend: tcp://127.0.0.1:99999")
    text = text.replace("\nliveness: 3\n", "\nliveness: -1\n")
    bad.write_text(text)
    first, last = CONF / "broker.zfl", CONF / "network.xml"

    result = run("config", "check", first, bad, last)

    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"{bad}:{line_of(bad, 'frontend:')}: brokers[0].frontend: "
        "port 99999 of 'tcp://127.0.0.1:99999' is out of range 1-65535",
        f"{bad}:{line_of(bad, 'liveness:')}: liveness: must be greater than 0, got -1",
    ]
    ok_lines = result.stdout.splitlines()
    assert [line.split(": ok (")[0] for line in ok_lines] == [str(first), str(last)]


def test_check_missing_and_unparsable_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    broken = tmp_path / "broken.json"
    broken.write_text('{"family": "demo",\n  "config_version": }\n')
    unknown = tmp_path / "network.txt"
    unknown.write_text("family: demo\n")

    result = run("config", "check", missing, broken, unknown, CONF / "network.json")

    assert result.exit_code == 1
    errors = result.stderr.splitlines()
    assert len(errors) == 3
    assert errors[0].startswith(f"{missing}: cannot read")
    assert errors[1].startswith(f"{broken}:2: invalid JSON")
    assert errors[2].startswith(f"{unknown}: cannot tell the format")
    assert result.stdout.startswith(f"{CONF / 'network.json'}: ok (network demo v1")


def test_check_reports_a_directory_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "sub.yaml").mkdir()
    result = run("config", "check", tmp_path / "sub.yaml", CONF / "network.yaml")
    assert result.exit_code == 1
    assert result.stderr == f"{tmp_path / 'sub.yaml'}: cannot read: Is a directory\n"
    assert result.stdout.startswith(f"{CONF / 'network.yaml'}: ok")


def test_check_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((CONF / "network.yaml").read_text().replace("liveness: 3", "liveness: 0"))

    result, obj = run_json("config", "check", CONF / "network.zfl", bad)

    assert result.exit_code == 1
    assert obj["errors"] == [
        {
            "file": str(bad),
            "line": line_of(bad, "liveness:"),
            "path": "liveness",
            "message": "must be greater than 0, got 0",
        }
    ]
    good, failed = obj["files"]
    assert good == {
        "file": str(CONF / "network.zfl"),
        "ok": True,
        "kind": "network",
        "family": "demo",
        "config_version": 1,
        "sha256": config_sha256(load(CONF / "network.zfl")),
    }
    assert failed["ok"] is False
    assert failed["errors"] == obj["errors"]


def test_json_flag_is_accepted_after_the_subcommand() -> None:
    before = run("--json", "config", "check", CONF / "broker.xml")
    after = run("config", "check", "--json", CONF / "broker.xml")
    middle = run("config", "--json", "check", CONF / "broker.xml")
    assert before.exit_code == after.exit_code == middle.exit_code == 0
    assert json.loads(before.stdout) == json.loads(after.stdout) == json.loads(middle.stdout)


def test_check_without_files_is_a_usage_error() -> None:
    result = run("config", "check")
    assert result.exit_code == 2
    assert "Missing argument" in result.stderr


# ---------------------------------------------------------------------------------------------
# config convert and config hash


def hash_of(path: Path) -> str:
    result = run("config", "hash", path)
    assert result.exit_code == 0, result.output
    sha256, name = result.stdout.rstrip("\n").split("  ")
    assert name == str(path)
    return sha256


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("source", CONF_FILES, ids=lambda p: p.name)
def test_convert_keeps_the_hash(tmp_path: Path, source: Path, fmt: str) -> None:
    out = tmp_path / f"converted.{fmt}"

    result = run("config", "convert", source, "--to", fmt, "-o", out)

    assert result.exit_code == 0, result.output
    assert hash_of(out) == hash_of(source)
    assert run("config", "check", out).exit_code == 0
    # stdout gets the same bytes as the file
    to_stdout = run("config", "convert", source, "--to", fmt)
    assert to_stdout.exit_code == 0
    assert to_stdout.stdout_bytes == out.read_bytes()


def test_all_network_formats_hash_the_same(tmp_path: Path) -> None:
    result = run("config", "hash", *NETWORK_FILES)
    assert result.exit_code == 0, result.output
    rows = [line.split("  ") for line in result.stdout.splitlines()]
    assert [name for _, name in rows] == [str(p) for p in NETWORK_FILES]
    assert len(NETWORK_FILES) == 4
    assert len({sha256 for sha256, _ in rows}) == 1
    assert rows[0][0] == config_sha256(load(CONF / "network.yaml"))

    # and a chain of conversions through every format lands on the same hash
    current = CONF / "network.zfl"
    for fmt in ("json", "xml", "yaml", "zfl"):
        nxt = tmp_path / f"chain.{fmt}"
        assert run("config", "convert", current, "-o", nxt).exit_code == 0
        current = nxt
    assert hash_of(current) == rows[0][0]


def test_hash_json_and_failure(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    result, obj = run_json("config", "hash", CONF / "network.xml", CONF / "broker.json", bad)
    assert result.exit_code == 1
    assert obj["files"] == [
        {
            "file": str(CONF / "network.xml"),
            "kind": "network",
            "family": "demo",
            "config_version": 1,
            "sha256": config_sha256(load(CONF / "network.xml")),
        },
        {
            "file": str(CONF / "broker.json"),
            "kind": "broker",
            "identity": "solo",
            "sha256": config_sha256(load(CONF / "broker.json")),
        },
    ]
    assert obj["errors"]
    assert all(e["file"] == str(bad) for e in obj["errors"])
    assert set(obj["errors"][0]) == {"file", "line", "path", "message"}


def test_convert_refuses_to_overwrite_its_input(tmp_path: Path, network_yaml: Path) -> None:
    before = network_yaml.read_bytes()
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.yaml"
    link.symlink_to(network_yaml)
    hard = tmp_path / "hard.yaml"
    os.link(network_yaml, hard)
    for out in (network_yaml, tmp_path / "sub" / ".." / "network.yaml", link, hard):
        result = run("config", "convert", network_yaml, "--to", "yaml", "-o", out)
        assert result.exit_code == 1, out
        assert result.stderr == f"{out}: refusing to overwrite the input file; choose another -o\n"
        assert network_yaml.read_bytes() == before
    assert link.is_symlink()


def test_convert_format_from_output_extension_and_usage_errors(tmp_path: Path) -> None:
    out = tmp_path / "n.xml"
    assert run("config", "convert", CONF / "network.yaml", "-o", out).exit_code == 0
    assert out.read_text().startswith("<?xml")

    no_format = run("config", "convert", CONF / "network.yaml")
    assert no_format.exit_code == 2
    assert "--to" in no_format.stderr
    mismatch = run("config", "convert", CONF / "network.yaml", "--to", "json", "-o", out)
    assert mismatch.exit_code == 2
    bad_choice = run("config", "convert", CONF / "network.yaml", "--to", "toml")
    assert bad_choice.exit_code == 2


def test_convert_to_an_unwritable_place_names_the_output(tmp_path: Path) -> None:
    out = tmp_path / "no" / "such" / "dir.json"
    result = run("config", "convert", CONF / "network.yaml", "-o", out)
    assert result.exit_code == 1
    assert result.stderr == f"{out}: cannot write: No such file or directory\n"
    assert list(tmp_path.iterdir()) == []


def test_convert_bad_input_and_json(tmp_path: Path) -> None:
    result, obj = run_json("config", "convert", tmp_path / "missing.yaml", "--to", "json")
    assert result.exit_code == 1
    assert obj["errors"][0]["file"] == str(tmp_path / "missing.yaml")

    result, obj = run_json("config", "convert", CONF / "network.xml", "--to", "yaml")
    assert result.exit_code == 0
    assert obj["format"] == "yaml"
    assert obj["output"] is None
    assert obj["sha256"] == config_sha256(load(CONF / "network.xml"))
    (tmp_path / "from_json.yaml").write_text(obj["content"])
    assert hash_of(tmp_path / "from_json.yaml") == obj["sha256"]


# ---------------------------------------------------------------------------------------------
# config sign and config verify


def test_sign_and_verify_round_trip(
    tmp_path: Path, network_yaml: Path, keypair: tuple[Path, Path]
) -> None:
    private, public = keypair
    result = run("config", "sign", network_yaml, "--key", private)
    assert result.exit_code == 0, result.output
    sig_path = tmp_path / "network.yaml.sig"
    sig = json.loads(sig_path.read_text())
    config = load(network_yaml)
    assert sig["family"] == "demo"
    assert sig["config_version"] == 1
    assert sig["sha256"] == config_sha256(config)
    assert sig["key_id"] == key_id(load_public_key(public))
    assert set(sig) == {
        "family",
        "config_version",
        "sha256",
        "signature",
        "key_id",
        "view_signature",
    }

    result = run("config", "verify", network_yaml, "--trusted", public)
    assert result.exit_code == 0, result.output
    assert f"signature ok (network demo v1, sha256 {sig['sha256']}, key {sig['key_id']})" in (
        result.stdout
    )

    # the signature covers the canonical form, so it holds for the config in any format
    for other in NETWORK_FILES:
        result = run("config", "verify", other, "--sig", sig_path, "--trusted", public)
        assert result.exit_code == 0, result.output


def test_sign_to_explicit_output_and_json(
    tmp_path: Path, network_yaml: Path, keypair: tuple[Path, Path]
) -> None:
    private, public = keypair
    other_private, other_public = (
        tmp_path / "other" / "signing.key",
        tmp_path / "other" / "signing.pub",
    )
    assert run("keys", "generate", tmp_path / "other").exit_code == 0
    sig_path = tmp_path / "custom.sig"
    result, obj = run_json("config", "sign", network_yaml, "--key", private, "-o", sig_path)
    assert result.exit_code == 0
    assert obj["signature_file"] == str(sig_path)
    assert obj["key_id"] == key_id(load_public_key(public))
    assert not (tmp_path / "network.yaml.sig").exists()

    # several trusted keys: any one of them may have made the signature
    result, obj = run_json(
        "config",
        "verify",
        network_yaml,
        "--sig",
        sig_path,
        "--trusted",
        other_public,
        "--trusted",
        public,
    )
    assert result.exit_code == 0
    assert obj["key_id"] == key_id(load_public_key(public))
    assert other_private.exists()


def test_signature_module_round_trip(keypair: tuple[Path, Path]) -> None:
    # the click-free API the broker will reuse
    private, public = keypair
    config = load(CONF / "network.json", kind="network")
    sig = signature_for(config, load_private_key(private))
    assert parse_signature(sig.to_json()) == sig
    assert verify_signature(config, sig, [load_public_key(public)]) == sig.key_id
    with pytest.raises(SignatureError, match="no trusted key"):
        verify_signature(config, sig, [])
    with pytest.raises(SignatureFileError, match=r"^here: missing key_id$") as info:
        parse_signature(
            b'{"family": "d", "config_version": 1, "sha256": "", "signature": ""}', source="here"
        )
    assert info.value.source == "here"
    assert info.value.reason == "missing key_id"


def test_a_signature_file_signs_the_client_view_too(keypair: tuple[Path, Path]) -> None:
    """``view_signature`` (docs/protocol.md §6.2) verifies over the view; a file without it (made
    before views were signed) still verifies the config; one whose view_signature is another
    version's or another key's is refused, naming it."""
    private, public = keypair
    trusted = [load_public_key(public)]
    config = load(CONF / "network.json", kind="network")
    sig = signature_for(config, load_private_key(private))
    view = client_view_sha256(config)
    assert sig.view_signature is not None
    assert (
        verify_view(
            sig.view_signature, config.family, config.config_version, sig.sha256, view, trusted
        )
        == sig.key_id
    )
    old = dataclasses.replace(sig, view_signature=None)
    assert b"view_signature" not in old.to_json()
    assert parse_signature(old.to_json()) == old
    assert verify_signature(config, old, trusted) == sig.key_id
    bumped = dataclasses.replace(config, config_version=config.config_version + 1)
    stale = signature_for(bumped, load_private_key(private)).view_signature
    with pytest.raises(SignatureError, match=r"^view_signature: no trusted key verifies"):
        verify_signature(config, dataclasses.replace(sig, view_signature=stale), trusted)
    with pytest.raises(SignatureFileError, match="view_signature must be"):
        parse_signature(json.dumps({**json.loads(sig.to_json()), "view_signature": 1}).encode())


def verify_fails(network_yaml: Path, public: Path, *extra: str | Path) -> str:
    result = run("config", "verify", network_yaml, "--trusted", public, *extra)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    return result.stderr


@pytest.fixture
def signed(network_yaml: Path, keypair: tuple[Path, Path]) -> tuple[Path, Path, Path]:
    assert run("config", "sign", network_yaml, "--key", keypair[0]).exit_code == 0
    return network_yaml, keypair[1], network_yaml.with_name("network.yaml.sig")


def test_verify_fails_after_a_version_bump(signed: tuple[Path, Path, Path]) -> None:
    config, public, sig = signed
    config.write_text(config.read_text().replace("config_version: 1", "config_version: 2"))
    error = verify_fails(config, public)
    assert error.startswith(f"{sig}: the signature is for config_version 1, the config has ")
    assert "config_version 2" in error


def test_verify_fails_after_an_edit_that_keeps_the_version(
    signed: tuple[Path, Path, Path],
) -> None:
    config, public, sig = signed
    config.write_text(config.read_text().replace("\nliveness: 3\n", "\nliveness: 4\n"))
    error = verify_fails(config, public)
    assert error.startswith(f"{sig}: the signature is for sha256 ")
    assert "the config changed since it was signed" in error


def test_verify_fails_with_another_trusted_key(
    tmp_path: Path, signed: tuple[Path, Path, Path]
) -> None:
    config, _public, sig = signed
    assert run("keys", "generate", tmp_path / "other").exit_code == 0
    error = verify_fails(config, tmp_path / "other" / "signing.pub")
    assert error == f"{sig}: no trusted key verifies the signature (tried 1 key)\n"


def test_verify_fails_with_a_tampered_signature(signed: tuple[Path, Path, Path]) -> None:
    config, public, sig_path = signed
    original = json.loads(sig_path.read_text())

    def tamper(**changes: Any) -> str:
        sig_path.write_text(json.dumps({**original, **changes}))
        return verify_fails(config, public)

    # another valid-looking signature (first digit changed, still lowercase hex)
    first = "b" if original["signature"][0] != "b" else "c"
    assert "no trusted key verifies" in tamper(signature=first + original["signature"][1:])
    assert "not 128 lowercase hex digits" in tamper(signature="not hex!")
    assert "altered" in tamper(key_id="0123456789abcdef")
    assert "the signature is for sha256" in tamper(sha256="0" * 64)
    assert "family 'other'" in tamper(family="other")
    assert "config_version must be" in tamper(config_version="1")
    assert "view_signature: no trusted key verifies" in tamper(view_signature=original["signature"])

    sig_path.write_text(json.dumps({**original, "extra": 1}))
    assert "unknown key(s) extra" in verify_fails(config, public)
    sig_path.write_text("{not json")
    assert verify_fails(config, public).startswith(f"{sig_path}: not valid JSON")
    sig_path.unlink()
    assert verify_fails(config, public).startswith(f"{sig_path}: cannot read")


def test_verify_failure_json(signed: tuple[Path, Path, Path]) -> None:
    config, public, sig = signed
    config.write_text(config.read_text().replace("config_version: 1", "config_version: 7"))
    result, obj = run_json("config", "verify", config, "--trusted", public)
    assert result.exit_code == 1
    (error,) = obj["errors"]
    assert error["file"] == str(sig)
    assert error["line"] is None
    assert "config_version 7" in error["message"]


def test_verify_needs_a_trusted_key(signed: tuple[Path, Path, Path]) -> None:
    config, _public, _sig = signed
    result = run("config", "verify", config)
    assert result.exit_code == 2
    assert "--trusted" in result.stderr


def test_sign_refusals(tmp_path: Path, network_yaml: Path, keypair: tuple[Path, Path]) -> None:
    private, public = keypair
    # a broker's own file is not signed
    result = run("config", "sign", CONF / "broker.yaml", "--key", private, "-o", tmp_path / "b")
    assert result.exit_code == 1
    assert result.stderr == (
        f"{CONF / 'broker.yaml'}: this is a broker config; only network configs are signed\n"
    )
    # the signature never replaces the config or the key
    for target in (network_yaml, private):
        before = target.read_bytes()
        result = run("config", "sign", network_yaml, "--key", private, "-o", target)
        assert result.exit_code == 1
        assert "refusing to overwrite" in result.stderr
        assert target.read_bytes() == before
    # the public key is not a signing key
    result = run("config", "sign", network_yaml, "--key", public)
    assert result.exit_code == 1
    assert result.stderr.startswith("scale0ctl: private key file")
    # a private key others can read is refused
    private.chmod(0o644)
    result = run("config", "sign", network_yaml, "--key", private)
    assert result.exit_code == 1
    assert "chmod 600" in result.stderr
    # an invalid config is reported like `config check` does
    network_yaml.write_text(network_yaml.read_text().replace("liveness: 3", "liveness: 0"))
    private.chmod(0o600)
    result = run("config", "sign", network_yaml, "--key", private)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"{network_yaml}:{line_of(network_yaml, 'liveness:')}: ")
    assert not (tmp_path / "network.yaml.sig").exists()


# ---------------------------------------------------------------------------------------------
# keys generate


def test_keys_generate(tmp_path: Path) -> None:
    directory = tmp_path / "var" / "keys"
    result = run("keys", "generate", directory, "--name", "family-a")
    assert result.exit_code == 0, result.output
    private, public = directory / "family-a.key", directory / "family-a.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    kid = key_id(load_public_key(public))
    assert str(private) in result.stdout
    assert str(public) in result.stdout
    assert kid in result.stdout

    # no overwrite without --force, and nothing changes
    before = private.read_bytes(), public.read_bytes()
    again = run("keys", "generate", directory, "--name", "family-a")
    assert again.exit_code == 1
    assert again.stderr == (
        f"{private}: already exists; refusing to overwrite it "
        "(use --force to replace the key pair)\n"
    )
    assert (private.read_bytes(), public.read_bytes()) == before

    forced, obj = run_json("keys", "generate", directory, "--name", "family-a", "--force")
    assert forced.exit_code == 0
    assert private.read_bytes() != before[0]
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert obj["private_key"] == str(private)
    assert obj["public_key"] == str(public)
    assert obj["key_id"] == key_id(load_public_key(public)) != kid
    assert obj["public_key_text"] == public.read_text().strip()


def test_keys_generate_curve(tmp_path: Path) -> None:
    from scale0.crypto.curve import load_curve_public_key, load_curve_secret_key

    directory = tmp_path / "keys"
    result, obj = run_json("keys", "generate", directory, "--type", "curve", "--name", "b1")
    assert result.exit_code == 0, result.output
    secret, public = directory / "b1.curve.key", directory / "b1.curve.pub"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert obj == {
        "ok": True,
        "secret_key": str(secret),
        "public_key": str(public),
        "curve_public_key": load_curve_public_key(public),
    }
    pair = load_curve_secret_key(secret)
    assert pair.public == obj["curve_public_key"]
    again = run("keys", "generate", directory, "--type", "curve", "--name", "b1")
    assert again.exit_code == 1
    assert again.stderr == (
        f"{secret}: already exists; refusing to overwrite it "
        "(use --force to replace the key pair)\n"
    )
    assert load_curve_secret_key(secret) == pair
    forced = run("keys", "generate", directory, "--type", "curve", "--name", "b1", "--force")
    assert forced.exit_code == 0
    assert load_curve_secret_key(secret) != pair


def test_keys_generate_bad_name_leaves_nothing(tmp_path: Path) -> None:
    result = run("keys", "generate", tmp_path / "new" / "dir", "--name", "../evil")
    assert result.exit_code == 1
    assert "invalid key name" in result.stderr
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# passwd


def test_passwd_stdin() -> None:
    result = run("passwd", "--stdin", stdin=" s3cret pass \n")
    assert result.exit_code == 0, result.output
    stored = result.stdout.strip()
    assert result.stdout == stored + "\n"
    assert verify_password(" s3cret pass ", stored)
    assert not verify_password(" s3cret pass", stored)


def test_passwd_stdin_json_and_without_newline() -> None:
    result, obj = run_json("passwd", "--stdin", stdin="hunter2")
    assert result.exit_code == 0
    assert verify_password("hunter2", obj["password_hash"])


@pytest.mark.parametrize("stdin", ["", "\n"])
def test_passwd_refuses_an_empty_password(stdin: str) -> None:
    result = run("passwd", "--stdin", stdin=stdin)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == "scale0ctl: refusing an empty password\n"
    result, obj = run_json("passwd", "--stdin", stdin=stdin)
    assert obj["errors"][0]["message"] == "refusing an empty password"


def test_passwd_prompts_twice_without_echo() -> None:
    result = run("passwd", stdin="first\nother\ncorrect horse\ncorrect horse\n")
    assert result.exit_code == 0, result.output
    assert "do not match" in result.stderr
    assert "correct horse" not in result.stderr
    (stored,) = result.stdout.splitlines()
    assert verify_password("correct horse", stored)


# ---------------------------------------------------------------------------------------------
# the installed console script


@pytest.mark.system
def test_installed_console_script(tmp_path: Path, network_yaml: Path) -> None:
    exe = shutil.which("scale0ctl")
    assert exe is not None, "scale0ctl is not installed (pip install -e .)"
    env = {**os.environ, "PYTHONWARNINGS": "error"}

    def ctl(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, *map(str, args)],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=env,
        )

    checked = ctl("config", "check", *CONF_FILES)
    assert checked.returncode == 0, checked.stderr
    assert len(checked.stdout.splitlines()) == len(CONF_FILES)

    assert ctl("keys", "generate", tmp_path / "keys").returncode == 0
    assert (
        ctl("config", "sign", network_yaml, "--key", tmp_path / "keys/signing.key").returncode == 0
    )
    verified = ctl(
        "--json", "config", "verify", network_yaml, "--trusted", tmp_path / "keys/signing.pub"
    )
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["ok"] is True

    network_yaml.write_text(
        network_yaml.read_text().replace("config_version: 1", "config_version: 2")
    )
    refused = ctl("config", "verify", network_yaml, "--trusted", tmp_path / "keys/signing.pub")
    assert refused.returncode == 1
    assert "config_version 2" in refused.stderr

    hashed = ctl("passwd", "--stdin", stdin="scale0-demo\n")
    assert hashed.returncode == 0, hashed.stderr
    assert verify_password("scale0-demo", hashed.stdout.strip())

    usage = ctl("config", "frobnicate")
    assert usage.returncode == 2


def test_verify_says_when_the_client_view_is_not_signed(signed: tuple[Path, Path, Path]) -> None:
    """A signature file made before views were signed verifies, and says that clients which
    check signatures will refuse the config (docs/operations.md, "What a client needs")."""
    config, public, sig_path = signed
    result, obj = run_json("config", "verify", config, "--trusted", public)
    assert result.exit_code == 0 and obj["view_signed"] is True
    original = json.loads(sig_path.read_text())
    del original["view_signature"]
    sig_path.write_text(json.dumps(original))
    result = run("config", "verify", config, "--trusted", public)
    assert result.exit_code == 0, result.output
    assert "no view_signature (clients that verify refuse it): sign it again" in result.stdout
    result, obj = run_json("config", "verify", config, "--trusted", public)
    assert result.exit_code == 0 and obj["view_signed"] is False
