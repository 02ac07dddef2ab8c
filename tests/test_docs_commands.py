"""Every command block of README.md and docs/operations.md runs as written, on free ports.

A newcomer pastes these blocks in order; so does this test. Each document becomes one bash
script (``set -euo pipefail``): its ``sh`` blocks as they are, its ``python`` blocks through
``python - <<'EOF'``, in document order, so what one block starts (``&``) the next one uses.
The script runs in a sandbox: a copy of the files git tracks, with ``.venv`` linked to this
worktree's, and every port of the examples (55xx, 56xx, 848x-849x, in ``conf/``, ``tools/demo``
and the blocks) moved to a port free now, so it runs beside anything listening on the real ones.
A failing command fails the test with the script's output; every process the script started
is stopped at the end through its process group (the script's own PID), SIGTERM then SIGKILL.

Marking a block (an HTML comment on the line before its opening fence; invisible on GitHub):

- ``<!-- docs-test: skip (why) -->``: not run. For commands that cannot run here (``tools/test``
  runs this test itself), with the reason in the comment.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from scale0.testing import pick_free_ports

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/operations.md")
#: The ports the examples use: brokers 5555-5558 and 5601-5624, management 8480-8483.
PORT_RE = re.compile(r"(?<![0-9A-Za-z])(55[0-9]{2}|56[0-9]{2}|84[89][0-9])(?![0-9A-Za-z])")
#: Files of the sandbox whose ports are moved (as well as the blocks).
PORTED = ("conf", "tools/demo")
FENCE_RE = re.compile(r"^(\s*)```(\w*)\s*$")
MARK_RE = re.compile(r"<!--\s*docs-test:\s*(\w+)(.*?)-->")
RUN_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0
LANGUAGES = ("sh", "bash", "python")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its language, its text and its mark (if any)."""

    path: str
    line: int
    language: str
    text: str
    mark: str | None


def blocks(path: str, text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, with the docs-test mark on the line before each."""
    found: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE_RE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, language = opening.groups()
        previous = lines[index - 1] if index > 0 else ""
        mark = MARK_RE.search(previous)
        body: list[str] = []
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path}:{index + 1}: a ``` fence that is never closed")
        found.append(
            Block(path, index + 1, language, "\n".join(body), mark.group(1) if mark else None)
        )
        index = end + 1
    return found


def script(chosen: list[Block]) -> str:
    """One bash script running the blocks in order; each says where it comes from."""
    parts = ["set -euo pipefail"]
    for block in chosen:
        parts.append(f"echo '>>> {block.path}:{block.line}'")
        if block.language == "python":
            parts.append(f"python - <<'DOCS_TEST_EOF'\n{block.text}\nDOCS_TEST_EOF")
        else:
            parts.append(block.text)
    parts.append("echo '>>> done'")
    return "\n".join(parts) + "\n"


def runnable(path: str) -> list[Block]:
    """The blocks of one document that run: sh/bash/python, not marked skip."""
    chosen = []
    for block in blocks(path, (REPO / path).read_text()):
        if block.mark not in (None, "skip"):
            raise AssertionError(f"{path}:{block.line}: unknown docs-test mark {block.mark!r}")
        if block.language in LANGUAGES and block.mark != "skip":
            chosen.append(block)
    return chosen


def port_map(texts: list[str]) -> dict[str, str]:
    ports = sorted({m.group(1) for text in texts for m in PORT_RE.finditer(text)})
    return dict(zip(ports, (str(p) for p in pick_free_ports(len(ports))), strict=True))


def moved(text: str, ports: dict[str, str]) -> str:
    return PORT_RE.sub(lambda m: ports.get(m.group(1), m.group(1)), text)


_NOT_SOURCE = {".git", ".venv", "var", "build", "dist", "test-artifacts"}


def _source_files() -> list[str]:
    """The tree's files: what git tracks in a checkout; in a plain copy (tools/test-fallback
    runs the tests in one), every file outside the ignored build and cache directories."""
    if (REPO / ".git").exists():
        tracked = subprocess.run(
            ["git", "ls-files", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
        return list(filter(None, tracked.split("\0")))
    names: list[str] = []
    for path in sorted(REPO.rglob("*")):
        parts = path.relative_to(REPO).parts
        if path.is_file() and not any(
            part in _NOT_SOURCE
            or part.startswith(".")
            or part.endswith(".egg-info")
            or part == "__pycache__"
            for part in parts[:-1]
        ):
            names.append(path.relative_to(REPO).as_posix())
    return names


def sandbox(directory: Path) -> Path:
    """A copy of the tree's files, with the environment running these tests as its .venv."""
    root = directory / "repo"
    for name in _source_files():
        source = REPO / name
        if not source.is_file():
            continue  # deleted in the work tree, not yet committed
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    # The README's `. .venv/bin/activate` must reach the Scale0 under test: this interpreter's
    # environment (the checkout's .venv under tools/test; another venv under tools/test-fallback).
    (root / ".venv").symlink_to(Path(sys.prefix))
    return root


def ported_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for name in PORTED:
        path = root / name
        files.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
    return files


def run_script(root: Path, text: str) -> subprocess.CompletedProcess[str]:
    """bash ``text`` in ``root``, in its own process group, stopped by PID however it ends."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SCALE0_") and key != "VIRTUAL_ENV"
    }
    # SCALE0_VENV_READY: the copy's tools/_venv.sh must not reinstall the environment under
    # test from the copy (it would then import Scale0 from a directory deleted after the test).
    env.update(
        HOME=str(root.parent / "home"), SCALE0_VENV=str(REPO / ".venv"), SCALE0_VENV_READY="1"
    )
    (root.parent / "home").mkdir(exist_ok=True)
    log = root.parent / "output.log"
    # A file, not a pipe: what the blocks leave running in the background would hold a pipe open.
    with log.open("wb") as output:
        process = subprocess.Popen(
            ["bash", "-c", text],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    returncode: int | None = None
    try:
        returncode = process.wait(RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop_group(process)
    printed = log.read_text(errors="replace")
    if returncode is None:
        printed += f"\n(timed out after {RUN_TIMEOUT_S:g} s)"
    return subprocess.CompletedProcess(
        process.args, -1 if returncode is None else returncode, printed, ""
    )


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the script's process group (what its blocks left running), then SIGKILL what is
    still there after a bound. The group's id is the script's own PID (start_new_session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_TIMEOUT_S)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return  # every member of the group has exited
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_document(path: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    chosen = runnable(path)
    assert chosen, f"{path} has no command block"
    root = sandbox(tmp_path)
    files = ported_files(root)
    ports = port_map([b.text for b in chosen] + [f.read_text() for f in files])
    for file in files:
        file.write_text(moved(file.read_text(), ports))
    return run_script(
        root, script([Block(**{**vars(b), "text": moved(b.text, ports)}) for b in chosen])
    )


@pytest.mark.system
@pytest.mark.parametrize("path", DOCS)
def test_every_command_block_runs(path: str, tmp_path: Path) -> None:
    done = run_document(path, tmp_path)
    assert done.returncode == 0 and "\n>>> done\n" in done.stdout, (
        f"{path}: a command block failed (exit {done.returncode}):\n{done.stdout[-6000:]}"
    )


def test_a_failing_block_fails_the_run(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    doc = "text\n\n```sh\necho one\nfalse\necho never\n```\n"
    chosen = blocks("x.md", doc)
    done = run_script(root, script(chosen))
    assert done.returncode != 0
    assert "one" in done.stdout and "never" not in done.stdout


def test_marks_and_languages_are_read() -> None:
    doc = (
        "<!-- docs-test: skip (runs forever) -->\n```sh\nsleep 1000\n```\n\n"
        "```python\nprint(1)\n```\n\n```yaml\na: 1\n```\n"
    )
    found = blocks("x.md", doc)
    assert [(b.language, b.mark) for b in found] == [
        ("sh", "skip"),
        ("python", None),
        ("yaml", None),
    ]
    assert "python - <<'DOCS_TEST_EOF'\nprint(1)\nDOCS_TEST_EOF" in script(found[1:2])


def test_ports_are_moved_everywhere_alike() -> None:
    ports = {"5555": "40001", "8480": "40002"}
    assert moved("tcp://127.0.0.1:5555 http://127.0.0.1:8480/ 15555 a5555", ports) == (
        "tcp://127.0.0.1:40001 http://127.0.0.1:40002/ 15555 a5555"
    )


def test_the_readme_test_command_is_skipped_with_a_reason() -> None:
    marked = [b for b in blocks("README.md", (REPO / "README.md").read_text()) if b.mark]
    assert [b.text.split()[0] for b in marked] == ["tools/test"]


def test_tools_test_says_in_one_line_what_the_browser_tests_need(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(REPO / "tools" / "_browser.sh"), "-q"],
        env={**os.environ, "SCALE0_CHROMIUM": str(tmp_path / "none"), "SCALE0_NO_INSTALL": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert "apt-get install chromium chromium-driver" in line and "--ignore=" in line
