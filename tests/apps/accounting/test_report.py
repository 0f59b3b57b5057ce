"""GPU-hours against the hand-computed month (conftest), fractions, prices and history after a re-carve."""

from __future__ import annotations

import pytest

from apps.accounting.selectors import usage_report
from apps.tenants.selectors import Access
from tests.apps.accounting.conftest import DEC, JAN, NOV, NOW, VISION_DEC, VISION_NOV

ADMIN = Access(platform_admin=True)


def _hours(report) -> dict[tuple[str, ...], float]:
    return {tuple(row.keys.values()): row.gpu_hours for row in report.rows}


def test_the_month_boundary_splits_whole_mig_and_mps_hours_as_computed_by_hand(month) -> None:
    november = usage_report(access=ADMIN, start=NOV, end=DEC, now=NOW, group_by=["tenant"])
    december = usage_report(access=ADMIN, start=DEC, end=JAN, now=NOW, group_by=["tenant"])
    assert _hours(november) == {("vision",): pytest.approx(VISION_NOV, abs=1e-9)}
    assert _hours(december) == {
        ("audio",): pytest.approx(2.0, abs=1e-9),
        ("vision",): pytest.approx(VISION_DEC, abs=1e-9),
    }
    # Four vision tasks held GPUs in December (the preempted one counted once), three in November.
    assert [r.tasks for r in december.rows] == [1, 4]
    assert november.rows[0].tasks == 3


def test_the_range_cuts_assignments_at_its_edges(month) -> None:
    # 04:00 → 06:00 on Dec 1: w (2 GPUs × 2 h), m (3/7 × 1 h), s (0.3 × 2 h); p was between its runs.
    from datetime import timedelta

    report = usage_report(
        access=ADMIN,
        start=DEC + timedelta(hours=4),
        end=DEC + timedelta(hours=6),
        now=NOW,
        tenants=["vision"],
    )
    assert report.total.gpu_hours == pytest.approx(4 + 3 / 7 + 0.6, abs=1e-9)


def test_groups_by_pool_and_gpu_model_with_filters(month) -> None:
    report = usage_report(access=ADMIN, start=DEC, end=JAN, now=NOW, group_by=["pool", "gpu_model"])
    assert _hours(report) == {
        ("a100-infer", "A100-80GB"): pytest.approx(2.0),
        ("h100-train", "H100-80GB"): pytest.approx(VISION_DEC),
    }
    only = usage_report(
        access=ADMIN, start=DEC, end=JAN, now=NOW, group_by=["queue"], gpu_models=["A100-80GB"]
    )
    assert _hours(only) == {("audio/infer",): pytest.approx(2.0)}


def test_running_work_is_charged_until_now_and_not_beyond(month) -> None:
    from datetime import timedelta

    later = usage_report(
        access=ADMIN,
        start=DEC,
        end=JAN,
        now=NOW + timedelta(hours=1),
        tenants=["vision"],
        group_by=["tenant"],
    )
    # One more hour of the MPS share (0.3) and of the time slice (0.25).
    assert later.total.gpu_hours == pytest.approx(VISION_DEC + 0.55)
    # A range that starts after now has nothing yet (running work is not charged ahead).
    ahead = usage_report(access=ADMIN, start=JAN, end=JAN + timedelta(days=31), now=NOW, group_by=["tenant"])
    assert ahead.rows == () and ahead.total.gpu_hours == 0


def test_prices_give_money_per_model_and_say_what_is_unpriced(month, settings) -> None:
    settings.WHALEGEN_GPU_PRICES = {"H100-80GB": 2.5}
    report = usage_report(access=ADMIN, start=DEC, end=JAN, now=NOW, group_by=["tenant"])
    audio, vision = report.rows
    assert vision.cost == pytest.approx(VISION_DEC * 2.5) and vision.unpriced_gpu_hours == pytest.approx(0)
    assert audio.cost == pytest.approx(0) and audio.unpriced_gpu_hours == pytest.approx(2.0)
    assert report.currency == "USD" and report.total.cost == pytest.approx(VISION_DEC * 2.5)


def test_a_recarve_keeps_what_the_deleted_units_were_held_for(month) -> None:
    from apps.accounting.services import held_units_keep
    from apps.inventory.models import ComputeUnit

    before = usage_report(access=ADMIN, start=NOV, end=JAN, now=NOW, group_by=["gpu_model"])
    assert held_units_keep(gpu_id=month.mig_gpu.pk) == 1
    ComputeUnit.objects.filter(gpu=month.mig_gpu).delete()  # as a re-carve does (none is held)
    after = usage_report(access=ADMIN, start=NOV, end=JAN, now=NOW, group_by=["gpu_model"])
    assert _hours(after) == pytest.approx(_hours(before))
