"""A GPU's compute units and partition mode are shown in the admin but never edited there: the scheduler
binds units as they were cut (equal shares, MIG layouts from the model's table), so a share resized by
hand would make the engine's picture of the GPU wrong."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.inventory.models import ComputeUnit, Gpu
from apps.inventory.services import gpu_add
from tests.apps.factories import NodeFactory, UserFactory


def admin_client() -> Client:
    client = Client()
    client.force_login(UserFactory(username="root-admin", is_staff=True, is_superuser=True))
    return client


@pytest.mark.django_db
def test_the_gpu_page_shows_its_units_without_a_field_to_change_them() -> None:
    gpu = gpu_add(node=NodeFactory(), index=0, model="H100-80GB", partition_mode="mps", mps_shares=4)
    page = admin_client().get(f"/admin/inventory/gpu/{gpu.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert body.count("<p>MPS share</p>") == 4  # each unit is listed, as text
    assert 'name="units-0-gpu_milli"' not in body
    assert 'name="units-0-DELETE"' not in body
    assert 'name="partition_mode"' not in body
    assert "units-empty" not in body  # no blank unit to add


@pytest.mark.django_db
def test_a_posted_unit_size_or_mode_changes_nothing() -> None:
    gpu = gpu_add(node=NodeFactory(), index=0, model="H100-80GB", partition_mode="mps", mps_shares=2)
    units = list(ComputeUnit.objects.filter(gpu=gpu))
    form = {
        "uuid": gpu.uuid, "model": gpu.model, "node": gpu.node_id, "index": gpu.index,
        "mem_mib": gpu.mem_mib, "health": gpu.health, "partition_mode": Gpu.PartitionMode.WHOLE,
        "units-TOTAL_FORMS": "2", "units-INITIAL_FORMS": "2", "units-MIN_NUM_FORMS": "0",
        "units-MAX_NUM_FORMS": "1000",
    }  # fmt: skip
    for i, unit in enumerate(units):
        form |= {
            f"units-{i}-id": unit.pk, f"units-{i}-gpu": gpu.pk, f"units-{i}-kind": unit.kind,
            f"units-{i}-mps_thread_pct": unit.mps_thread_pct, f"units-{i}-mem_mib": unit.mem_mib,
            f"units-{i}-gpu_milli": "900",
        }  # fmt: skip
    answer = admin_client().post(f"/admin/inventory/gpu/{gpu.pk}/change/", form)
    assert answer.status_code == 403  # the GPU page is view-only: a GPU is its agent's (issue #38)
    gpu.refresh_from_db()
    assert gpu.partition_mode == Gpu.PartitionMode.MPS
    assert sorted(ComputeUnit.objects.filter(gpu=gpu).values_list("gpu_milli", flat=True)) == [500, 500]
