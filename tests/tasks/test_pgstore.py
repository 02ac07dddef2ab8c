"""The PostgreSQL store's lease (G1-G3): one active coordinator per database, handed over
when the holder dies, even by SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from scale0.tasks import pgstore
from scale0.tasks.pgstore import PostgresStore
from tests.tasks.postgres import Server
from tests.tasks.processes import REPO

WAIT_S = 30.0

HOLDER = """
import sys, time
from scale0.tasks.pgstore import PostgresStore
store = PostgresStore(sys.argv[1])
assert store.acquire(30)
print("held", flush=True)
time.sleep(60)
"""


def test_rules_header_lists_g1_to_g3() -> None:
    assert re.findall(r"^(G\d+)\s", pgstore.__doc__ or "", re.MULTILINE) == ["G1", "G2", "G3"]


def test_one_lease_per_database(postgres: Server) -> None:
    dsn = postgres.database()
    first, second = PostgresStore(dsn), PostgresStore(dsn)
    other_db = PostgresStore(postgres.database())
    try:
        assert first.try_acquire()
        assert not second.try_acquire()
        assert not second.acquire(timeout_s=0.3)
        assert other_db.try_acquire()  # another database, another family
        first.close()
        assert second.acquire(timeout_s=WAIT_S)
    finally:
        second.close()
        other_db.close()


def test_a_sigkilled_holder_hands_the_lease_over(postgres: Server) -> None:
    dsn = postgres.database()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, dsn], cwd=REPO, stdout=subprocess.PIPE)
    standby = PostgresStore(dsn)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        assert not standby.try_acquire()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(WAIT_S)
        started = time.monotonic()
        assert standby.acquire(timeout_s=WAIT_S)
        print(f"lease taken over {time.monotonic() - started:.2f} s after the SIGKILL")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(WAIT_S)
        if holder.stdout is not None:
            holder.stdout.close()
        standby.close()
