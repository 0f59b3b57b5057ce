"""The dashboard in a real browser: Debian's chromium driven by Selenium against pytest-django's live
server. `scripts/test` installs chromium and chromedriver first (scripts/browser); without them these
tests fail with that hint rather than skip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.approvals.models import PriorityOverride
from apps.approvals.services import override_request
from apps.workloads.models import Task

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 20  # generous: the machine may be busy; the waits end as soon as the page is there


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    assert not missing, f"{', '.join(missing)} missing: run scripts/browser (apt-get install chromium)"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.implicitly_wait(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def _left(old: Any) -> Any:
    """A wait condition: the page `old` (its `html` element) is gone.

    Selenium's `staleness_of` asks the old element something and counts only "stale" as gone; while the
    page is being replaced, chromedriver may instead answer that the node "does not belong to the
    document" (an inspector error, seen on a busy machine), which means the same."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    def gone(_: Any) -> bool:
        try:
            old.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as error:
            if "does not belong to the document" in str(error):
                return True
            raise
        return False

    return gone


def click_through(browser: Any, element: Any) -> None:
    """Click a link or a submit button and wait until the browser has left the page it was on.

    Without the wait, the next lookup can answer from the old page: an element both pages have (an
    `h1`, an empty result part) is found at once, and goes stale when the new page arrives."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = browser.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(browser, WAIT_S).until(_left(old))


def go_back(browser: Any) -> None:
    """The browser's back button, waiting until the previous page is the one shown."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = browser.find_element(By.TAG_NAME, "html")
    browser.back()
    WebDriverWait(browser, WAIT_S).until(_left(old))


def log_in(browser: Any, live_server: Any, user: Any, password: str) -> None:
    from selenium.webdriver.common.by import By

    user.set_password(password)
    user.save()
    browser.get(f"{live_server.url}/")  # anonymous: sent to the login page
    assert "/login/" in browser.current_url
    browser.find_element(By.ID, "id_username").send_keys(user.get_username())
    browser.find_element(By.ID, "id_password").send_keys(password)
    click_through(browser, browser.find_element(By.CSS_SELECTOR, "form button[type=submit]"))
    assert browser.current_url == f"{live_server.url}/"


def test_member_sees_quota_and_why_pending_and_cancels(live_server: Any, scene: Any, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, live_server, scene.world.alice, "alice-browser-pass")
    # The H100 quota bar: the placed task fills part of the guarantee, drawn with a real width.
    bar = browser.find_element(By.CSS_SELECTOR, 'tr.quota[data-pool="h100-train"] .bar .within')
    assert bar.size["width"] > 0
    assert browser.find_element(By.CSS_SELECTOR, 'tr.quota[data-pool="h100-train"] .in-use').text == "1"

    click_through(browser, browser.find_element(By.LINK_TEXT, "Tasks"))
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-task="{scene.waiting.pk}"]')
    assert row.find_element(By.CSS_SELECTOR, ".state").text == "pending"
    assert row.find_element(By.CSS_SELECTOR, "td.why").text == scene.waiting.why_pending

    click_through(browser, row.find_element(By.LINK_TEXT, "big-run"))
    browser.find_element(By.ID, "id_reason").send_keys("superseded by a smaller run")
    click_through(browser, browser.find_element(By.ID, "cancel-task"))
    message = browser.find_element(By.CSS_SELECTOR, ".messages .msg")
    assert message.text == f"Task {scene.waiting.pk} cancelled."
    assert browser.find_element(By.ID, "task-state").text == "cancelled"
    browser.implicitly_wait(0)  # the page is loaded: look once for the button that must be gone
    assert not browser.find_elements(By.ID, "cancel-task")
    scene.waiting.refresh_from_db()
    assert scene.waiting.state == Task.State.CANCELLED


def test_admin_approves_an_override(live_server: Any, scene: Any, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    w = scene.world
    override = override_request(
        tenant=w.tenant_a, task=scene.waiting, wanted_priority=40, reason="launch demo", requested_by=w.alice
    )
    log_in(browser, live_server, w.root, "root-browser-pass")
    click_through(browser, browser.find_element(By.LINK_TEXT, "Overrides"))
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-override="{override.pk}"]')
    assert "launch demo" in row.text
    row.find_element(By.CSS_SELECTOR, "input[name=comment]").send_keys("go")
    click_through(browser, row.find_element(By.ID, f"approve-{override.pk}"))
    assert browser.find_element(By.CSS_SELECTOR, ".messages .msg").text == f"Override {override.pk} approved."
    decided = browser.find_element(By.CSS_SELECTOR, f'tr[data-override="{override.pk}"] .state')
    assert decided.text == "approved"
    override.refresh_from_db()
    scene.waiting.refresh_from_db()
    assert (override.state, scene.waiting.priority) == (PriorityOverride.State.APPROVED, 40)


def test_task_page_shows_the_run_and_its_output_tail_live(live_server: Any, scene: Any, browser: Any) -> None:
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from apps.fleet.reports import agent_report
    from whalegen import protocol as p

    task = scene.placed
    Task.objects.filter(pk=task.pk).update(
        command=["python", "train.py", "--epochs", "3"], env={"HF_TOKEN": "s3cret-value", "SEED": "7"}
    )
    node = task.assignments.get().node
    out, err = p.LogStreamName.STDOUT, p.LogStreamName.STDERR

    def send(seq: int, chunk: p.LogChunk, *tasks: p.TaskReport) -> None:
        agent_report(node=node, message=p.Report(str(node.pk), seq, time.time(), tasks=tasks, logs=(chunk,)))

    running = p.TaskReport(str(task.pk), p.TaskState.RUNNING, time.time(), pid=7)
    first = tuple(p.LogLine(time.time(), out, f"epoch 1 step {i}") for i in range(300))
    send(
        1,
        p.LogChunk(str(task.pk), 0, 0, (*first, p.LogLine(time.time(), err, "warning: slow disk"))),
        running,
    )

    log_in(browser, live_server, scene.world.alice, "alice-browser-pass")
    browser.get(f"{live_server.url}/tasks/{task.pk}/")
    assert browser.find_element(By.ID, "task-command").text == "python train.py --epochs 3"
    env_keys = browser.find_element(By.ID, "task-env-keys").text
    assert "HF_TOKEN" in env_keys and "SEED" in env_keys and "s3cret-value" not in browser.page_source
    tail = browser.find_element(By.ID, "log-tail")
    lines = tail.find_elements(By.CSS_SELECTOR, ".line")
    assert len(lines) == 200  # the tail, not the head
    assert lines[-2].text == "epoch 1 step 299"
    assert lines[-1].text == "warning: slow disk" and "stderr" in lines[-1].get_attribute("class")
    # The page loads without an error in the browser's console (a missing favicon was one).
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    # The page follows the run: a line the agent ships now appears without a reload.
    send(2, p.LogChunk(str(task.pk), 0, 301, (p.LogLine(time.time(), out, "epoch 2 done"),)))
    WebDriverWait(browser, WAIT_S).until(lambda b: "epoch 2 done" in b.find_element(By.ID, "log-tail").text)

    # It ends failed: the page says why, and the failed task's row in the list says it in one line.
    ended = p.TaskReport(str(task.pk), p.TaskState.FAILED, time.time(), exit_code=3)
    send(
        3,
        p.LogChunk(
            str(task.pk),
            0,
            302,
            (p.LogLine(time.time(), p.LogStreamName.LAUNCHER, "exited with code 3"),),
            eof=True,
        ),
        ended,
    )
    browser.get(f"{live_server.url}/tasks/{task.pk}/")
    assert browser.find_element(By.ID, "task-exit-code").text == "3"
    assert browser.find_element(By.ID, "task-failure-reason").text == "exit code 3"
    assert (
        browser.find_elements(By.CSS_SELECTOR, "#log-tail .line")[-1].text == "[whalegen] exited with code 3"
    )
    click_through(browser, browser.find_element(By.LINK_TEXT, "Tasks"))
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-task="{task.pk}"]')
    assert row.find_element(By.CSS_SELECTOR, "td.why").text == "exit code 3"


def screenshot(browser: Any, name: str) -> Path:
    """Save the page as it looks now; the path is printed so a reader of the test log can open it."""
    import os
    import tempfile

    folder = Path(os.environ.get("WHALEGEN_SCREENSHOT_DIR") or Path(tempfile.gettempdir()) / "whalegen-shots")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    browser.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def test_operator_sees_the_fleet_live_and_asks_what_another_policy_would_do(
    live_server: Any, scene: Any, browser: Any, settings: Any, monkeypatch: Any
) -> None:
    from django.utils import timezone
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from apps.scheduling.models import Assignment

    w = scene.world
    log_in(browser, live_server, w.root, "root-fleet-pass")
    # The home page opens with the fleet: the H100 pool has idle capacity and pending work at once.
    row = browser.find_element(By.CSS_SELECTOR, 'tr.fleet-pool[data-pool="h100-train"]')
    assert "attention" in row.get_attribute("class")
    assert "no free GPU, CPU or memory that fits" in row.text
    screenshot(browser, "fleet-overview")

    # The pool page refreshes its heat-map in place: free the whole GPU, and the cell turns idle
    # without a navigation (the marker set on this page survives).
    click_through(browser, row.find_element(By.LINK_TEXT, "h100-train"))
    browser.find_element(By.ID, "heatmap")
    browser.execute_script("window.__stillThisPage = true;")
    assert browser.find_elements(By.CSS_SELECTOR, 'g.gpu[data-allocated="1000"]')
    Assignment.objects.filter(task=scene.placed, released_at__isnull=True).update(released_at=timezone.now())
    WebDriverWait(browser, WAIT_S).until(
        lambda b: not b.find_elements(By.CSS_SELECTOR, 'g.gpu[data-allocated="1000"]')
    )
    assert browser.execute_script("return window.__stillThisPage === true;")
    # The legend's entries hold together at laptop width: no entry spans two lines.
    browser.set_window_size(1280, 800)
    heights = browser.execute_script(
        "return Array.from(document.querySelectorAll('.legend .item'))"
        ".map(i => [i.innerText, i.getBoundingClientRect().height]);"
    )
    assert heights, "the legend has entries"
    for text, height in heights:
        assert height < 24, f"legend entry wraps: {text!r}"
    screenshot(browser, "pool-live")

    # History: the pool's charts over the last hours, each with its numbers as a table.
    click_through(browser, browser.find_element(By.ID, "history-link"))
    # Read in one script: the charts are a live part, swapped every few seconds, so an element found
    # in one call may be gone by the next.
    keys = browser.execute_script(
        "return Array.from(document.querySelectorAll('section.chart')).map(c => c.dataset.chart);"
    )
    assert keys == ["allocation", "fragmentation", "pending", "tenants", "wait", "arrivals", "idle"]
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-allocation polyline.series")
    # A pool minutes old has no idle-GPU model: the chart says what it still needs, in words.
    note = browser.execute_script("return document.querySelector('#chart-idle .chart-note').innerText;")
    assert note.startswith("No forecast yet: the idle-GPU model needs 3 days of this pool's cycle history")
    assert "Forecasts can start after" in note
    screenshot(browser, "pool-history")
    browser.execute_script("document.getElementById('chart-idle').scrollIntoView();")
    screenshot(browser, "pool-history-idle-note")
    go_back(browser)

    # What-if: another policy's decision for this pool now, beside the cycle's own; read-only. It is
    # decided off the request (on the embedded default, a thread of the web process): the page answers
    # at once, computing, and its live part swaps the decision in without a navigation.
    import threading

    from apps.dashboard import whatif

    settings.CELERY_TASK_ALWAYS_EAGER = True
    # The decision waits until the test has seen the page computing: on a busy machine it could otherwise
    # be swapped in before the first look.
    looked = threading.Event()
    decide_now = whatif.decide_now

    def after_the_first_look(**kwargs: Any) -> Any:
        looked.wait(WAIT_S)
        return decide_now(**kwargs)

    monkeypatch.setattr(whatif, "decide_now", after_the_first_look)
    click_through(browser, browser.find_element(By.ID, "whatif-link"))
    browser.find_element(By.CSS_SELECTOR, "#id_policy option[value=fgd]").click()
    click_through(browser, browser.find_element(By.CSS_SELECTOR, "#whatif-form button"))
    result = browser.find_element(By.ID, "whatif-result")
    assert result.get_attribute("data-state") == "computing"
    assert "Computing…" in result.text
    screenshot(browser, "whatif-computing")
    browser.execute_script("window.__stillWhatIf = true;")
    looked.set()
    WebDriverWait(browser, WAIT_S).until(
        lambda b: b.find_element(By.ID, "whatif-result").get_attribute("data-state") == "ready"
    )
    assert browser.execute_script("return window.__stillWhatIf === true;")  # swapped in, not reloaded
    fgd = browser.find_element(By.CSS_SELECTOR, 'section.whatif[data-policy="fgd"]')
    assert "big-run" in fgd.text
    assert browser.find_element(By.CSS_SELECTOR, 'section.whatif[data-policy="whalegen"]')
    assert "Computing…" not in browser.find_element(By.ID, "whatif-result").text
    screenshot(browser, "whatif")

    # A page that does not exist is a styled page at tablet width, with a way back.
    browser.set_window_size(820, 1000)
    browser.get(f"{live_server.url}/tasks/999999/")
    assert browser.find_element(By.CSS_SELECTOR, "#error-page h1").text == "Not found"
    assert browser.find_element(By.LINK_TEXT, "Back to the overview")
    screenshot(browser, "not-found-tablet")
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert all("999999" in m for m in severe), severe  # only the 404 itself


def test_pool_history_draws_idle_gpus_beside_their_forecast(
    live_server: Any, scene: Any, browser: Any
) -> None:
    """With the pool's idle-GPU model trained by the plane's training step, the history page draws the
    actual idle GPUs and the hour-ahead forecast as two lines, with their numbers in a table."""
    from datetime import timedelta

    from django.utils import timezone
    from selenium.webdriver.common.by import By

    from apps.scheduling.models import Cycle
    from tests.apps.dashboard.idle import trained_idle_model

    w = scene.world
    Cycle.objects.filter(pool=w.h100).delete()
    model = trained_idle_model(w.h100, now=timezone.now() - timedelta(seconds=1))
    log_in(browser, live_server, w.root, "root-idle-pass")
    browser.get(f"{live_server.url}/pools/{w.h100.pk}/history/?hours=6")
    chart = browser.find_element(By.ID, "chart-idle")
    assert "Idle GPUs: actual and forecast" in chart.text
    assert f"forecast 60 min ahead (model v{model.version})" in chart.text
    actual = chart.find_elements(By.CSS_SELECTOR, "polyline.series.line-1")
    forecast = chart.find_elements(By.CSS_SELECTOR, "polyline.series.line-2")
    assert actual and forecast, "both lines are drawn"

    # The forecast runs an hour past the last actual point: it ends further right.
    def right(lines: list[Any]) -> float:
        return max(float(p.split(",")[0]) for line in lines for p in line.get_attribute("points").split())

    assert right(forecast) > right(actual)
    chart.find_element(By.CSS_SELECTOR, "details summary").click()
    rows = chart.find_elements(By.CSS_SELECTOR, "table.chart-table tbody tr")
    assert len(rows) >= 40  # six hours and the next of ten-minute bins, each with its figures
    browser.execute_script("arguments[0].scrollIntoView();", chart)
    screenshot(browser, "pool-history-idle-forecast")


def test_error_pages_in_the_browser_are_styled_and_say_what_happened(
    live_server: Any, scene: Any, browser: Any, monkeypatch: Any
) -> None:
    """The 403 a stale form meets (Django's CSRF refusal, which was Django's bare page) and the 500 of a
    failing page, as a browser shows them: styled, one sentence, a way back, and nothing changed."""
    from selenium.webdriver.common.by import By

    from apps.dashboard import views

    w = scene.world
    log_in(browser, live_server, w.alice, "alice-errors-pass")
    browser.get(f"{live_server.url}/tasks/{scene.waiting.pk}/")
    browser.find_element(By.ID, "id_reason").send_keys("stale form")
    # The session changed since the page was drawn (a sign-in elsewhere, an expired cookie): the form's
    # token no longer matches.
    browser.execute_script(
        "document.querySelectorAll('input[name=csrfmiddlewaretoken]')"
        ".forEach(i => { i.value = 'x'.repeat(64); });"
    )
    click_through(browser, browser.find_element(By.ID, "cancel-task"))
    assert browser.find_element(By.CSS_SELECTOR, "#error-page h1").text == "Form out of date"
    assert "Nothing was changed" in browser.find_element(By.ID, "error-page").text
    assert browser.find_element(By.LINK_TEXT, "Back to the overview")
    screenshot(browser, "forbidden-stale-form")
    scene.waiting.refresh_from_db()
    assert scene.waiting.state == Task.State.PENDING

    def broken(**_: Any) -> Any:
        raise RuntimeError("the accounting read failed")

    monkeypatch.setattr(views, "tenant_months", broken)
    browser.get(f"{live_server.url}/accounting/")
    page = browser.find_element(By.ID, "error-page")
    assert "Something went wrong on our side" in page.text and "the accounting read failed" not in page.text
    assert browser.find_element(By.CSS_SELECTOR, "link[rel=stylesheet]")  # styled like the rest
    screenshot(browser, "server-error")
