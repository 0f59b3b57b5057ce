"""Deletes in the admin, where the database no longer guards them: an assignment's task and node and a
task event's task carry no foreign-key constraint (the cycle's commit checked ~34,000 of them at every
COMMIT). A task is never deleted; a node is deleted only under its lock, so an assignment committed while
the delete waited still protects it."""

from __future__ import annotations

import re
import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.test import Client

from apps.inventory.models import Node
from apps.scheduling.models import Assignment
from apps.workloads.models import Task
from tests.apps.factories import NodeFactory, TaskFactory, UserFactory


def admin_client() -> Client:
    root = UserFactory(username="root-admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(root)
    return client


@pytest.mark.django_db
def test_a_task_cannot_be_deleted_in_the_admin() -> None:
    task = TaskFactory()
    client = admin_client()
    assert client.get(f"/admin/workloads/task/{task.pk}/delete/").status_code == 403
    assert client.post(f"/admin/workloads/task/{task.pk}/delete/", {"post": "yes"}).status_code == 403
    page = client.get("/admin/workloads/task/")
    assert page.status_code == 200 and b"delete_selected" not in page.content
    assert Task.objects.filter(pk=task.pk).exists()


@pytest.mark.django_db
def test_a_node_without_assignments_is_deleted_and_one_with_an_assignment_is_kept() -> None:
    client = admin_client()
    spare = NodeFactory()
    answer = client.post(f"/admin/inventory/node/{spare.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302 and not Node.objects.filter(pk=spare.pk).exists()

    used = NodeFactory()
    Assignment.objects.create(task=TaskFactory(), node=used)
    answer = client.post(f"/admin/inventory/node/{used.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 200 and b"protected" in answer.content
    assert Node.objects.filter(pk=used.pk).exists()
    assert b"delete_selected" not in client.get("/admin/inventory/node/").content


@pytest.mark.django_db(transaction=True)
def test_an_assignment_committed_while_the_delete_waited_keeps_its_node() -> None:
    """The cycle's commit holds the node locked while it writes an assignment on it; an operator's delete
    of that node, sent meanwhile, waits for the lock and then sees the assignment."""
    if connection.vendor != "postgresql":
        pytest.fail("the delete race must run on PostgreSQL (set DATABASE_URL)")
    node, task = NodeFactory(), TaskFactory()
    client = admin_client()
    locked, waiting = threading.Event(), threading.Event()

    def cycle_commit() -> None:
        try:
            with transaction.atomic():
                list(Node.objects.select_for_update().filter(pk=node.pk).values_list("pk", flat=True))
                locked.set()
                waiting.wait(10)
                Assignment.objects.create(task=task, node=node)
        finally:
            connections.close_all()

    committer = threading.Thread(target=cycle_commit)
    committer.start()
    assert locked.wait(10)

    def watch_for_the_wait() -> None:
        # The delete is waiting once a backend other than the committer's waits on a lock.
        with connections["default"].cursor() as cursor:
            for _ in range(200):
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND pid <> pg_backend_pid()"
                )
                if cursor.fetchone()[0]:
                    break
                time.sleep(0.05)
        connections.close_all()
        waiting.set()

    watcher = threading.Thread(target=watch_for_the_wait)
    watcher.start()
    answer = client.post(f"/admin/inventory/node/{node.pk}/delete/", {"post": "yes"})
    committer.join(10)
    watcher.join(10)
    assert answer.status_code == 200 and b"protected" in answer.content
    assert Node.objects.filter(pk=node.pk).exists()
    assert Assignment.objects.filter(node=node, task=task).exists()


@pytest.mark.django_db
def test_the_gpu_page_shows_which_task_holds_each_unit() -> None:
    """A unit stores no holder: the admin's GPU page reads it from the live assignments."""
    from apps.inventory.models import ComputeUnit, Gpu
    from apps.inventory.services import gpu_add
    from tests.apps.factories import hold

    gpu = gpu_add(
        node=NodeFactory(), index=0, model="L40S", partition_mode=Gpu.PartitionMode.MPS, mps_shares=4
    )
    second = ComputeUnit.objects.filter(gpu=gpu).order_by("pk")[1]
    task = TaskFactory()
    hold(task, [second])
    page = admin_client().get(f"/admin/inventory/gpu/{gpu.pk}/change/").content.decode()
    shown = re.findall(r'class="field-held_by">\s*<p>([^<]*)</p>', page)
    # The four units in order, then the inline's empty template row.
    assert shown[:4] == ["None", str(task.pk), "None", "None"]
