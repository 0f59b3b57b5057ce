"""The what-if decision off the request, for real: through the Redis broker to a real Celery worker, and
on the embedded default's thread. The page answers at once either way and shows the decision once it is
stored (the browser test watches the live refresh swap it in)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.conf import settings

WAIT_S = 120  # the machine may be busy; the loops end as soon as the answer is there


def _until_ready(client: Any, path: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        body = client.get(path).content.decode()
        if 'data-state="ready"' in body:
            return body
        assert 'data-state="computing"' in body, body[-2000:]
        time.sleep(0.2)
    raise AssertionError(f"the what-if was not decided within {WAIT_S} s")


@pytest.mark.django_db(transaction=True)
def test_the_whatif_is_decided_on_a_worker_through_redis(scene: Any, page: Any) -> None:
    from celery.contrib.testing.worker import start_worker

    from whalegen.config.celery import app

    assert settings.CELERY_BROKER_URL.startswith("redis://"), "run with REDIS_URL set: this test needs Redis"
    assert not app.conf.task_always_eager
    app.control.purge()  # messages of earlier runs name pools of a test database that is gone
    w = scene.world
    client = page(w.root)
    path = f"/pools/{w.h100.pk}/whatif/?policy=fgd"
    started = time.perf_counter()
    assert "Computing…" in client.get(path).content.decode()  # no worker yet: the page does not wait
    assert time.perf_counter() - started < 5
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=60):
        body = _until_ready(client, path)
    assert 'data-policy="whalegen"' in body and 'data-policy="fgd"' in body and "big-run" in body


@pytest.mark.django_db(transaction=True)
def test_the_embedded_default_decides_on_a_thread_of_the_web_process(
    scene: Any, page: Any, settings: Any
) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True  # what the embedded default runs with (no broker)
    w = scene.world
    client = page(w.root)
    path = f"/pools/{w.h100.pk}/whatif/?policy=fgd"
    assert "Computing…" in client.get(path).content.decode()
    body = _until_ready(client, path)
    assert "big-run" in body and 'data-policy="fgd"' in body
