"""Who may create, cancel and list tasks: the family's admins (scrypt hashes) and their roles.

Rules (docs/tasks.md §10; tests/tasks/test_auth.py):

A1  With an :class:`Authorizer`, ``task-create``, ``client_new_task`` and ``task-cancel`` need
    ``auth_id`` and ``auth_password`` of an admin of the network config whose ``role`` is in
    ``roles`` (default: ``admin``); ``task-list``, ``task-explain`` and ``task-stats`` need
    any admin's (READ_ROLES). Anything else is FORBIDDEN (-32008), and nothing is changed.
A2  Every refusal is logged with who asked (the ``auth_id`` given, or none) and what.
A3  A password is checked with scrypt once; a success is remembered (by a SHA-256 of id and
    password, never the password) so a busy client does not pay scrypt per task. A refusal is
    not remembered: a wrong password costs the caller a full scrypt every time.
A4  Without an Authorizer (no ``admins_from`` in the coordinator config) submissions are open;
    the coordinator says so in its log at start.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from typing import Final

from scale0.config.model import Admin
from scale0.crypto.passwords import verify_password
from scale0.tasks.errors import ErrorCode, Refused

__all__ = ["DEFAULT_ROLES", "READ_ROLES", "Authorizer"]

DEFAULT_ROLES: Final = frozenset({"admin"})
#: Roles that may look (task-list, task-explain, task-stats): every role of the network config.
READ_ROLES: Final = frozenset({"read", "admin"})

log = logging.getLogger("scale0.tasks")


class Authorizer:
    """A1-A3 over the ``admins`` of a network config."""

    def __init__(self, admins: Iterable[Admin], roles: Iterable[str] = DEFAULT_ROLES) -> None:
        self._admins = {admin.auth_id: admin for admin in admins}
        self.roles = frozenset(roles)
        #: A3: SHA-256(id, password) of the checked admins -> their role.
        self._granted: dict[bytes, str] = {}

    def check(
        self, auth_id: object, password: object, what: str, roles: Iterable[str] | None = None
    ) -> str:
        """The auth_id allowed to do ``what`` (an admin whose role is in ``roles``, default
        the submit roles), or Refused(FORBIDDEN) after logging (A2)."""
        allowed = self.roles if roles is None else frozenset(roles)
        if isinstance(auth_id, str) and isinstance(password, str):
            key = hashlib.sha256(f"{auth_id}\0{password}".encode("utf-8", "replace")).digest()
            role = self._granted.get(key)
            if role is None:
                admin = self._admins.get(auth_id)
                if admin is not None and verify_password(password, admin.password_hash):
                    role = self._granted[key] = admin.role
            if role is not None and role in allowed:
                return auth_id
        who = auth_id if isinstance(auth_id, str) else None
        log.warning("task request refused: %s by auth_id %r", what, who)
        raise Refused(
            ErrorCode.FORBIDDEN,
            f"{what} needs auth_id and auth_password of an admin with role "
            f"{' or '.join(sorted(allowed))}",
        )
