"""The client view's signature on a broker (docs/protocol.md §2.5, §3.2, §6.2, K6).

A ``signed`` CHECKCONFIG gets the client view, its sha256, the whole config's sha256 and the
view's signature, over CURVE or not; never the whole config (its admins' scrypt hashes are for
brokers only). A client's ConfigTrust (scale0/session/trust.py, S1) verifies what the core
answers. The view signature travels with the config: PUB, a peer's CONFIG, the saved config.
"""

from __future__ import annotations

import dataclasses

import pytest

from scale0.config.canonical import client_view_sha256, client_view_tree, config_sha256
from scale0.config.model import Admin
from scale0.core.effects import (
    Authenticated,
    Channel,
    ConfigOffered,
    Persist,
    Publish,
    Received,
    Send,
)
from scale0.crypto.passwords import hash_password
from scale0.session.trust import ConfigTrust, UntrustedConfig
from scale0.sim.fabric import KEY, OTHER_KEY, Fabric, family_config, offer_of, view_signed
from scale0.wire.client import CheckConfig, Config
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType

CLIENT_KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
ADMIN = Admin(auth_id="root", password_hash=hash_password("pw", n=2, r=1, p=1), role="admin")


def _fabric(*, view_signed: bool = True) -> Fabric:
    fabric = Fabric(dataclasses.replace(family_config(), admins=(ADMIN,)), view_signed=view_signed)
    fabric.start()
    fabric.advance(1.0)
    return fabric


def _answer(
    fabric: Fabric,
    *,
    curve: bool,
    signed: bool,
    channel: Channel = Channel.FRONTEND,
    config_type: ConfigType = ConfigType.JSON,
) -> Config:
    core = fabric.brokers["a"]
    core.core.curve = curve
    if curve:
        core.handle(Authenticated(channel, b"c1", CLIENT_KEY), fabric.now, fabric.wall)
    protocol = SIG_CLIENT if channel is Channel.FRONTEND else SIG_WORKER
    check = CheckConfig(config_type, None, None, signed, protocol=protocol)
    out = core.handle(Received(channel, b"c1", check), fabric.now, fabric.wall)
    (answer,) = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(answer, Config)
    return answer


def _no_admins(answer: Config) -> None:
    frames = b"".join(answer.to_frames())
    assert b"admins" not in frames and b"password_hash" not in frames
    assert ADMIN.password_hash.encode() not in frames


@pytest.mark.parametrize("curve", [True, False])
@pytest.mark.parametrize("config_type", list(ConfigType))
@pytest.mark.parametrize("channel", [Channel.FRONTEND, Channel.BACKEND])
def test_a_signed_checkconfig_gets_the_signed_client_view_and_no_admins(
    config_type: ConfigType, channel: Channel, curve: bool
) -> None:
    fabric = _fabric()
    answer = _answer(fabric, curve=curve, signed=True, channel=channel, config_type=config_type)
    network = fabric.brokers["a"].core.network
    assert answer.signature is None  # the whole config's signature goes to brokers only
    assert answer.sha256 == client_view_sha256(network)
    assert answer.config_sha256 == config_sha256(network)
    assert answer.view_signature == view_signed(network)
    _no_admins(answer)
    verified = ConfigTrust((KEY.public_key(),)).check(answer)
    assert verified.version == network.config_version
    assert verified.document == client_view_tree(network)


@pytest.mark.parametrize("curve", [True, False])
def test_an_unsigned_checkconfig_gets_the_view_as_before(curve: bool) -> None:
    answer = _answer(_fabric(), curve=curve, signed=False)
    assert answer.signature is None and answer.view_signature is None
    assert answer.config_sha256 is None
    _no_admins(answer)


def test_a_config_without_a_view_signature_gives_a_verifying_client_a_clear_refusal() -> None:
    fabric = _fabric(view_signed=False)
    answer = _answer(fabric, curve=True, signed=True)
    assert answer.view_signature is None and answer.signature is None
    _no_admins(answer)  # not even then is the whole config sent
    with pytest.raises(UntrustedConfig, match="no view_signature"):
        ConfigTrust((KEY.public_key(),)).check(answer)


def test_the_view_signature_travels_on_pub_and_peer_config_and_is_saved() -> None:
    """A config source's new version reaches every broker with its view signature (PUB), and
    each saves it; a joining broker gets it with the config from its seed (CONFIG, §5.5)."""
    network = family_config()
    fabric = Fabric(network, joining=("c",))
    fabric.add("c", None, seeds=(network.brokers[0].peer,))
    fabric.start()
    fabric.advance(2.0)
    c = fabric.brokers["c"]
    assert c.state == "active" and c.core.view_signature == view_signed(network)
    two = dataclasses.replace(network, config_version=2)
    fabric.feed("a", ConfigOffered(offer_of(two), "admin"))
    fabric.settle()
    fabric.advance(1.0)
    for name, broker in fabric.brokers.items():
        assert broker.core.view_signature == view_signed(two), name
        saved = [e for e in fabric.effects[name] if isinstance(e, Persist)]
        assert saved[-1].view_signature == view_signed(two), name
    published = [e.config for e in fabric.effects["a"] if isinstance(e, Publish)]
    assert published[-1].view_signature == view_signed(two)


def test_k6_the_family_gains_the_view_signature_of_the_running_config() -> None:
    """Brokers that run a config without its view signature take it (verified) when a source
    offers the same config with one: no new version needed, no session renegotiated."""
    fabric = _fabric(view_signed=False)
    assert all(b.core.view_signature is None for b in fabric.brokers.values())
    fabric.feed("a", ConfigOffered(offer_of(fabric.network), "file"))
    fabric.settle()
    fabric.advance(6.0)  # a republish reaches every subscriber
    for name, broker in fabric.brokers.items():
        assert broker.core.view_signature == view_signed(fabric.network), name
        assert broker.replica.version == 1
        saved = [e for e in fabric.effects[name] if isinstance(e, Persist)]
        assert saved[-1].view_signature == view_signed(fabric.network), name


def test_k6_a_view_signature_that_does_not_verify_is_refused_with_its_config() -> None:
    fabric = _fabric()
    two = dataclasses.replace(fabric.network, config_version=2)
    for view_signature in (view_signed(two, OTHER_KEY), view_signed(fabric.network)):
        bad = dataclasses.replace(offer_of(two), view_signature=view_signature)
        fabric.feed("a", ConfigOffered(bad, "admin"))
        fabric.settle()
        a = fabric.brokers["a"]
        assert a.replica.version == 1 and a.core.view_signature == view_signed(fabric.network)
        assert a.core.counters["configs_refused"] >= 1
