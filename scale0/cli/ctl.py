"""scale0ctl, the admin command line: config files, keys, passwd, and running brokers.

This module owns the commands, their options and exit codes; the work itself is done by
scale0.config (loading, canonical hash, signature files) and scale0.crypto (keys, password
hashes), and the printing by scale0.cli.output. Exit codes: 0 success, 1 bad input (config
problems, bad signature, unusable key or file), 2 usage error (click's own). ``--json`` (before
or after the subcommand) prints one JSON object on stdout instead, even on failure.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec

import click

from scale0.cli.admin import add_admin_commands
from scale0.cli.output import Output, problem_dict
from scale0.cli.tasks import add_task_commands
from scale0.config.canonical import config_sha256
from scale0.config.errors import ConfigError, Problem
from scale0.config.formats import EXTENSIONS, FORMATS, Format
from scale0.config.loader import dumps, kind_of, load, loads, write_atomic
from scale0.config.model import Config, NetworkConfig
from scale0.config.signature import (
    SignatureFileError,
    default_signature_path,
    read_signature,
    signature_for,
    verify_signature,
)
from scale0.crypto.curve import generate_curve_keypair
from scale0.crypto.keys import (
    CryptoError,
    SignatureError,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    public_key_text,
)
from scale0.crypto.passwords import hash_password

__all__ = ["main"]

P = ParamSpec("P")

_JSON_META = "scale0ctl.json"
MAX_PASSWORD_BYTES = 4096
"""Longest password ``passwd --stdin`` accepts (a line longer than this is refused, not cut)."""


# ---------------------------------------------------------------------------------------------
# plumbing: --json anywhere, and turning errors into reports and exit code 1


class Failed(Exception):
    """A command could not do its job; ``problems`` say why (reported, then exit 1)."""

    def __init__(self, *problems: Problem) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems: tuple[Problem, ...] = problems


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # ctx.meta is shared by the whole context chain, so `--json` counts wherever it was given.
    if value:
        ctx.meta[_JSON_META] = True
    return value


_json_option = click.option(
    "--json",
    "json_mode",
    is_flag=True,
    expose_value=False,
    callback=_set_json,
    help="Print one JSON object on stdout (also on failure) instead of text.",
)


def _json_param() -> click.Option:
    """The same ``--json`` as an option object, for commands built without decorators."""
    return click.Option(
        ["--json", "json_mode"],
        is_flag=True,
        expose_value=False,
        callback=_set_json,
        help="Print one JSON object on stdout (also on failure) instead of text.",
    )


def _output() -> Output:
    return Output(json=bool(click.get_current_context().meta.get(_JSON_META, False)))


def _problems_of(exc: Exception) -> tuple[Problem, ...]:
    if isinstance(exc, Failed):
        return exc.problems
    if isinstance(exc, ConfigError):
        return exc.problems
    if isinstance(exc, SignatureFileError):
        return (Problem(exc.reason, file=exc.source),)
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        file = os.fsdecode(exc.filename) if exc.filename is not None else None
        return (Problem(reason, file=file),)
    return (Problem(str(exc)),)


def _reported(
    func: Callable[Concatenate[Output, P], None],
) -> Callable[P, None]:
    """Run a command with its Output; report Failed/ConfigError/CryptoError/OSError, exit 1."""

    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        out = _output()
        try:
            func(out, *args, **kwargs)
        except (Failed, ConfigError, CryptoError, OSError) as exc:
            out.fail(_problems_of(exc))
            click.get_current_context().exit(1)

    return run


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (same path after symlinks, or hard links of one inode)."""
    with contextlib.suppress(OSError):
        if os.path.samefile(a, b):
            return True
    return Path(a).resolve() == Path(b).resolve()


def _write(path: str | os.PathLike[str], data: bytes) -> None:
    """write_atomic, with a failure reported against ``path`` rather than its temp file."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise Failed(Problem(f"cannot write: {reason}", file=os.fspath(path))) from None


def _identity(config: Config) -> dict[str, Any]:
    """What names a config in JSON output: kind, family/config_version or identity, sha256."""
    if isinstance(config, NetworkConfig):
        names: dict[str, Any] = {
            "kind": "network",
            "family": config.family,
            "config_version": config.config_version,
        }
    else:
        names = {"kind": "broker", "identity": config.identity}
    names["sha256"] = config_sha256(config)
    return names


def _describe(config: Config) -> str:
    """What names a config in text output: ``network demo v1`` or ``broker solo``."""
    if isinstance(config, NetworkConfig):
        return f"network {config.family} v{config.config_version}"
    return f"broker {config.identity}"


def _load_network(path: str) -> NetworkConfig:
    config = load(path)
    if not isinstance(config, NetworkConfig):
        raise Failed(
            Problem(
                f"this is a {kind_of(config)} config; only network configs are signed",
                file=path,
            )
        )
    return config


# ---------------------------------------------------------------------------------------------
# scale0ctl


@click.group(name="scale0ctl", context_settings={"help_option_names": ["-h", "--help"]})
@_json_option
@click.version_option(package_name="scale0", prog_name="scale0ctl")
def main() -> None:
    """Administer Scale0: check, convert, hash and sign configs; make keys and password hashes.

    Exit status: 0 on success; 1 when the input is bad (config problems, a signature that does
    not verify, an unusable key) or a broker refused or answered an error; 2 on a usage error;
    3 when, with --family, some broker did not answer; 4 when the broker did not answer within
    --timeout (docs/admin.md).
    """


@main.group(short_help="Check, convert, hash, sign and verify configs.")
@_json_option
def config() -> None:
    """Check, convert, hash, sign and verify config files (YAML, JSON, XML or ZFL)."""


def _load_config(name: str) -> Config:
    """Load a config file; a signature file given by mistake (a glob like conf/*) says so."""
    if name.endswith(".sig"):
        raise ConfigError(
            [
                Problem(
                    "a signature file, not a config (scale0ctl config sign writes it): "
                    f"check it with `scale0ctl config verify CONFIG --sig {name} --trusted PUB`",
                    file=name,
                )
            ]
        )
    return load(name)


@config.command("check", short_help="Validate config files.")
@_json_option
@click.argument("files", nargs=-1, required=True, type=click.Path())
@_reported
def check(out: Output, files: tuple[str, ...]) -> None:
    """Load and validate each FILE (network or broker config, told from the content).

    Every file is checked, even after one fails; each problem is printed as
    FILE:LINE: FIELD: MESSAGE on stderr. Exit 1 if any file has a problem.
    """
    results: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for name in files:
        try:
            loaded = _load_config(name)
        except ConfigError as exc:
            out.problems(exc.problems)
            problems.extend(exc.problems)
            results.append(
                {"file": name, "ok": False, "errors": [problem_dict(p) for p in exc.problems]}
            )
            continue
        names = _identity(loaded)
        out.line(f"{name}: ok ({_describe(loaded)}, sha256 {names['sha256']})")
        results.append({"file": name, "ok": True, **names})
    out.result({"files": results}, problems)
    if problems:
        click.get_current_context().exit(1)


@config.command("hash", short_help="Print the canonical sha256 of config files.")
@_json_option
@click.option(
    "--same",
    is_flag=True,
    help="Exit 1 unless every FILE has one sha256 (the same config in several formats).",
)
@click.argument("files", nargs=-1, required=True, type=click.Path())
@_reported
def hash_(out: Output, files: tuple[str, ...], same: bool) -> None:
    """Print the sha256 of each FILE's canonical form, like sha256sum: HASH, two spaces, FILE.

    The hash is the config's identity: the same config has the same hash in every format, and
    it is what a signature covers. A file that does not load is reported and skipped (exit 1).
    With --same, files whose hashes differ are a problem too (exit 1), each one named.
    """
    results: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for name in files:
        try:
            loaded = _load_config(name)
        except ConfigError as exc:
            out.problems(exc.problems)
            problems.extend(exc.problems)
            continue
        names = _identity(loaded)
        out.line(f"{names['sha256']}  {name}")
        results.append({"file": name, **names})
    if same and len({r["sha256"] for r in results}) > 1:
        first = results[0]
        for other in results[1:]:
            if other["sha256"] != first["sha256"]:
                problem = Problem(
                    f"sha256 {other['sha256'][:12]}... differs from {first['file']}'s "
                    f"{first['sha256'][:12]}...: not the same config",
                    file=other["file"],
                )
                out.problems([problem])
                problems.append(problem)
    out.result({"files": results}, problems)
    if problems:
        click.get_current_context().exit(1)


def _target_format(to: str | None, output: str | None) -> Format:
    """The format to convert to: --to, else the -o file's extension; a usage error if neither."""
    from_ext = EXTENSIONS.get(Path(output).suffix.lower()) if output else None
    if to is None:
        if from_ext is None:
            raise click.UsageError(
                "say which format to convert to with --to (or give -o a known extension)"
            )
        return from_ext
    fmt = next(f for f in FORMATS if f == to)
    if output is not None and from_ext is not None and from_ext != fmt:
        raise click.UsageError(
            f"--to {fmt} does not match the extension of {output} ({from_ext}); "
            "the file would not load back"
        )
    return fmt


@config.command("convert", short_help="Convert a config to another format.")
@_json_option
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--to", "to", type=click.Choice(FORMATS), help="Target format.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Write to this file (atomically) instead of stdout; never the input file.",
)
@_reported
def convert(out: Output, file: str, to: str | None, output: str | None) -> None:
    """Convert FILE to another format (yaml, json, xml, zfl); the sha256 stays the same.

    Without -o the result goes to stdout. --to may be left out when -o has a known extension.
    Comments and layout of the input are not kept. Relative paths in a broker file are kept
    as written and are relative to the file's directory, so keep the output beside the input.
    """
    fmt = _target_format(to, output)
    if output is not None and _same_file(file, output):
        raise Failed(
            Problem("refusing to overwrite the input file; choose another -o", file=output)
        )
    loaded = load(file)
    data = dumps(loaded, fmt)
    sha256 = config_sha256(loaded)
    # Guard against a lossy conversion: what we write must load back to the same config.
    try:
        again = loads(data, fmt, source=f"{file} as {fmt}")
    except ConfigError as exc:
        raise Failed(
            *(
                Problem(f"internal error, the {fmt} form does not load back: {p}")
                for p in exc.problems
            )
        ) from None
    if config_sha256(again) != sha256:
        raise Failed(Problem(f"internal error, the {fmt} form changes the config", file=file))
    payload: dict[str, Any] = {"file": file, "format": fmt, "output": output, **_identity(loaded)}
    if output is None:
        out.data(data)
        payload["content"] = data.decode("utf-8")
    else:
        _write(output, data)
        out.line(f"{output}: written ({_describe(loaded)}, {fmt}, sha256 {sha256})")
    out.result(payload)


@config.command("sign", short_help="Sign a network config.")
@_json_option
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--key",
    "key",
    required=True,
    type=click.Path(dir_okay=False),
    help="Private signing key (from `scale0ctl keys generate`).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Signature file to write (atomically); default FILE.sig.",
)
@_reported
def sign(out: Output, file: str, key: str, output: str | None) -> None:
    """Sign the network config FILE: write its signature file (default FILE.sig).

    The signature covers the family, config_version and canonical sha256, so it holds for
    the same config in any format; the file also holds the signature of the config's client
    view (view_signature), which clients that check signatures verify. Broker files are not
    signed.
    """
    target = Path(output) if output is not None else default_signature_path(file)
    for taken in (file, key):
        if _same_file(taken, target):
            raise Failed(
                Problem(
                    f"refusing to overwrite {taken} with the signature; choose another -o",
                    file=str(target),
                )
            )
    loaded = _load_network(file)
    private_key = load_private_key(key)
    sig = signature_for(loaded, private_key)
    _write(target, sig.to_json())
    out.line(
        f"{file}: signed ({_describe(loaded)}, sha256 {sig.sha256}) "
        f"with key {sig.key_id} -> {target}"
    )
    out.result(
        {"file": file, "signature_file": str(target), **_identity(loaded), "key_id": sig.key_id}
    )


@config.command("verify", short_help="Verify a network config's signature.")
@_json_option
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--trusted",
    "trusted",
    multiple=True,
    required=True,
    type=click.Path(dir_okay=False),
    help="Trusted public key file; repeat for several.",
)
@click.option(
    "--sig",
    "sig",
    type=click.Path(dir_okay=False),
    help="Signature file; default FILE.sig.",
)
@_reported
def verify(out: Output, file: str, trusted: Sequence[str], sig: str | None) -> None:
    """Verify that FILE, as it is now, carries a signature by one of the --trusted keys.

    Fails (exit 1, saying why) when the config changed since it was signed (other sha256 or
    config_version), when the signature file was altered, or when no trusted key made it. The
    client view's signature is checked too; a file without one (made before views were
    signed) verifies, with a note that clients which check signatures will refuse it.
    """
    target = Path(sig) if sig is not None else default_signature_path(file)
    loaded = _load_network(file)
    keys = [load_public_key(path) for path in trusted]
    signature = read_signature(target)
    try:
        verified_by = verify_signature(loaded, signature, keys)
    except SignatureError as exc:
        raise Failed(Problem(str(exc), file=str(target))) from None
    out.line(
        f"{file}: signature ok ({_describe(loaded)}, sha256 {signature.sha256}, key {verified_by})"
    )
    if signature.view_signature is None:
        # Still a valid config signature, but clients that verify (trusted_key) will refuse
        # this config: its client view is not signed (docs/protocol.md §6.2).
        out.line(f"{target}: no view_signature (clients that verify refuse it): sign it again")
    out.result(
        {
            "file": file,
            "signature_file": str(target),
            **_identity(loaded),
            "key_id": verified_by,
            "view_signed": signature.view_signature is not None,
        }
    )


# ---------------------------------------------------------------------------------------------
# keys


@main.group(short_help="Make config signing keys and CURVE key pairs.")
@_json_option
def keys() -> None:
    """Make config signing keys (Ed25519) and CURVE key pairs (transport)."""


@keys.command("generate", short_help="Make an Ed25519 signing or a CURVE key pair.")
@_json_option
@click.argument("directory", type=click.Path(file_okay=False))
@click.option(
    "--name",
    default=None,
    help="Key pair name (default: signing for ed25519, curve for curve).",
)
@click.option(
    "--type",
    "kind",
    type=click.Choice(["ed25519", "curve"]),
    default="ed25519",
    show_default=True,
    help="ed25519: NAME.key and NAME.pub (config signing); "
    "curve: NAME.curve.key and NAME.curve.pub (CURVE on the wire).",
)
@click.option("--force", is_flag=True, help="Replace an existing key pair of that name.")
@_reported
def generate(out: Output, directory: str, name: str | None, kind: str, force: bool) -> None:
    """Make a key pair in DIRECTORY; the private file is mode 0600.

    ed25519 (default): NAME.key (private) and NAME.pub. Give the .key to config sources
    (signing_key) and the .pub to every broker (trusted_keys).

    curve: NAME.curve.key (secret) and NAME.curve.pub. A broker names its .curve.key as
    curve_secret_key and its public key goes in its network-config entry (curve_public_key); a
    client or worker uses its own pair (docs/operations.md, "CURVE").

    DIRECTORY is created (mode 0700) if missing. An existing pair is never replaced without
    --force.
    """
    dir_path = Path(directory)
    name = name if name is not None else ("signing" if kind == "ed25519" else "curve")
    suffixes = (".key", ".pub") if kind == "ed25519" else (".curve.key", ".curve.pub")
    if not force:
        for existing in (dir_path / f"{name}{suffixes[0]}", dir_path / f"{name}{suffixes[1]}"):
            if existing.exists() or existing.is_symlink():
                raise Failed(
                    Problem(
                        "already exists; refusing to overwrite it (use --force to replace "
                        "the key pair)",
                        file=str(existing),
                    )
                )
    created = _make_dirs(dir_path)
    try:
        if kind == "curve":
            secret_path, public_path, pair = generate_curve_keypair(dir_path, name, overwrite=force)
        else:
            private_path, public_path = generate_keypair(dir_path, name, overwrite=force)
    except CryptoError:
        for made in reversed(created):
            with contextlib.suppress(OSError):
                made.rmdir()
        raise
    if kind == "curve":
        out.line(f"secret key:  {secret_path}  (mode 0600; keep it secret)")
        out.line(f"public key:  {public_path}")
        out.line(f"public key text (Z85): {pair.public}")
        out.result(
            {
                "secret_key": str(secret_path),
                "public_key": str(public_path),
                "curve_public_key": pair.public,
            }
        )
        return
    public_key = load_public_key(public_path)
    kid = key_id(public_key)
    out.line(f"private key: {private_path}  (mode 0600; keep it secret)")
    out.line(f"public key:  {public_path}")
    out.line(f"key id:      {kid}")
    out.result(
        {
            "private_key": str(private_path),
            "public_key": str(public_path),
            "key_id": kid,
            "public_key_text": public_key_text(public_key),
        }
    )


def _make_dirs(path: Path) -> list[Path]:
    """Create ``path`` and missing parents (mode 0700); return the ones created, outermost first."""
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    missing.reverse()
    for made in missing:
        made.mkdir(mode=0o700)
    return missing


# ---------------------------------------------------------------------------------------------
# passwd


@main.command("passwd", short_help="Hash an admin password (scrypt).")
@_json_option
@click.option(
    "--stdin",
    "from_stdin",
    is_flag=True,
    help="Read the password from one line of stdin (no prompt, no confirmation).",
)
@_reported
def passwd(out: Output, from_stdin: bool) -> None:
    """Print the scrypt hash of a password, for an admin's password_hash in the network config.

    Prompts twice without echo (prompts go to stderr, the hash to stdout). With --stdin, reads
    one line instead; only its line ending is removed. An empty password is refused.
    """
    if from_stdin:
        raw = sys.stdin.buffer.readline(MAX_PASSWORD_BYTES + 2)
        raw = raw.removesuffix(b"\n")
        if len(raw) > MAX_PASSWORD_BYTES:
            raise Failed(Problem(f"password is longer than {MAX_PASSWORD_BYTES} bytes"))
        try:
            password = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Failed(Problem("password is not valid UTF-8")) from None
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    if not password:
        raise Failed(Problem("refusing an empty password"))
    hashed = hash_password(password)
    out.line(hashed)
    out.result({"password_hash": hashed})


# ---------------------------------------------------------------------------------------------
# commands that talk to running brokers (scale0/cli/admin.py), and shell completion

add_admin_commands(main, config, _json_param, _output)
add_task_commands(main, _json_param, _output)


@main.command("completion", short_help="Print the shell completion script.")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the completion script for SHELL; e.g. in ~/.bashrc:

    eval "$(scale0ctl completion bash)"
    """
    from click.shell_completion import get_completion_class  # noqa: PLC0415 - only here

    cls = get_completion_class(shell)
    if cls is None:  # pragma: no cover - the Choice above lists only known shells
        raise click.UsageError(f"no completion for {shell}")
    click.echo(cls(main, {}, "scale0ctl", "_SCALE0CTL_COMPLETE").source())
