"""S1-S4 (scale0.session.trust): a client or worker checks the signed client view itself.

Every refusal here is one the check exists for: with the check it names (S1's signature, its
digest, its version) taken out of scale0/session/trust.py, the test fails.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.config.canonical import (
    canonical_json,
    client_view_sha256,
    client_view_tree,
    config_sha256,
    tree_sha256,
)
from scale0.config.model import Admin, NetworkConfig
from scale0.crypto.keys import key_id, sign_config, sign_view
from scale0.crypto.passwords import hash_password
from scale0.session.errors import RequestTimeout, Scale0Error
from scale0.session.failover import Failover
from scale0.session.link import BrokerLink, LinkEvent
from scale0.session.requests import ClientSession
from scale0.session.trust import ConfigTrust, UntrustedConfig
from scale0.session.worker import WorkerSession
from scale0.wire.client import CheckConfig, Config, ConfigAck
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER, ConfigType
from scale0.wire.registry import decode_to_broker
from tests.session.helpers import entry, network, view_document

FAMILY_KEY = Ed25519PrivateKey.generate()
ROGUE_KEY = Ed25519PrivateKey.generate()
SEED = "tcp://127.0.0.1:7000"
#: Two made-up CURVE public keys (40 Z85 characters), for the brokers' entries.
CURVE_B0 = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
CURVE_B1 = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
ADMIN = Admin(auth_id="root", password_hash=hash_password("pw", n=2, r=1, p=1), role="admin")


def family(version: int = 1, *, count: int = 2) -> NetworkConfig:
    base = network(count)
    keys = (CURVE_B0, CURVE_B1)
    brokers = tuple(
        dataclasses.replace(entry(i), curve_public_key=keys[i % 2], config_source=i == 0)
        for i in range(count)
    )
    return dataclasses.replace(base, config_version=version, brokers=brokers, admins=(ADMIN,))


def signed_config(
    config: NetworkConfig,
    *,
    key: Ed25519PrivateKey | None = FAMILY_KEY,
    config_type: ConfigType = ConfigType.JSON,
    protocol: bytes = SIG_CLIENT,
) -> Config:
    """The CONFIG a broker answers a ``signed`` CHECKCONFIG with: the client view, its sha256,
    the whole config's sha256 and the view's signature (``key`` None: a config whose source
    signed no view)."""
    whole, view = config_sha256(config), client_view_sha256(config)
    signature = None
    if key is not None:
        signature = sign_view(key, config.family, config.config_version, whole, view)
    return Config(
        config_type,
        config.config_version,
        view,
        "c.1",
        view_document(config, config_type, config.client_view),
        None,
        signature,
        whole,
        protocol=protocol,
    )


def trust() -> ConfigTrust:
    return ConfigTrust((FAMILY_KEY.public_key(),))


def refused(check: ConfigTrust, message: Config) -> str:
    with pytest.raises(UntrustedConfig) as caught:
        check.check(message, sender=SEED)
    assert SEED in str(caught.value)
    return caught.value.reason


# ---- S1 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("config_type", list(ConfigType))
def test_s1_a_view_signed_by_the_trusted_key_is_verified_in_every_format(
    config_type: ConfigType,
) -> None:
    check = trust()
    verified = check.check(signed_config(family(3), config_type=config_type))
    assert verified.version == 3
    assert verified.key_id == key_id(FAMILY_KEY.public_key())
    assert verified.config_sha256 == config_sha256(family(3))
    assert [b["curve_public_key"] for b in verified.document["brokers"]] == [CURVE_B0, CURVE_B1]
    # S4: what it learns is the view as signed, and the view never holds the admins.
    assert verified.document == client_view_tree(family(3))
    assert "admins" not in verified.document
    assert check.current == verified


def test_s1_a_view_without_its_signature_is_refused_naming_the_missing_option() -> None:
    reason = refused(trust(), signed_config(family(), key=None))
    assert "no view_signature" in reason and "sign it again" in reason
    # The whole config with its config signature (what brokers before the view signature sent
    # over CURVE) is no view signature either: refused, never used.
    config = family()
    sha = config_sha256(config)
    old = Config(
        ConfigType.JSON,
        1,
        sha,
        "c.1",
        canonical_json(config),
        sign_config(FAMILY_KEY, config.family, 1, sha),
        protocol=SIG_CLIENT,
    )
    assert "no view_signature" in refused(trust(), old)


def test_s1_a_view_without_the_whole_configs_digest_is_refused() -> None:
    message = dataclasses.replace(signed_config(family()), config_sha256=None)
    assert "no config_sha256" in refused(trust(), message)


def test_s1_a_view_signed_by_another_key_is_refused_naming_the_trusted_key() -> None:
    reason = refused(trust(), signed_config(family(), key=ROGUE_KEY))
    assert "no trusted key verifies the signature" in reason
    assert key_id(FAMILY_KEY.public_key()) in reason


def test_s1_a_view_altered_after_signing_is_refused() -> None:
    good = signed_config(family())
    rogue = dataclasses.replace(
        family(),
        brokers=(
            dataclasses.replace(entry(0), frontend="tcp://10.9.9.9:7000", config_source=True),
        ),
    )
    tampered = dataclasses.replace(good, document=view_document(rogue, ConfigType.JSON))
    assert "the document was altered" in refused(trust(), tampered)
    # ...and with the digest fixed to the new document, the signature no longer holds.
    also = dataclasses.replace(tampered, sha256=client_view_sha256(rogue))
    assert "no trusted key verifies" in refused(trust(), also)


def test_s1_a_view_signature_of_another_config_version_is_refused() -> None:
    """The signature of version 2's view, with version 3's view (its digest right): refused."""
    two, three = family(2), family(3)
    message = dataclasses.replace(
        signed_config(three), view_signature=signed_config(two).view_signature
    )
    assert "no trusted key verifies" in refused(trust(), message)
    # Version 2's view under version 3's options: the document says 2.
    relabelled = dataclasses.replace(signed_config(two), config_version=3)
    assert "config_version 3 in the options, 2 in the document" in refused(trust(), relabelled)


def test_s1_a_view_signature_binds_the_whole_configs_digest() -> None:
    """The same view under another whole config's digest (a conflict's loser, say): refused."""
    message = signed_config(family())
    other = config_sha256(dataclasses.replace(family(), liveness=9))
    assert "no trusted key verifies" in refused(
        trust(), dataclasses.replace(message, config_sha256=other)
    )


def test_s1_a_config_signature_is_never_taken_for_a_view_signature() -> None:
    """What a config signature covers has three fields, a view signature's five (§6.2)."""
    config = family()
    message = signed_config(config)
    whole = sign_config(FAMILY_KEY, config.family, 1, config_sha256(config))
    view_as_whole = sign_config(FAMILY_KEY, config.family, 1, message.sha256)
    for signature in (whole, view_as_whole):
        forged = dataclasses.replace(message, view_signature=signature)
        assert "no trusted key verifies" in refused(trust(), forged)


def test_s1_a_view_carrying_admins_is_refused_even_if_signed() -> None:
    config = family()
    tree = {**client_view_tree(config), "admins": [{"auth_id": "root"}]}
    document = json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()
    view = tree_sha256(tree)
    whole = config_sha256(config)
    message = dataclasses.replace(
        signed_config(config),
        document=document,
        sha256=view,
        view_signature=sign_view(FAMILY_KEY, config.family, 1, whole, view),
    )
    assert "carries admins" in refused(trust(), message)


def test_s1_a_document_that_does_not_parse_is_refused() -> None:
    message = dataclasses.replace(signed_config(family()), document=b'{"family": ')
    assert "does not parse" in refused(trust(), message)
    message = dataclasses.replace(signed_config(family()), document=b"[1]")
    assert "not a mapping" in refused(trust(), message)


def test_s1_a_view_of_another_family_than_the_verified_one_is_refused() -> None:
    check = trust()
    check.check(signed_config(family(1)))
    other = dataclasses.replace(family(2), family="other")
    assert "family 'other'" in refused(check, signed_config(other))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_s1_no_altered_byte_of_a_signed_view_is_ever_used(data: st.DataObject) -> None:
    """Any change to the document, a digest or the signature: refused, or exactly the same."""
    good = signed_config(family(2))
    field = data.draw(st.sampled_from(["document", "sha256", "config_sha256", "view_signature"]))
    original: str | bytes = getattr(good, field)
    raw = original.encode() if isinstance(original, str) else original
    index = data.draw(st.integers(0, len(raw) - 1))
    replacement = data.draw(
        st.sampled_from(b"0123456789abcdef") if field != "document" else st.integers(0, 255)
    )
    changed = raw[:index] + bytes([replacement]) + raw[index + 1 :]
    value: str | bytes = changed.decode("latin-1") if isinstance(original, str) else changed
    message = dataclasses.replace(good, **{field: value})
    check = trust()
    try:
        verified = check.check(message)
    except UntrustedConfig:
        assert check.current is None
        return
    # Accepted only if it is the same view (JSON may differ in a byte that parses the same).
    assert verified.sha256 == good.sha256 and verified.version == 2
    assert verified.config_sha256 == good.config_sha256


# ---- S2 -------------------------------------------------------------------------------------


def test_s2_an_older_view_replayed_is_refused_and_the_verified_one_stays() -> None:
    check = trust()
    old = signed_config(family(4))
    check.check(old)
    newer = check.check(signed_config(family(5)))
    assert "older than the verified config_version 5" in refused(check, old)
    assert check.current == newer and check.refused == 1


def test_s2_the_same_config_again_and_a_newer_one_are_taken() -> None:
    check = trust()
    check.check(signed_config(family(1)))
    assert check.check(signed_config(family(1))).version == 1
    assert check.check(signed_config(family(2))).version == 2


def test_s2_a_conflict_of_one_version_keeps_the_smaller_digest() -> None:
    one = family(7)
    two = dataclasses.replace(one, liveness=one.liveness + 1)
    small, large = sorted((one, two), key=config_sha256)
    check = trust()
    check.check(signed_config(large))
    assert check.check(signed_config(small)).config_sha256 == config_sha256(small)
    assert "the smaller wins" in refused(check, signed_config(large))


def test_s2_a_conflict_is_settled_by_the_whole_configs_digest_as_brokers_settle_it() -> None:
    """Two configs of one version that differ only outside the view (their admins): the views
    are the same bytes, yet the client follows the brokers (K4: the smaller whole sha256)."""
    one = family(7)
    two = dataclasses.replace(one, admins=())
    small, large = sorted((one, two), key=config_sha256)
    assert client_view_sha256(small) == client_view_sha256(large)
    check = trust()
    check.check(signed_config(small))
    assert "the smaller wins" in refused(check, signed_config(large))
    assert check.current is not None and check.current.config_sha256 == config_sha256(small)


# ---- S3, S4 on the link and in the sessions -------------------------------------------------


def _link(protocol: bytes = SIG_CLIENT) -> BrokerLink:
    link = BrokerLink(protocol, trust=trust())
    link.endpoint = SEED
    link.reset(0.0)
    return link


def test_s1_a_link_with_a_trusted_key_asks_for_the_signed_config() -> None:
    link = _link()
    [frames] = link.outbox
    message = decode_to_broker(frames, max_frame_bytes=1 << 20)
    assert isinstance(message, CheckConfig) and message.signed
    plain = BrokerLink(SIG_CLIENT)
    plain.reset(0.0)
    message = decode_to_broker(plain.outbox[0], max_frame_bytes=1 << 20)
    assert isinstance(message, CheckConfig) and not message.signed


def test_s3_a_refused_config_leaves_the_broker_and_keeps_the_verified_config() -> None:
    link = _link()
    assert link.handle(signed_config(family(2)), 0.0) is LinkEvent.NEGOTIATED
    kept = link.config
    event = link.handle(signed_config(family(3), key=ROGUE_KEY), 1.0)
    assert event is LinkEvent.RECONNECT and not link.negotiated
    assert link.config is kept and link.config_version == 2
    assert link.untrusted is not None and "untrusted config" in link.leave_reason
    # S4: what the owner learns carries no admins.
    assert kept is not None and "admins" not in kept.document


def test_s3_a_configack_of_a_version_never_verified_is_refused() -> None:
    link = _link()
    event = link.handle(ConfigAck(config_version=4, client_id="c.1", protocol=SIG_CLIENT), 0.0)
    assert event is LinkEvent.RECONNECT and link.config is None
    link.handle(signed_config(family(4)), 1.0)
    ack = ConfigAck(config_version=4, client_id="c.1", protocol=SIG_CLIENT)
    assert link.handle(ack, 2.0) is LinkEvent.NEGOTIATED


def test_s3_failover_learns_endpoints_and_keys_only_from_a_verified_config() -> None:
    link = BrokerLink(SIG_CLIENT, trust=trust())
    failover = Failover(SEED, "frontend", seed_key=CURVE_B0)
    session = ClientSession(link, 0, failover, id_prefix=b"p" * 8)
    session.arrived(0.0)
    rogue = dataclasses.replace(
        family(9),
        brokers=(dataclasses.replace(entry(5), curve_public_key=CURVE_B1, config_source=True),),
    )
    session.receive(signed_config(rogue, key=ROGUE_KEY).to_frames(), 0.1)
    assert failover.endpoints == [SEED] and session.move is not None
    assert failover.server_key("tcp://127.0.0.1:7005") is None
    session.arrived(1.0)
    session.receive(signed_config(family(2)).to_frames(), 1.1)
    assert failover.endpoints == ["tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"]
    assert failover.server_key("tcp://127.0.0.1:7001") == CURVE_B1


def test_s3_a_request_that_finds_no_trusted_config_fails_naming_why() -> None:
    link = BrokerLink(SIG_CLIENT, trust=trust())
    session = ClientSession(link, 0, Failover(SEED, "frontend"), id_prefix=b"p" * 8)
    session.arrived(0.0)
    request = session.submit("echo", b"x", 2.0, 0.0)
    session.receive(signed_config(family(), key=ROGUE_KEY).to_frames(), 0.1)
    session.tick(3.0, 0.0)
    with pytest.raises(UntrustedConfig) as caught:
        raise request.outcomes.popleft()  # type: ignore[misc]
    error = caught.value
    assert isinstance(error, Scale0Error) and not isinstance(error, RequestTimeout)
    assert error.service == "echo" and SEED in str(error)
    assert "no trusted key verifies the signature" in str(error)


def test_s3_a_worker_does_not_register_with_a_broker_whose_config_is_untrusted() -> None:
    link = BrokerLink(SIG_WORKER, trust=trust())
    session = WorkerSession(link, Failover(SEED, "backend"), ("echo",), 1)
    session.arrived(0.0)
    link.outbox.clear()
    unsigned = signed_config(family(), key=None, protocol=SIG_WORKER)
    assert session.receive(unsigned.to_frames(), 0.1, 0.0) is None
    assert not session.registered and session.move is not None and link.outbox == []
    session.arrived(1.0)
    link.outbox.clear()
    session.receive(signed_config(family(), protocol=SIG_WORKER).to_frames(), 1.1, 0.0)
    assert session.registered


def test_a_trust_without_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one trusted key"):
        ConfigTrust(())


def test_s3_a_request_submitted_after_the_refusal_fails_naming_it_too() -> None:
    link = BrokerLink(SIG_CLIENT, trust=trust())
    session = ClientSession(link, 0, Failover(SEED, "frontend"), id_prefix=b"p" * 8)
    session.arrived(0.0)
    session.receive(signed_config(family(), key=None).to_frames(), 0.1)
    request = session.submit("echo", b"x", 1.0, 0.2)  # no move since: nothing new refused
    session.tick(1.5, 0.0)
    with pytest.raises(UntrustedConfig, match="no view_signature"):
        raise request.outcomes.popleft()  # type: ignore[misc]
