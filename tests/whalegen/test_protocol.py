"""The agent ↔ plane wire messages: round trips, validation, versioning, paths."""

from __future__ import annotations

import json

import pytest

from whalegen import protocol
from whalegen.protocol import (
    PROTOCOL_VERSION,
    ComputeUnit,
    DesiredState,
    GpuEvent,
    GpuInventory,
    GpuLayout,
    Heartbeat,
    MigInstance,
    MigInstanceSpec,
    MpsSpec,
    NvmlFailure,
    PartitionMode,
    PartitionReport,
    PartitionState,
    ProtocolError,
    Report,
    RunningTask,
    TaskReport,
    TaskSpec,
    TaskState,
    TelemetrySample,
    UnitKind,
    compatible,
)


def sample_messages() -> list[protocol.Message]:
    instance = MigInstance(3, 9, "3g.40gb", 4, 4, 0, "MIG-1", 40_448, (12,))
    gpu = GpuInventory(
        0,
        "GPU-1",
        "NVIDIA H100 80GB HBM3",
        "H100-80GB",
        81_559,
        "0:18:0.0",
        True,
        True,
        True,
        instances=(instance,),
    )
    telemetry = TelemetrySample(
        "GPU-1", 1.5, 10, 81_559, None, None, 70.0, 700.0, 31, 345, 2619, 0, ("utilization",)
    )
    return [
        Heartbeat(
            "node-a",
            "0.1.0",
            2.0,
            inventory=(gpu,),
            telemetry=(telemetry,),
            events=(GpuEvent("GPU-1", "xid", 2.0, xid=79, fatal=True),),
            lost_gpus=("GPU-1",),
        ),
        DesiredState(
            7,
            gpus=(
                GpuLayout("GPU-1", PartitionMode.MIG, (MigInstanceSpec("3g.40gb", 4),)),
                GpuLayout("GPU-2", PartitionMode.MPS, mps=MpsSpec(50, 4096)),
            ),
            tasks=(
                TaskSpec(
                    "t",
                    ("python", "train.py"),
                    "GPU-2",
                    ComputeUnit(UnitKind.MPS, thread_pct=25),
                    env={"A": "1"},
                    max_runtime_s=60.0,
                ),
            ),
        ),
        Report(
            "node-a",
            3,
            4.0,
            tasks=(TaskReport("t", TaskState.FAILED, 4.0, "timeslice_memory_exceeded", 9, None, 15),),
            partitions=(
                PartitionReport(
                    "GPU-1",
                    PartitionState.INFEASIBLE,
                    4.0,
                    7,
                    (instance,),
                    (),
                    (
                        NvmlFailure(
                            "nvmlDeviceCreateGpuInstanceWithPlacement", 23, "INSUFFICIENT_RESOURCES", "GPU-1"
                        ),
                    ),
                ),
            ),
        ),
    ]


@pytest.mark.parametrize("message", sample_messages(), ids=lambda m: type(m).__name__)
def test_messages_survive_a_json_round_trip(message: protocol.Message) -> None:
    wire = json.loads(json.dumps(message.to_dict()))
    assert type(message).from_dict(wire) == message


def test_unknown_fields_are_ignored_and_missing_required_ones_are_refused() -> None:
    data = sample_messages()[1].to_dict() | {"added_in_1_1": True}
    assert DesiredState.from_dict(data).generation == 7
    with pytest.raises(ProtocolError, match="missing generation"):
        DesiredState.from_dict({"gpus": []})


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"generation": "7"}, "DesiredState.generation"),
        ({"generation": True}, "DesiredState.generation"),
        ({"generation": 1, "gpus": [{"gpu_uuid": "G", "mode": "slices"}]}, "DesiredState.gpus[0].mode"),
        (
            {
                "generation": 1,
                "tasks": [{"task_id": "t", "command": "ls", "gpu_uuid": "G", "unit": {"kind": "whole"}}],
            },
            "DesiredState.tasks[0].command",
        ),
    ],
)
def test_bad_values_are_refused_with_where_they_are(data: dict[str, object], where: str) -> None:
    with pytest.raises(ProtocolError, match=where.replace("[", r"\[").replace("]", r"\]")):
        DesiredState.from_dict(data)


def test_versions_and_paths() -> None:
    assert compatible(PROTOCOL_VERSION) and compatible("1.9") and not compatible("2.0")
    paths = [
        protocol.REGISTER_PATH,
        protocol.HEARTBEAT_PATH,
        protocol.DESIRED_STATE_PATH,
        protocol.REPORT_PATH,
    ]
    assert all(p.startswith("/api/v1/agent/") and p.endswith("/") for p in paths)
    assert len(set(paths)) == 4


def test_messages_are_frozen() -> None:
    message = sample_messages()[1]
    with pytest.raises(AttributeError):
        message.generation = 8  # type: ignore[misc]


def test_1_1_fields_round_trip_and_1_0_messages_read_with_their_defaults() -> None:
    spec = TaskSpec(
        "42", ("x",), "GPU-1", ComputeUnit(UnitKind.WHOLE), attempt=2, gpu_uuids=("GPU-1", "GPU-3")
    )
    beat = Heartbeat("n", "0.1", 1.0, running=(RunningTask("42", 2, 99),))
    for message in (spec, beat, TaskReport("42", TaskState.RUNNING, 1.0, attempt=2)):
        assert type(message).from_dict(json.loads(json.dumps(message.to_dict()))) == message
    assert spec.devices == ("GPU-1", "GPU-3")
    # What a 1.0 peer sends: no attempt, no GPU list, no running list ("not told", not "none").
    old_spec = TaskSpec.from_dict(
        {"task_id": "42.2", "command": ["x"], "gpu_uuid": "G", "unit": {"kind": "whole"}}
    )
    assert (old_spec.attempt, old_spec.devices) == (0, ("G",))
    assert Heartbeat.from_dict({"node_id": "n", "agent_version": "0", "sent_at_s": 1.0}).running is None
    assert Heartbeat("n", "0", 1.0, running=()).running == ()


def test_runs_are_named_the_same_whichever_protocol_named_them() -> None:
    assert protocol.run_of("42", 3) == ("42", 3)
    assert protocol.run_of("42.3", 0) == ("42", 3)  # a 1.0 run id
    assert protocol.run_of("job.v2", 1) == ("job.v2", 1)  # a dot without a number is part of the id
    assert protocol.legacy_run_id("42", 0) == "42" and protocol.legacy_run_id("42", 3) == "42.3"
    assert protocol.run_key("42", 0) == "42" and protocol.run_key("42", 3) != protocol.run_key("42", 0)
    assert protocol.speaks_attempts("1.1") and protocol.speaks_attempts("1.12")
    assert not protocol.speaks_attempts("1.0") and not protocol.speaks_attempts("2.1")


def test_log_chunks_travel_as_compact_arrays_and_decode_to_the_same_chunk() -> None:
    line = protocol.LogLine(1.5, protocol.LogStreamName.STDERR, "boom", partial=True)
    chunk = protocol.LogChunk("7", 1, 40, (line,), dropped_lines=3, dropped_bytes=90, eof=True)
    report = protocol.Report("n", 2, 0.0, logs=(chunk,))
    wire = report.to_dict()
    assert wire["logs"][0]["lines"] == [[1.5, "stderr", "boom", True]]
    assert protocol.Report.from_dict(json.loads(json.dumps(wire))) == report


def test_a_report_from_a_1_1_agent_has_no_output_and_still_decodes() -> None:
    old = {"node_id": "n", "seq": 1, "sent_at_s": 0.0, "tasks": [], "protocol_version": "1.1"}
    assert protocol.Report.from_dict(old).logs == ()


@pytest.mark.parametrize(
    "line",
    [[1.0, "video", "x", False], [1.0, "stdout", 5, False], ["soon", "stdout", "x", False], {"text": "x"}],
    ids=["an unknown stream", "text that is not a string", "a time that is not a number", "an object"],
)
def test_a_malformed_output_line_is_refused_with_where_it_is(line: object) -> None:
    data = {"task_id": "7", "attempt": 0, "first_line": 0, "lines": [line]}
    with pytest.raises(protocol.ProtocolError, match=r"LogChunk\.lines\[0\]"):
        protocol.LogChunk.from_dict(data)
