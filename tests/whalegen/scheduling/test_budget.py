"""A spent GPU-hour budget stops new admissions with its reason; running work and other tenants go on."""

from __future__ import annotations

import pytest

from tests.whalegen.placement.builders import task
from tests.whalegen.scheduling.builders import Pool, whole
from whalegen.placement.types import BudgetSpent, Outcome, Quota, RunningTask
from whalegen.scheduling import Config, decide

SPENT = BudgetSpent(pool="h100-train", period="December 2026", limit_gpu_h=500, used_gpu_h=512.34)


@pytest.mark.parametrize("policy", ["whalegen", "bestfit", "fgd", "k8s-default"])
def test_a_spent_budget_refuses_admission_with_its_reason_and_keeps_running_work(policy: str) -> None:
    pool = Pool().node("n1", whole(held=True), whole(), whole())
    running = RunningTask(
        task_id="old", node="n1", gpu_indexes=(0,), gpu_milli=1000, cpu_milli=1000, mem_mib=1024,
        priority=0, tenant="vision", preemptible=True,
    )  # fmt: skip
    pending = [
        task("v1", gpus=1, tenant="vision", priority=10),
        task("a1", gpus=1, tenant="audio"),
    ]
    quotas = [Quota("vision", 4000, budget_spent=SPENT), Quota("audio", 4000)]
    decisions = decide(pool.snapshot(pending, running=[running], quotas=quotas), Config(policy=policy), 0.0)
    assert [b.task_id for b in decisions.placements] == ["a1"]
    assert decisions.unplaced["v1"].code == Outcome.BUDGET_SPENT.value == "budget_spent"
    assert decisions.unplaced["v1"].message == (
        "tenant vision has used its 500 GPU-hour budget for h100-train in December 2026 (512.3 h)"
    )
    assert decisions.preemptions == ()  # a budget never stops what runs
    assert decisions.estimates["v1"] is None  # no task's end brings the budget back
