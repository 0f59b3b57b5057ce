"""Changing and deleting tenants and memberships: a team holds no tenant, a tenant with history stays, and
every change forgets the callers' remembered access."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from apps.common.errors import Conflict
from apps.tenants.models import Membership, Tenant
from apps.tenants.services import membership_remove, tenant_delete, tenant_delete_refusal, tenant_update
from tests.apps.factories import MembershipFactory, QueueFactory, TaskFactory, TenantFactory

pytestmark = pytest.mark.django_db


def test_a_tenant_moves_under_an_org_but_never_under_a_team() -> None:
    org = TenantFactory(kind=Tenant.Kind.ORG)
    team = TenantFactory(kind=Tenant.Kind.TEAM)
    tenant = TenantFactory()
    with pytest.raises(Conflict, match=f"tenant {team.slug!r} is a team; teams cannot hold tenants"):
        tenant_update(tenant=tenant, values={"parent": team})
    tenant_update(tenant=tenant, values={"parent": org, "name": "Vision", "slug": "ignored"})
    tenant.refresh_from_db()
    assert (tenant.parent_id, tenant.name, tenant.slug != "ignored") == (org.pk, "Vision", True)


def test_a_tenant_with_tasks_or_queues_refuses_deletion_and_an_empty_one_goes() -> None:
    queue = QueueFactory()
    assert tenant_delete_refusal(queue.tenant) == (
        f"tenant {queue.tenant.slug!r} still has 1 queue; remove them first"
    )
    TaskFactory(queue=queue)
    assert tenant_delete_refusal(queue.tenant) == f"tenant {queue.tenant.slug!r} has 1 task (history is kept)"
    empty = TenantFactory()
    MembershipFactory(tenant=empty)
    assert tenant_delete_refusal(empty) == ""
    tenant_delete(tenant=empty)
    assert not Tenant.objects.filter(pk=empty.pk).exists()
    assert not Membership.objects.filter(tenant_id=empty.pk).exists()


def test_removing_a_membership_leaves_the_user() -> None:
    membership = MembershipFactory()
    membership_remove(membership=membership)
    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert get_user_model().objects.filter(pk=membership.user_id).exists()
