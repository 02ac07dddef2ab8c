"""docs/config.md documents every field, exactly as the schema says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from scale0.config.model import (
    Admin,
    BrokerConfig,
    BrokerEntry,
    ManagementSettings,
    NetworkConfig,
    PeerLink,
)
from scale0.config.reference import markdown_reference
from scale0.config.schema import field_doc

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_every_field_has_a_one_line_doc() -> None:
    for cls in (BrokerConfig, ManagementSettings, NetworkConfig, BrokerEntry, PeerLink, Admin):
        for f in dataclasses.fields(cls):
            text = field_doc(f)
            assert text and "\n" not in text, f"{cls.__name__}.{f.name} has no one-line doc"


def test_config_md_reference_is_current() -> None:
    assert markdown_reference() in DOC.read_text(), (
        "docs/config.md is stale: regenerate its reference with `python -m scale0.config.reference`"
    )


def test_every_field_is_named_in_config_md() -> None:
    text = DOC.read_text()
    for cls in (BrokerConfig, NetworkConfig):
        for f in dataclasses.fields(cls):
            assert f"`{f.name}`" in text
