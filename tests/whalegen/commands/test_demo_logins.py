"""Each demo start prints fresh logins; the tokens an earlier start printed stop working then, as its
passwords do (an old terminal's output must not keep opening the plane)."""

from __future__ import annotations

import pytest

from apps.tenants.models import ApiToken, TokenAudit
from apps.tenants.services import token_authenticate
from whalegen.commands import demo

pytestmark = pytest.mark.django_db


def test_a_second_start_revokes_the_tokens_the_first_printed_and_audits_it() -> None:
    assert demo.seed()
    _, _, first = demo.logins()
    _, _, second = demo.logins()
    assert [(slug, member) for slug, member, _ in first] == [(slug, member) for slug, member, _ in second]
    assert all(token_authenticate(raw=raw) is None for _, _, raw in first)
    assert all(token_authenticate(raw=raw) is not None for _, _, raw in second)
    assert ApiToken.objects.filter(name="demo", revoked_at__isnull=True).count() == len(second)
    revoked = TokenAudit.objects.filter(action=TokenAudit.Action.REVOKED)
    assert revoked.count() == len(first)
