"""The API tokens page in a real browser (tests/apps/dashboard/test_browser.py says how): a member
makes a token, copies its secret from the one page that shows it, and revokes it."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.tenants.models import ApiToken
from tests.apps.dashboard.test_browser import browser, click_through, log_in  # noqa: F401 (a fixture)

pytestmark = pytest.mark.browser


def _status(raw: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client.get("/api/v1/tasks/").status_code


def test_member_makes_a_token_sees_it_once_and_revokes_it(live_server: Any, scene: Any, browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    log_in(browser, live_server, scene.world.alice, "alice-browser-pass")
    click_through(browser, browser.find_element(By.LINK_TEXT, "API tokens"))
    browser.find_element(By.ID, "id_name").send_keys("gitlab")
    Select(browser.find_element(By.ID, "id_role")).select_by_value("viewer")
    click_through(browser, browser.find_element(By.ID, "make-token"))

    secret = browser.find_element(By.ID, "new-token-secret").text
    token = ApiToken.objects.get(name="gitlab")
    assert secret.startswith(token.prefix) and token.role == "viewer"
    assert _status(secret) == 200

    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-token="{token.pk}"]')
    assert row.find_element(By.CSS_SELECTOR, ".state").text == "active"
    click_through(browser, row.find_element(By.ID, f"revoke-{token.pk}"))
    message = browser.find_element(By.CSS_SELECTOR, ".messages .msg").text
    assert message == f"Token {token.prefix}… (gitlab) revoked."
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-token="{token.pk}"]')
    assert row.find_element(By.CSS_SELECTOR, ".state").text == "revoked"
    browser.implicitly_wait(0)  # the page is loaded: look once for what must be gone
    assert not browser.find_elements(By.ID, "new-token-secret")
    assert not row.find_elements(By.ID, f"revoke-{token.pk}")
    assert _status(secret) == 401
