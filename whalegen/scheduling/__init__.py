"""The scheduling core: one pure decision step, `decide(snapshot, config, now_s) -> Decisions`.

Pure: no Django, no clock, no I/O. The production cycle, the replays and the benchmarks call it; see
`whalegen.scheduling.decide` for its steps and docs/scheduling.md for where each part of a cycle lives.
"""

from whalegen.scheduling.decide import Decider, decide, nodes_before, repartition_sentence
from whalegen.scheduling.types import (
    Bound,
    Claim,
    Code,
    Config,
    Decisions,
    FreeUnit,
    LayoutPlan,
    Reason,
    Snapshot,
)

__all__ = [
    "Bound",
    "Claim",
    "Code",
    "Config",
    "Decider",
    "Decisions",
    "FreeUnit",
    "LayoutPlan",
    "Reason",
    "Snapshot",
    "decide",
    "nodes_before",
    "repartition_sentence",
]
