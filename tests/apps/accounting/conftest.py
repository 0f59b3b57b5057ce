"""The hand-computed month: tenant vision on an H100 pool across the November → December boundary, with
a whole-GPU, a MIG, an MPS and a time-slice task, and tenant audio on an A100 pool.

`now` is 2026-12-01 10:00 UTC. Per task (hours held in November | December so far):

| task | held | start → end | Nov | Dec |
|---|---|---|---|---|
| w: 2 whole H100 | 2 | Nov 30 18:00 → Dec 1 06:00 | 6 h × 2 = 12 | 6 h × 2 = 12 |
| m: 3g.40gb MIG | 3/7 | Nov 30 22:00 → Dec 1 05:00 | 2 h × 3/7 = 0.857143 | 5 h × 3/7 = 2.142857 |
| s: 300-milli MPS share, running | 0.3 | Nov 30 20:00 → (now) | 4 h × 0.3 = 1.2 | 10 h × 0.3 = 3.0 |
| p: 250-milli time slice, preempted, rerun | 0.25 | Dec 1 0:00 → 4:00, 8:00 → now | 0 | 6 h × 0.25 = 1.5 |
| a (audio): 1 whole A100 | 1 | Dec 1 01:00 → 03:00 | 0 | 2 |

vision: November 12 + 6/7 + 1.2 = 14.057143; December 12 + 15/7 + 3.0 + 1.5 = 18.642857.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.apps.accounting import factories as f

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
JAN = datetime(2027, 1, 1, tzinfo=UTC)
VISION_NOV = 12 + 2 * 3 / 7 + 1.2
VISION_DEC = 12 + 5 * 3 / 7 + 3.0 + 1.5


def at(day: int, hour: int) -> datetime:
    return datetime(2026, 11 if day > 1 else 12, day, hour, tzinfo=UTC)


@dataclass
class Month:
    vision: Any
    audio: Any
    h100: Any
    a100: Any
    mig_gpu: Any
    preempted: Any
    alice: Any  # a member of vision
    bob: Any  # a member of audio
    eve: Any  # signed in, a member of nothing
    root: Any  # a platform admin


@pytest.fixture
def month(db: None) -> Month:
    from apps.inventory.services import pool_create
    from apps.tenants.models import Membership
    from apps.tenants.services import membership_set, tenant_create
    from apps.workloads.models import Task
    from apps.workloads.services import queue_create, quota_set
    from tests.apps.factories import UserFactory

    vision = tenant_create(slug="vision", name="Vision")
    audio = tenant_create(slug="audio", name="Audio")
    users = {name: UserFactory(username=name) for name in ("alice", "bob", "eve")}
    membership_set(user=users["alice"], tenant=vision, role=Membership.Role.MEMBER)
    membership_set(user=users["bob"], tenant=audio, role=Membership.Role.VIEWER)
    h100 = pool_create(name="h100-train", runtime="process")
    a100 = pool_create(name="a100-infer", runtime="process")
    quota_set(tenant=vision, pool=h100, guaranteed_milli=4000)
    quota_set(tenant=audio, pool=a100, guaranteed_milli=1000)
    train = queue_create(tenant=vision, pool=h100, name="train")
    infer = queue_create(tenant=audio, pool=a100, name="infer")

    node = f.node_in(h100)
    g0, g1 = f.gpu(node), f.gpu(node)
    mig_gpu = f.gpu(node, mode="mig")
    shared = f.gpu(node, mode="mps")
    sliced = f.gpu(node, mode="timeslice")
    f.held(train, [f.whole(g0), f.whole(g1)], at(30, 18), at(1, 6))
    f.held(train, [f.mig(mig_gpu)], at(30, 22), at(1, 5))
    f.held(train, [f.share(shared, 300)], at(30, 20))
    slice_unit = f.share(sliced, 250, kind="timeslice")
    first = f.held(train, [slice_unit], at(1, 0), at(1, 4), state=Task.State.PREEMPTED)
    f.held(train, [slice_unit], at(1, 8), task=first.task)
    f.held(infer, [f.whole(f.gpu(f.node_in(a100), model="A100-80GB"))], at(1, 1), at(1, 3))
    return Month(
        vision=vision,
        audio=audio,
        h100=h100,
        a100=a100,
        mig_gpu=mig_gpu,
        preempted=first.task,
        root=UserFactory(username="root", is_staff=True, is_superuser=True),
        **users,
    )
