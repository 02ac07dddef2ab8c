"""The core tests' fabric lives in the product now, scale0/sim/fabric.py (tools/scale drives it
too). This name stays so that tests written against it keep using the same fabric: no copy."""

from scale0.sim.fabric import (
    KEY,
    OTHER_KEY,
    Drop,
    Fabric,
    entry,
    family_config,
    offer_of,
    replace,
    signed,
)

__all__ = [
    "KEY",
    "OTHER_KEY",
    "Drop",
    "Fabric",
    "entry",
    "family_config",
    "offer_of",
    "replace",
    "signed",
]
