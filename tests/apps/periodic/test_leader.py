"""The beat lease against real PostgreSQL: one leader among beats, a standby taking over when the leader's
session ends (killed, released, silent past its lease), and sends fenced by the lease."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from apps.periodic.leader import BeatLease, lease_from_settings
from apps.periodic.models import PeriodicRun

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def make_lease() -> Iterator[Callable[..., BeatLease]]:
    made: list[BeatLease] = []

    def make(holder: str, lease_s: float = 5.0) -> BeatLease:
        lease = lease_from_settings(holder, lease_s)
        made.append(lease)
        return lease

    yield make
    for lease in made:
        lease.release()


def _backend_pid(holder: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [f"whalegen-beat {holder}"]
        )
        rows = cursor.fetchall()
    assert len(rows) == 1, rows
    return int(rows[0][0])


def _eventually(predicate: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    return predicate()


def test_one_of_two_beats_leads_and_the_other_stands_by(make_lease: Callable[..., BeatLease]) -> None:
    first, second = make_lease("beat-a"), make_lease("beat-b")
    assert first.hold() is True
    assert second.hold() is False
    # Holding is renewing: asked again, each keeps its role.
    assert (first.hold(), second.hold(), first.hold()) == (True, False, True)
    assert (first.leading, second.leading) == (True, False)


def test_a_standby_takes_over_as_soon_as_the_leader_lets_go(make_lease: Callable[..., BeatLease]) -> None:
    first, second = make_lease("beat-a"), make_lease("beat-b")
    assert first.hold() and not second.hold()
    first.release()
    assert second.hold() is True
    assert first.hold() is False  # the old leader comes back as the standby


def test_a_leader_whose_session_is_killed_loses_the_lease_and_the_standby_takes_it(
    make_lease: Callable[..., BeatLease],
) -> None:
    first, second = make_lease("beat-a"), make_lease("beat-b")
    assert first.hold() and not second.hold()
    # What PostgreSQL sees when a beat process is killed: its session ends, and its locks with it.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [_backend_pid("beat-a")])
    assert _eventually(second.hold, 10) is True
    assert first.hold() is False
    assert first.claim("plane-tick", 0) is False


def test_a_leader_silent_longer_than_its_lease_loses_it(make_lease: Callable[..., BeatLease]) -> None:
    first, second = make_lease("beat-a", lease_s=1.0), make_lease("beat-b", lease_s=1.0)
    assert first.hold() and not second.hold()
    second.runs(["plane-tick"])
    # The leader says nothing for well over its lease (a hung process, a host gone without a FIN):
    # PostgreSQL ends its session (idle_session_timeout) and the standby takes over.
    assert _eventually(second.hold, 15) is True
    assert first.claim("plane-tick", 0) is False  # woken up, its send is refused
    assert first.hold() is False


def test_only_the_leader_claims_and_each_claim_moves_the_version_by_one(
    make_lease: Callable[..., BeatLease],
) -> None:
    leader, standby = make_lease("beat-a"), make_lease("beat-b")
    assert leader.hold() and not standby.hold()
    records = leader.runs(["schedule-pools"])
    assert records["schedule-pools"].version == 0
    assert standby.claim("schedule-pools", 0) is False
    assert leader.claim("schedule-pools", 0) is True
    assert leader.claim("schedule-pools", 0) is False  # a stale version: someone sent it already
    assert leader.claim("schedule-pools", 1) is True
    row = PeriodicRun.objects.get(name="schedule-pools")
    assert (row.version, row.sent_by) == (2, "beat-a")


def test_run_records_are_made_for_new_entries_and_ages_come_from_the_database(
    make_lease: Callable[..., BeatLease],
) -> None:
    leader = make_lease("beat-a")
    assert leader.hold()
    leader.runs(["old", "fresh"])
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE periodic_periodicrun SET last_run_at = now() - interval '30 seconds', version = 7 "
            "WHERE name = 'old'"
        )
    records = leader.runs(["old", "fresh", "new"])
    assert records["old"].version == 7 and 29.0 <= records["old"].age_s < 60.0
    assert records["fresh"].age_s < 29.0 and records["new"] == records["new"].__class__(
        age_s=records["new"].age_s, version=0
    )
    assert set(PeriodicRun.objects.values_list("name", flat=True)) == {"old", "fresh", "new"}


def test_a_lease_needs_a_positive_length() -> None:
    with pytest.raises(ValueError, match="positive"):
        BeatLease(conninfo={}, lease_s=0)
