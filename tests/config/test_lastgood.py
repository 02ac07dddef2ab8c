"""The last good config on disk (scale0/config/lastgood.py) keeps the client view's signature."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scale0.config.errors import ConfigError
from scale0.config.lastgood import FILE_NAME, LastGood, read_last_good, write_last_good

DOCUMENT = b'{"config_version":1,"family":"f"}'


def test_the_view_signature_is_saved_and_read_back(tmp_path: Path) -> None:
    saved = LastGood(DOCUMENT, "a" * 64, "b" * 128, "b1", "c" * 128)
    write_last_good(tmp_path, saved)
    assert read_last_good(tmp_path) == saved
    assert (tmp_path / FILE_NAME).stat().st_mode & 0o777 == 0o600


def test_a_file_saved_before_views_were_signed_reads_without_one(tmp_path: Path) -> None:
    write_last_good(tmp_path, LastGood(DOCUMENT, "a" * 64, "b" * 128, "b1"))
    record = json.loads((tmp_path / FILE_NAME).read_text())
    assert "view_signature" not in record
    last = read_last_good(tmp_path)
    assert last is not None and last.view_signature is None


def test_a_view_signature_that_is_no_string_is_refused_naming_it(tmp_path: Path) -> None:
    write_last_good(tmp_path, LastGood(DOCUMENT, "a" * 64, "b" * 128, "b1", "c" * 128))
    path = tmp_path / FILE_NAME
    path.write_text(json.dumps({**json.loads(path.read_text()), "view_signature": 7}))
    with pytest.raises(ConfigError, match="view_signature must be a string"):
        read_last_good(tmp_path)
