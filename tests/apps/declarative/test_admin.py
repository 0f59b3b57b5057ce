"""Item 4 of issue #38: the admin does not contradict the model. What the agent owns (GPUs and their
units) is view-only, nodes are not added by hand, and objects applied from a file show where from."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.declarative.services import objects_apply
from apps.inventory.models import Gpu
from apps.tenants.selectors import Access
from tests.apps.factories import UserFactory


@pytest.fixture
def admin_client(db) -> Client:
    client = Client()
    client.force_login(UserFactory(username="root-admin", is_staff=True, is_superuser=True))
    return client


@pytest.mark.parametrize(
    "path", ["/admin/inventory/gpu/add/", "/admin/inventory/node/add/", "/admin/declarative/gpuprice/add/"]
)
def test_nothing_the_agent_or_apply_owns_can_be_added_by_hand(admin_client: Client, path: str) -> None:
    assert admin_client.get(path).status_code == 403


def test_a_gpu_is_shown_but_not_changed_or_deleted(world, admin_client: Client) -> None:
    gpu = Gpu.objects.filter(node=world.node).first()
    page = admin_client.get(f"/admin/inventory/gpu/{gpu.pk}/change/")
    assert page.status_code == 200 and 'name="health"' not in page.content.decode()
    assert (
        admin_client.post(f"/admin/inventory/gpu/{gpu.pk}/change/", {"health": "unhealthy"}).status_code
        == 403
    )
    assert admin_client.post(f"/admin/inventory/gpu/{gpu.pk}/delete/", {"post": "yes"}).status_code == 403
    node_page = admin_client.get(f"/admin/inventory/node/{world.node.pk}/change/").content.decode()
    assert 'name="gpus-0-health"' not in node_page and "gpus-empty" not in node_page


def test_applied_objects_show_their_source_and_others_a_dash(world, admin_client: Client) -> None:
    document = {"kind": "Pool", "metadata": {"name": "from-file"}, "spec": {"runtime": "process"}}
    objects_apply(
        documents=[document], sources=["fleet.yaml#7"], access=Access(platform_admin=True), user=world.root
    )
    listing = admin_client.get("/admin/inventory/pool/").content.decode()
    assert "fleet.yaml#7" in listing
    hand_made = admin_client.get(f"/admin/inventory/pool/{world.h100.pk}/change/").content.decode()
    assert "applied from" in hand_made.lower()
    for path in ("/admin/tenants/tenant/", "/admin/workloads/queue/", "/admin/workloads/quota/",
                 "/admin/tenants/membership/", "/admin/accounting/budget/", "/admin/inventory/node/",
                 "/admin/declarative/appliedobject/"):  # fmt: skip
        assert admin_client.get(path).status_code == 200, path


def test_every_applied_kind_shows_the_applied_from_column(world, admin_client: Client) -> None:
    # The apps below declarative do not know it; its admin registers their admin classes again with the
    # column (apps/declarative/admin.py), so each list and each object's page must still show it.
    from apps.accounting.models import Budget

    Budget.objects.create(quota=world.quota_a, gpu_hours=10.0)  # an empty list shows no columns
    for path in ("/admin/tenants/tenant/", "/admin/workloads/queue/", "/admin/workloads/quota/",
                 "/admin/tenants/membership/", "/admin/accounting/budget/", "/admin/inventory/node/",
                 "/admin/inventory/cluster/", "/admin/inventory/pool/"):  # fmt: skip
        assert "applied from" in admin_client.get(path).content.decode().lower(), path
    page = admin_client.get(f"/admin/workloads/quota/{world.quota_a.pk}/change/").content.decode().lower()
    assert "applied from" in page and 'name="tenant"' not in page
