"""A pool's history page: the charts' numbers come from the cycles, telemetry and task starts of the
window, bucketed; every chart has its table; the page costs the same few queries however long the
history."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.dashboard.history import BUCKETS, pool_history
from apps.fleet.models import GpuSample
from apps.inventory.models import Gpu
from apps.scheduling.models import Cycle
from apps.workloads.models import Task

pytestmark = pytest.mark.django_db


def cycle(pool: Any, at: Any, *, idle: int, capacity: int | None, frag: float, reasons: dict) -> None:
    after: dict = {"idle_milli": idle, "amount_pct": frag, "frag_milli": 0.0}
    if capacity is not None:
        after["capacity_milli"] = capacity
    Cycle.objects.create(
        pool=pool,
        policy="whalegen",
        started_at=at,
        finished_at=at,
        stats={
            "fragmentation_after": after,
            "unplaced_by_reason": reasons,
            "shape_mix": [[1, 1000, 1.0]] * 50,
        },
    )


@pytest.fixture
def hour(scene: Any) -> Any:
    """Two cycles and two GPU samples in the newest bucket of a one-hour window, one task started."""
    w = scene.world
    Cycle.objects.filter(pool=w.h100).delete()  # the scene's own cycle: this window has only these
    # 50 s past a minute: the samples' minute (telemetry is averaged per minute) starts 50 s before
    # `now`, inside the newest 75 s bucket of a one-hour window.
    now = timezone.now().replace(second=50, microsecond=0)
    recent = now - timedelta(seconds=30)
    cycle(w.h100, recent, idle=500, capacity=2000, frag=2.0, reasons={"no_capacity": 2, "quota_exceeded": 1})
    # Recorded before capacity was kept: measured against the pool's two GPUs now.
    cycle(
        w.h100, recent - timedelta(seconds=5), idle=1500, capacity=None, frag=4.0, reasons={"no_capacity": 1}
    )
    gpu = Gpu.objects.filter(node__pool=w.h100).first()
    GpuSample.objects.create(gpu=gpu, at=recent, util_gpu_pct=40)
    GpuSample.objects.create(gpu=gpu, at=recent, util_gpu_pct=60)
    Task.objects.filter(pk=scene.placed.pk).update(
        created_at=recent - timedelta(seconds=90), started_at=recent
    )
    return now


def test_buckets_hold_the_window_figures(scene: Any, hour: Any) -> None:
    history = pool_history(pool=scene.world.h100, now=hour, hours=1)
    assert len(history.buckets) == BUCKETS and history.cycles == 2
    last = history.buckets[-1]
    # Allocation: (2000 - 500) / 2000 = 75 % and (2000 - 1500) / 2000 = 25 %, mean 50 %.
    assert last.allocated_pct == pytest.approx(50.0)
    assert last.fragmented_pct == pytest.approx(3.0)
    assert last.busy_pct == pytest.approx(50.0)
    assert last.pending == pytest.approx(2.0)  # 3 and 1 left pending
    assert dict(last.pending_by_reason) == {"no_capacity": 1.5, "quota_exceeded": 0.5}
    assert history.reasons == ("no_capacity", "quota_exceeded")
    assert (last.wait_p50_s, last.wait_p95_s, last.started) == (90.0, 90.0, 1)
    assert all(b.allocated_pct is None for b in history.buckets[:-2])  # nothing earlier in the window


def test_page_draws_every_chart_with_its_numbers(scene: Any, hour: Any, page: Any) -> None:
    body = page(scene.world.alice).get(f"/pools/{scene.world.h100.pk}/history/?hours=1").content.decode()
    for key in ("allocation", "fragmentation", "pending", "tenants", "wait"):
        assert f'data-chart="{key}"' in body
    assert body.count("<polyline") >= 5
    assert '<td class="num">50.0%</td>' in body  # allocated and busy in the newest bucket's row
    assert "no free GPU, CPU or memory that fits" in body and "no_capacity" not in body
    assert '<td class="num">1 min 30 s</td>' in body  # P50 wait


def test_history_access_and_bad_window(scene: Any, page: Any) -> None:
    w = scene.world
    assert page(w.eve).get(f"/pools/{w.h100.pk}/history/").status_code == 404
    assert page(w.bob).get(f"/pools/{w.l4.pk}/history/").status_code == 404
    bad = page(w.alice).get(f"/pools/{w.h100.pk}/history/?hours=5")
    assert bad.status_code == 400 and "hours must be one of 1, 6, 24, 72" in bad.content.decode()
    empty = page(w.alice).get(f"/pools/{w.l4.pk}/history/").content.decode()
    assert "Nothing recorded in this window yet." in empty


def test_history_queries_do_not_grow_with_cycles(
    scene: Any, hour: Any, page: Any, django_assert_max_num_queries: Any
) -> None:
    client = page(scene.world.alice)
    url = f"/pools/{scene.world.h100.pk}/history/"
    client.get(url)
    with django_assert_max_num_queries(20) as few:
        client.get(url)
    for i in range(40):
        cycle(scene.world.h100, hour - timedelta(minutes=i), idle=0, capacity=2000, frag=1.0, reasons={})
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(url).status_code == 200


def test_tenant_usage_is_time_weighted_per_bucket(scene: Any) -> None:
    """A's whole-GPU task held 1000 milli from the middle of the last bucket-but-one to the end."""
    from apps.scheduling.models import Assignment

    w = scene.world
    now = timezone.now()
    bucket_s = 3600 / BUCKETS  # 75 s in a one-hour window
    Assignment.objects.filter(task=scene.placed).update(created_at=now - timedelta(seconds=1.5 * bucket_s))
    history = pool_history(pool=w.h100, now=now, hours=1)
    (vision,) = [u for u in history.tenants if u.tenant == "vision"]
    assert vision.guaranteed_milli == 4000
    assert vision.held_milli[-1] == pytest.approx(1000.0)
    assert vision.held_milli[-2] == pytest.approx(500.0)
    assert sum(vision.held_milli[:-2]) == 0


def test_tenant_usage_read_grouped_equals_the_row_by_row_sum(scene: Any) -> None:
    """Forty assignments of two tenants, started before or inside the window, released inside, after or
    not at all, half a GPU, two or three GPUs: the grouped read gives every bucket what summing each
    assignment's overlap row by row gives (the reference below), though it reads a few rows per tenant."""
    import random

    from apps.scheduling.models import Assignment
    from apps.workloads.models import Task

    w = scene.world
    now = timezone.now()
    hours = 6
    since, bucket_s = now - timedelta(hours=hours), hours * 3600 / BUCKETS
    rng = random.Random(7)
    expected = {"vision": [0.0] * BUCKETS, "speech": [0.0] * BUCKETS}
    for n in range(40):
        tenant, queue = (w.tenant_a, w.queue_a) if n % 2 else (w.tenant_b, w.queue_b)
        count = rng.choice([1, 2, 3])
        milli = 500 if count == 1 else 1000  # a fraction of a GPU is asked of one GPU only
        task = Task.objects.create(
            tenant=tenant, queue=queue, pool=w.h100, priority=0, gpu_count=count, gpu_milli=milli
        )
        start = now - timedelta(seconds=rng.uniform(0, hours * 3600 * 1.3))
        end = rng.choice([None, start + timedelta(seconds=rng.uniform(1, 9000))])
        if end is not None and end > now:
            end = None if rng.random() < 0.5 else end  # released in the future: still held at `now`
        row = Assignment.objects.create(task=task, node=w.node, released_at=end)
        Assignment.objects.filter(pk=row.pk).update(created_at=start)
        s = max(0.0, (start - since).total_seconds())
        e = min(hours * 3600.0, max(0.0, ((end or now) - since).total_seconds()))
        for i in range(BUCKETS):
            overlap = min(e, (i + 1) * bucket_s) - max(s, i * bucket_s)
            if overlap > 0:
                expected[tenant.slug][i] += count * milli * overlap / bucket_s
    Assignment.objects.filter(task=scene.placed).delete()  # only the forty above
    history = pool_history(pool=w.h100, now=now, hours=hours)
    got = {u.tenant: u.held_milli for u in history.tenants}
    for slug, line in expected.items():
        assert got[slug] == pytest.approx(line, abs=1e-3), slug


def test_a_new_pools_idle_chart_says_how_much_history_it_still_needs(scene: Any, page: Any) -> None:
    """A fresh plane (the demo's first minutes): no idle-GPU model, a few minutes of cycles. The chart
    draws the actuals and says in words how much history the model needs, how much there is, and from
    when forecasts can start; it draws no forecast line and makes none up."""
    from apps.forecasting.models import ForecastModel

    w = scene.world
    assert not ForecastModel.objects.filter(pool=w.h100).exists()
    first = timezone.now() - timedelta(minutes=12)
    Cycle.objects.filter(pk=scene.cycle.pk).update(started_at=first, finished_at=first)
    body = page(w.root).get(f"/pools/{w.h100.pk}/history/?hours=1").content.decode()
    idle_note = r'id="chart-idle".*?<p class="chart-note" role="note">(.*?)</p>'
    note = re.search(idle_note, body, re.S)
    assert note, "the idle chart has its note"
    ready = first + timedelta(days=3)
    assert note.group(1) == (
        "No forecast yet: the idle-GPU model needs 3 days of this pool&#x27;s cycle history and has 12 "
        f"minutes (since {first:%Y-%m-%d %H:%M} UTC), 2 days 23 hours more. Forecasts can start after "
        f"{ready:%Y-%m-%d %H:%M} UTC, with the first training after that (every 24 hours)."
    )
    idle = body[body.index('id="chart-idle"') :]
    idle = idle[: idle.index("</section>")]
    assert "line-2" not in idle.split("<details>")[0].split("</svg>")[0]  # no forecast polyline


def test_the_idle_chart_note_once_there_is_enough_history_and_without_any_cycle(scene: Any) -> None:
    from apps.dashboard.history import idle_forecast_note

    w = scene.world
    now = timezone.now()
    assert "no cycle has run yet" in idle_forecast_note(pool_id=w.l4.pk, now=now)
    Cycle.objects.filter(pk=scene.cycle.pk).update(started_at=now - timedelta(days=4))
    note = idle_forecast_note(pool_id=w.h100.pk, now=now)
    assert note.startswith("No forecast yet: the pool has 4 days of cycle history, enough to train on")


def test_submissions_are_drawn_beside_the_arrivals_models_forecast(scene: Any) -> None:
    """Three days of submissions every ten minutes; with an active arrivals model every bin of the last
    six hours and the next hour has a forecast, made before the bin from what was submitted before."""
    import numpy as np

    from apps.forecasting.models import ForecastModel
    from apps.forecasting.selectors import pool_arrivals_beside
    from whalegen.forecast.arrivals import ArrivalConfig, train_arrivals

    w = scene.world
    now = timezone.now().replace(minute=35, second=0, microsecond=0)
    Task.objects.update(created_at=now - timedelta(days=30))  # the scene's own tasks: out of the window
    without = pool_arrivals_beside(pool_id=w.h100.pk, now=now)
    assert "no active arrivals model" in without.reason and all(f is None for f in without.forecast)
    offsets = np.arange(1, 3 * 24 * 6) * 600.0
    tasks = Task.objects.bulk_create(
        Task(tenant=w.tenant_a, queue=w.queue_a, pool=w.h100, priority=0, gpu_count=1, gpu_milli=1000)
        for _ in offsets
    )
    for task, offset in zip(tasks, offsets, strict=True):
        task.created_at = now - timedelta(seconds=float(offset) - 1)
    Task.objects.bulk_update(tasks, ["created_at"])
    counted_in_the_database = pool_arrivals_beside(pool_id=w.h100.pk, now=now)  # still no model
    times = np.asarray([t.created_at.timestamp() for t in tasks])
    labels = ["gpu_count=1|gpu_milli=1000"] * len(tasks)
    model = train_arrivals(times, labels, ArrivalConfig(), now.timestamp(), rounds=30)
    ForecastModel.objects.create(
        kind="arrivals", pool=w.h100, scope=ForecastModel.scope_of(w.h100, None), version=3,
        state="active", blob=model.to_bytes(), metrics={}, train_start=now - timedelta(days=3),
        train_end=now, validation_start=now, validation_end=now, trained_at=now, promoted_at=now,
        decision_reason="stored as active by the test",
    )  # fmt: skip
    beside = pool_arrivals_beside(pool_id=w.h100.pk, now=now)
    assert beside.reason == "" and beside.model_version == 3 and beside.bin_s == 600
    # From the whole hour six hours back (12:00 for 18:35) to an hour after the current bin (19:30).
    assert len(beside.starts) == 45 and f"{beside.starts[0]:%M}" == "00"
    assert beside.actual[-5:] == (None,) * 5  # the bins still to come
    assert beside.actual[-6] == 0.0  # the current bin: nothing submitted in its first five minutes
    assert all(a == 1.0 for a in beside.actual[:-6])  # one submission per ten minutes
    assert all(f is not None and 0.3 < f < 3.0 for f in beside.forecast)
    # Without a model the window is counted per minute in the database: the same bars.
    assert counted_in_the_database.actual == beside.actual


def test_idle_gpus_are_drawn_beside_the_idle_models_forecast(scene: Any, page: Any) -> None:
    """Four days of cycles and the pool's idle-GPU model as the plane trains it: every bin of the last
    six hours and the next hour has a forecast made an hour before it, close to what happened; what was
    recorded after a forecast's origin does not change it."""
    from apps.forecasting import selectors
    from apps.forecasting.selectors import pool_idle_beside
    from tests.apps.dashboard.idle import trained_idle_model

    w = scene.world
    Cycle.objects.filter(pool=w.h100).delete()
    now = timezone.now().replace(minute=35, second=0, microsecond=0)
    without = pool_idle_beside(pool=w.h100, now=now)
    assert "no active idle-GPU model" in without.reason and all(f is None for f in without.forecast)
    model = trained_idle_model(w.h100, now=now)
    beside = pool_idle_beside(pool=w.h100, now=now)
    assert beside.reason == "" and beside.model_version == model.version and beside.bin_s == 600
    # From the whole hour six hours back to an hour after the current bin: 45 bins of ten minutes.
    assert len(beside.starts) == 45 and f"{beside.starts[0]:%M}" == "00"
    assert beside.actual[-5:] == (None,) * 5  # the bins still to come
    assert all(a is not None and 0.0 <= a <= 16.0 for a in beside.actual[:-5])  # a cycle every 5 minutes
    assert all(f is not None for f in beside.forecast)
    errors = [abs(f - a) for f, a in zip(beside.forecast, beside.actual, strict=True) if a is not None]
    assert sum(errors) / len(errors) < 2.0  # the daily rhythm spans 12 GPUs; noise is 0.7
    # A forecast made at an origin uses bins up to it only: raise the last half hour, forecast again.
    Cycle.objects.filter(pool=w.h100, started_at__gte=now - timedelta(minutes=30)).update(
        stats={"fragmentation_before": {"idle_milli": 40_000, "frag_milli": 0.0, "amount_pct": 0.0}}
    )
    selectors._IDLE_CACHE.clear()
    again = pool_idle_beside(pool=w.h100, now=now)
    changed_from = now.replace(minute=0)  # the bin holding the first raised cycle (hh:05)
    for start, first, second in zip(beside.starts, beside.forecast, again.forecast, strict=True):
        if start < changed_from + timedelta(hours=1):  # its origin lies before the change
            assert second == pytest.approx(first), start
    assert again.forecast[-1] != pytest.approx(beside.forecast[-1])  # the newest origin saw the change
    # The page draws it, line and table.
    body = page(w.root).get(f"/pools/{w.h100.pk}/history/?hours=6").content.decode()
    assert 'id="chart-idle"' in body and f"forecast 60 min ahead (model v{model.version})" in body
