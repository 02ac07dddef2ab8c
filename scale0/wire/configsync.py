"""Config distribution on PUB/SUB: the ``[CONFIG, opts, document]`` message (protocol.md §6).

The signature is made and checked by scale0.crypto.keys (``signed_bytes`` is the signing input
``family|config_version|sha256`` of §6.2); this module only carries and shape-checks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Self

from scale0.wire.errors import ProtocolError
from scale0.wire.frames import (
    ED25519_HEX,
    SHA256_HEX,
    ConfigType,
    check_frame_sizes,
    decode_options,
    encode_options,
    opt_enum,
    opt_family,
    opt_int,
    opt_match,
    opt_match_or_none,
    opt_name,
    show,
)

#: Frame 0 of every published config; also the SUB subscription prefix.
TOPIC: Final = b"CONFIG"


@dataclass(frozen=True, slots=True)
class PublishedConfig:
    """One published network config: who sent it, its version, digest, signature and document.

    Not a :class:`Message`: it has no delimiter, signature or command frame (§6.1).
    """

    family: str
    config_version: int
    config_type: ConfigType
    sha256: str
    origin: str
    signature: str
    document: bytes
    #: The client view's signature by the same key (§6.2); None from a source that makes none.
    view_signature: str | None = None

    def to_frames(self) -> list[bytes]:
        options = encode_options(
            {
                "family": self.family,
                "config_version": self.config_version,
                "config_type": self.config_type.value,
                "sha256": self.sha256,
                "origin": self.origin,
                "signature": self.signature,
                "view_signature": self.view_signature,
            }
        )
        return [TOPIC, options, self.document]

    @classmethod
    def from_frames(cls, frames: Sequence[bytes], *, max_frame_bytes: int) -> Self:
        """Parse a received publication; only ProtocolError escapes (code 400 or 501)."""
        check_frame_sizes(frames, max_frame_bytes)
        if not frames or frames[0] != TOPIC:
            topic = frames[0] if frames else b""
            raise ProtocolError.unknown(0, f"topic {show(topic)} is not {TOPIC!r}")
        if len(frames) != 3:
            missing = ("options", "document")[len(frames) - 1] if len(frames) < 3 else None
            if missing is not None:
                raise ProtocolError.malformed(len(frames), f"{missing} missing")
            raise ProtocolError.malformed(3, f"unexpected frame ({len(frames)} frames, 3 max)")
        opts = decode_options(frames[1], 1)
        return cls(
            opt_family(opts, "family", frame=1),
            opt_int(opts, "config_version", frame=1, minimum=1),
            opt_enum(opts, "config_type", ConfigType, frame=1),
            opt_match(opts, "sha256", SHA256_HEX, "64 lowercase hex digits", frame=1),
            opt_name(opts, "origin", frame=1),
            opt_match(opts, "signature", ED25519_HEX, "128 lowercase hex digits", frame=1),
            frames[2],
            opt_match_or_none(
                opts, "view_signature", ED25519_HEX, "128 lowercase hex digits", frame=1
            ),
        )


def decode_config_publication(frames: Sequence[bytes], *, max_frame_bytes: int) -> PublishedConfig:
    """Entry point for the config SUB socket (docs/protocol.md §6.1)."""
    return PublishedConfig.from_frames(frames, max_frame_bytes=max_frame_bytes)
