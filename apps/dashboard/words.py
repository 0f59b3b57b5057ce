"""Words for the codes the plane stores, so that no page shows a raw code.

A pending task carries a machine code (`Task.why_pending_code`, also a /metrics label and an API field)
next to its sentence (`Task.why_pending`). Tables that count tasks by reason show the code's label here;
the task's own sentence stays what the scheduler wrote. A code this table does not know still reads as
words (underscores become spaces), and a test fails until it is given a label.
"""

from __future__ import annotations

from apps.workloads.services import BACKING_OFF
from whalegen.placement.types import Outcome
from whalegen.scheduling.types import Code

NOT_CONSIDERED = ""  # no cycle has looked at the task yet

REASON_LABELS: dict[str, str] = {
    NOT_CONSIDERED: "waiting for the next cycle",
    Outcome.GANG_INCOMPLETE: "gang not yet complete",
    Outcome.QUOTA_EXCEEDED: "quota used up",
    Outcome.NO_ALLOWED_MODEL: "no node with an allowed GPU model",
    Outcome.NO_CAPACITY: "no free GPU, CPU or memory that fits",
    Outcome.GANG_UNPLACEABLE: "the whole gang does not fit",
    Outcome.WAITING_FOR_PREEMPTION: "waiting for preempted tasks to leave",
    Outcome.NO_ISOLATION: "no GPU offers the isolation asked for",
    Outcome.ONLINE_RESERVE: "held back by the online-service reserve",
    Outcome.BUDGET_SPENT: "the tenant's GPU-hour budget is used up",
    # Both of whalegen-aware's SLA refusals carry this one code: a co-location on a shared GPU, and (with
    # slice_sla=refuse) a MIG slice whose share of the SMs is below what the service is observed to use.
    Outcome.SLA_REFUSED: "no unit with room keeps an online SLA (a shared GPU, or too small a MIG slice)",
    Code.NEEDS_LAYOUT: "only a new MIG layout would fit",
    Code.WAITING_FOR_LAYOUT: "a GPU is being re-carved for it",
    Code.VICTIM_CLAIMED: "its preemption victims were just placed",
    Code.HELD_FOR_RESERVATION: "held so a reserved large task can start on time",
    Code.DEFERRED: "waiting for a faster GPU model to free up",
    BACKING_OFF: "backing off before a retry",
}

NODE_STATE_LABELS: dict[str, str] = {
    "ready": "ready",
    "cordoned": "cordoned (no new work)",
    "draining": "draining",
    "lost": "lost (no heartbeat)",
}


def reason_label(code: str | None) -> str:
    """The label of a why-pending code; an unknown code as plain words."""
    code = code or NOT_CONSIDERED
    return REASON_LABELS.get(code, code.replace("_", " "))


def node_state_label(state: str) -> str:
    return NODE_STATE_LABELS.get(state, state.replace("_", " "))
