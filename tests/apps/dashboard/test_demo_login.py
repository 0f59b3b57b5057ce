"""The demo prints logins for the dashboard: the admin's and one the team members share. Both work."""

from __future__ import annotations

from typing import Any

import pytest

from apps.tenants.models import Membership
from whalegen.commands.demo import ADMIN_USERNAME, TEAMS, logins, seed

pytestmark = pytest.mark.django_db


def test_the_printed_demo_logins_open_the_dashboard(page: Any) -> None:
    assert seed()
    admin_password, member_password, tokens = logins()
    assert [(slug, member) for slug, member, _ in tokens] == TEAMS

    slug, member = TEAMS[0]
    client = page()
    response = client.post("/login/", {"username": member, "password": member_password}, follow=True)
    assert response.status_code == 200 and response.redirect_chain == [("/", 302)]
    body = response.content.decode()
    assert f'<span class="muted">{slug}</span>' in body
    assert f'<span class="muted">{TEAMS[1][0]}</span>' not in body
    assert Membership.objects.get(user__username=member).role == Membership.Role.MEMBER

    admin = page()
    response = admin.post("/login/", {"username": ADMIN_USERNAME, "password": admin_password}, follow=True)
    assert response.redirect_chain == [("/", 302)]
    assert all(f'<span class="muted">{s}</span>' in response.content.decode() for s, _ in TEAMS)
