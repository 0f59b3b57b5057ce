"""The requests' fast constructor builds what the dataclass's own constructor builds."""

from __future__ import annotations

import dataclasses

import pytest

from whalegen.placement.types import (
    Isolation,
    TaskPrediction,
    TaskRequest,
    task_request_whole,
)


def test_task_request_whole_is_the_dataclass_it_stands_for_and_wants_every_field() -> None:
    fields = dataclasses.asdict(
        TaskRequest(
            "7",
            4000,
            16384,
            num_gpu=1,
            gpu_milli=500,
            gpu_mem_mib=20000,
            allowed_models=frozenset({"A100-SXM4-80GB"}),
            gang_id="a:g",
            gang_size=2,
            priority=3,
            tenant="vision",
            isolation=Isolation.MPS,
            sla_online=True,
            submitted_at_s=12.5,
        )
    )
    fields["prediction"] = TaskPrediction(60.0, None, None)
    fast, slow = task_request_whole(dict(fields)), TaskRequest(**fields)
    assert fast == slow
    assert hash(fast) == hash(slow)
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    assert dataclasses.replace(fast, priority=1) == dataclasses.replace(slow, priority=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.priority = 1  # type: ignore[misc]
    missing = {k: v for k, v in fields.items() if k != "order_key"}
    with pytest.raises(TypeError, match="order_key"):
        task_request_whole(missing)
    with pytest.raises(TypeError, match="prio"):
        task_request_whole({**missing, "prio": 1})
