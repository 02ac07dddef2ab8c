"""Config replication rules K1-K6 (scale0/core/replica.py), pure: offers in, outcomes out."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.config.canonical import canonical_json
from scale0.config.formats import render
from scale0.config.schema import to_tree
from scale0.core.replica import Applied, Conflict, Offer, Refused, Replica, SignedConfig, Unchanged
from scale0.sim.fabric import (
    KEY,
    OTHER_KEY,
    entry,
    family_config,
    offer_of,
    signed,
    view_signed,
)
from scale0.wire.frames import ConfigType


def replica(version: int | None = 1, *, view: bool = True) -> Replica:
    current = None
    if version is not None:
        network = family_config(version=version)
        sha, signature = signed(network)
        current = SignedConfig(network, sha, signature, "a", view_signed(network) if view else None)
    return Replica("a", (KEY.public_key(),), family="fam", current=current)


def test_k1_a_valid_signed_higher_config_applies() -> None:
    r = replica()
    outcome = r.offer(offer_of(family_config(version=2)))
    assert isinstance(outcome, Applied)
    assert r.version == 2 and outcome.previous_version == 1


def test_k1_an_unsigned_config_is_refused() -> None:
    r = replica()
    offer = dataclasses.replace(offer_of(family_config(version=2)), signature=None)
    outcome = r.offer(offer)
    assert isinstance(outcome, Refused) and "not signed" in outcome.reason
    assert r.version == 1


def test_k1_an_untrusted_signature_is_refused() -> None:
    r = replica()
    outcome = r.offer(offer_of(family_config(version=2), key=OTHER_KEY))
    assert isinstance(outcome, Refused) and "signature" in outcome.reason
    assert r.version == 1


def test_k1_a_signature_for_another_version_is_refused() -> None:
    r = replica()
    good = offer_of(family_config(version=2))
    stolen = offer_of(family_config(version=3))
    outcome = r.offer(dataclasses.replace(stolen, signature=good.signature))
    assert isinstance(outcome, Refused) and "signature" in outcome.reason


def test_k1_a_sha256_that_does_not_match_the_document_is_refused() -> None:
    r = replica()
    offer = offer_of(family_config(version=2))
    outcome = r.offer(dataclasses.replace(offer, sha256="0" * 64))
    assert isinstance(outcome, Refused) and "sha256" in outcome.reason


def test_k1_another_family_is_refused() -> None:
    r = replica()
    network = dataclasses.replace(family_config(version=2), family="other")
    outcome = r.offer(offer_of(network))
    assert isinstance(outcome, Refused) and "family" in outcome.reason


def test_k1_a_document_that_is_not_a_valid_config_is_refused_and_names_the_problem() -> None:
    r = replica()
    offer = offer_of(family_config(version=2))
    broken = offer.document.replace(b'"liveness":3', b'"liveness":"x"')
    outcome = r.offer(dataclasses.replace(offer, document=broken))
    assert isinstance(outcome, Refused) and "liveness" in outcome.reason
    assert r.version == 1


def test_k1_a_config_arrives_in_every_format_with_one_digest() -> None:
    network = family_config(version=2)
    for config_type, fmt in ((ConfigType.XML, "xml"), (ConfigType.ZFL, "zfl")):
        r = replica()
        document = render(to_tree(network, typed=False), fmt, kind="network")
        offer = dataclasses.replace(offer_of(network), config_type=config_type, document=document)
        assert isinstance(r.offer(offer), Applied), fmt


def test_k2_a_lower_version_is_refused_as_stale() -> None:
    r = replica(version=5)
    outcome = r.offer(offer_of(family_config(version=4)))
    assert isinstance(outcome, Refused) and "older" in outcome.reason
    assert r.version == 5


def test_k3_the_running_config_again_changes_nothing() -> None:
    r = replica()
    outcome = r.offer(offer_of(family_config(version=1)))
    assert isinstance(outcome, Unchanged)


def test_k3_the_running_config_without_a_claimed_version_is_no_conflict() -> None:
    """A restarted broker offers its saved config with no version options: judged in full, it
    is still the running config, not a conflict with itself (issue 11 #6)."""
    r = replica()
    again = dataclasses.replace(offer_of(family_config(version=1)), config_version=None)
    outcome = r.offer(again)
    assert isinstance(outcome, Unchanged)
    assert len(r.conflicts) == 0


def _rivals() -> tuple[Offer, Offer]:
    one = family_config(version=4)
    two = dataclasses.replace(one, liveness=5)
    first, second = offer_of(one, origin="a"), offer_of(two, origin="b")
    return (first, second) if first.sha256 < second.sha256 else (second, first)


def test_k4_an_equal_version_conflict_keeps_the_smaller_sha256_whatever_the_order() -> None:
    small, large = _rivals()
    r1, r2 = replica(), replica()
    r1.offer(small)
    lost = r1.offer(large)
    r2.offer(large)
    won = r2.offer(small)
    assert isinstance(lost, Conflict) and lost.kept == small.sha256
    assert isinstance(won, Applied) and won.conflict
    assert r1.current is not None and r2.current is not None
    assert r1.current.sha256 == r2.current.sha256 == small.sha256
    assert len(r1.conflicts) == len(r2.conflicts) == 1


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(5)))
def test_k2_c4_any_order_of_offers_ends_at_the_same_config(order: list[int]) -> None:
    small, large = _rivals()
    offers = [
        offer_of(family_config(version=2)),
        offer_of(family_config(version=3)),
        small,
        large,
        offer_of(family_config(version=3), key=OTHER_KEY),
    ]
    r = replica()
    versions = [r.version]
    for i in order:
        r.offer(offers[i])
        versions.append(r.version)
    assert versions == sorted(versions)  # versions only go up
    assert r.current is not None and r.current.sha256 == small.sha256


def test_k5_the_plan_connects_new_peers_closes_removed_ones_and_names_restarts() -> None:
    r = replica()
    old = family_config(version=1)
    moved = dataclasses.replace(old.brokers[0], frontend="tcp://127.0.0.1:9999")
    new = dataclasses.replace(
        old,
        config_version=2,
        brokers=(moved, old.brokers[1], entry("d", 5)),
        liveness=4,
    )
    outcome = r.offer(offer_of(new))
    assert isinstance(outcome, Applied)
    plan = outcome.plan
    assert plan.connect == {"d": "tcp://127.0.0.1:7052"}
    assert plan.close == ("c",)
    assert plan.restart_needed == ("brokers[a].frontend",)
    assert set(plan.changed) == {"brokers", "config_version", "liveness"}


def test_the_document_of_a_signed_config_is_its_canonical_json() -> None:
    network = family_config()
    sha, signature = signed(network)
    assert SignedConfig(network, sha, signature, "a").document() == canonical_json(network)


def test_k1_a_config_that_leaves_the_family_without_a_config_source_is_refused() -> None:
    r = replica()
    old = family_config(version=2)
    orphaned = dataclasses.replace(
        old, brokers=tuple(dataclasses.replace(b, config_source=False) for b in old.brokers)
    )
    outcome = r.offer(offer_of(orphaned))
    assert isinstance(outcome, Refused) and "no config source" in outcome.reason
    assert r.version == 1


# ---- K6: the client view's signature ---------------------------------------------------------


def test_k6_a_view_signature_by_another_key_refuses_the_whole_offer() -> None:
    r = replica()
    two = family_config(version=2)
    offer = dataclasses.replace(offer_of(two), view_signature=view_signed(two, OTHER_KEY))
    outcome = r.offer(offer)
    assert isinstance(outcome, Refused) and outcome.reason.startswith("view_signature:")
    assert r.version == 1


def test_k6_a_view_signature_of_another_version_refuses_the_offer() -> None:
    r = replica()
    offer = dataclasses.replace(
        offer_of(family_config(version=3)), view_signature=view_signed(family_config(version=2))
    )
    outcome = r.offer(offer)
    assert isinstance(outcome, Refused) and "view_signature" in outcome.reason
    assert r.version == 1


def test_k6_a_config_without_a_view_signature_still_applies() -> None:
    r = replica()
    offer = dataclasses.replace(offer_of(family_config(version=2)), view_signature=None)
    assert isinstance(r.offer(offer), Applied)
    assert r.current is not None and r.current.view_signature is None


def test_k6_the_running_config_gains_the_view_signature_it_lacks() -> None:
    for claimed in (1, None):  # from PUB (version claimed) and from disk (judged in full)
        r = replica(view=False)
        offer = dataclasses.replace(offer_of(family_config(version=1)), config_version=claimed)
        outcome = r.offer(offer)
        assert isinstance(outcome, Applied) and outcome.view_signed
        assert r.current is not None
        assert r.current.view_signature == view_signed(family_config(version=1))
        assert isinstance(r.offer(offer), Unchanged)


def test_k6_a_bad_view_signature_for_the_running_config_is_refused() -> None:
    r = replica(view=False)
    one = family_config(version=1)
    offer = dataclasses.replace(offer_of(one), view_signature=view_signed(one, OTHER_KEY))
    outcome = r.offer(offer)
    assert isinstance(outcome, Refused) and "view_signature" in outcome.reason
    assert r.current is not None and r.current.view_signature is None


def test_k1_an_idle_heartbeat_interval_below_the_interval_is_refused_in_every_format() -> None:
    """Idle beating (docs/protocol.md §3.4): a signed config whose idle_heartbeat_interval_ms
    is below default_heartbeat_interval_ms is never applied, whatever its format."""
    bad = dataclasses.replace(family_config(version=2), idle_heartbeat_interval_ms=500)
    for config_type in ConfigType:
        r = replica()
        offer = offer_of(bad)  # JSON, signed
        if config_type is not ConfigType.JSON:
            document = render(to_tree(bad, typed=False), config_type.value, kind="network")
            offer = dataclasses.replace(offer, config_type=config_type, document=document)
        outcome = r.offer(offer)
        assert isinstance(outcome, Refused), config_type
        assert "idle_heartbeat_interval_ms" in outcome.reason, outcome.reason
        assert r.version == 1 and r.current is not None
        assert r.current.network.idle_heartbeat_interval_ms == 5000
