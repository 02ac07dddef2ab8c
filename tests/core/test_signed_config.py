"""A signed CHECKCONFIG (docs/protocol.md §2.5): the whole signed config, over CURVE only, and a
client's ConfigTrust (scale0/session/trust.py, S1) verifies what the broker core answers."""

from __future__ import annotations

import dataclasses

import pytest

from scale0.config.canonical import canonical_json, config_sha256
from scale0.config.model import Admin
from scale0.core.effects import Authenticated, Channel, Received, Send
from scale0.crypto.passwords import hash_password
from scale0.session.trust import ConfigTrust
from scale0.sim.fabric import KEY, Fabric, family_config
from scale0.wire.client import CheckConfig, Config
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType

CLIENT_KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
ADMIN = Admin(auth_id="root", password_hash=hash_password("pw", n=2, r=1, p=1), role="admin")


def _answer(
    *, curve: bool, signed: bool, channel: Channel = Channel.FRONTEND, config_type: ConfigType
) -> tuple[Fabric, Config]:
    fabric = Fabric(dataclasses.replace(family_config(), admins=(ADMIN,)))
    fabric.start()
    fabric.advance(1.0)
    core = fabric.brokers["a"]
    core.core.curve = curve
    if curve:
        core.handle(Authenticated(channel, b"c1", CLIENT_KEY), fabric.now, fabric.wall)
    protocol = SIG_CLIENT if channel is Channel.FRONTEND else SIG_WORKER
    check = CheckConfig(config_type, None, None, signed, protocol=protocol)
    out = core.handle(Received(channel, b"c1", check), fabric.now, fabric.wall)
    (answer,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(answer, Config)
    return fabric, answer


@pytest.mark.parametrize("config_type", list(ConfigType))
@pytest.mark.parametrize("channel", [Channel.FRONTEND, Channel.BACKEND])
def test_a_signed_checkconfig_over_curve_gets_the_whole_signed_config(
    config_type: ConfigType, channel: Channel
) -> None:
    fabric, answer = _answer(curve=True, signed=True, channel=channel, config_type=config_type)
    network = fabric.brokers["a"].core.network
    assert answer.signature is not None and answer.sha256 == config_sha256(network)
    if config_type is ConfigType.JSON:
        assert answer.document == canonical_json(network)
    verified = ConfigTrust((KEY.public_key(),)).check(answer)
    assert verified.version == network.config_version
    assert "admins" not in verified.document  # S4: the client never keeps them


@pytest.mark.parametrize(("curve", "signed"), [(False, True), (True, False), (False, False)])
def test_otherwise_the_client_view_unsigned_without_admins(curve: bool, signed: bool) -> None:
    _fabric, answer = _answer(curve=curve, signed=signed, config_type=ConfigType.JSON)
    assert answer.signature is None
    assert b"admins" not in answer.document and b"password_hash" not in answer.document
