"""The lean way through task input (apps/workloads/api/fast_input.py) never accepts what the serializer
refuses and never gives other values than it; and it does take the bodies pipelines send."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from apps.workloads.api import serializers as s
from apps.workloads.api.fast_input import FastInput
from apps.workloads.models import Task

TASK_FIELDS = sorted(s.TaskInputSerializer().fields)

_strings = st.one_of(
    st.sampled_from(["train", "bench", "python", "", " ", " train", "train ", "a b", "x\n", "é", "H100"]),
    st.text(max_size=8),
    st.text(min_size=195, max_size=205, alphabet="ab "),
    st.sampled_from(Task.Isolation.values + Task.Kind.values + Task.SlaClass.values),
)
_ints = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(
        [
            999,
            1000,
            1001,
            1024,
            1025,
            4096,
            4097,
            2**31 - 1,
            2**31,
            -(2**31),
            -(2**31) - 1,
            2**63 - 1,
            2**63,
            10**30,
        ]
    ),
    st.integers(),
)
_scalars = st.one_of(_strings, _ints, st.booleans(), st.none(), st.floats(allow_nan=False), st.just(1.0))
_values = st.one_of(
    _scalars,
    st.lists(_scalars, max_size=4),
    st.lists(_strings, min_size=1, max_size=3),
    st.lists(st.just("a"), min_size=63, max_size=66),
    st.dictionaries(_strings, _scalars, max_size=3),
    st.dictionaries(st.text(max_size=3), _strings, max_size=3),
)
_bodies = st.dictionaries(
    st.one_of(st.sampled_from([*TASK_FIELDS, "idempotency_key"]), st.sampled_from(["gpu_cont", "x"])),
    _values,
    max_size=12,
)
# The values where a rule flips (blank, padded, a length or a range just inside and just outside, the
# wrong JSON type), drawn as often as anything else: a lean check that forgets one rule meets it here.
EDGES = (
    [
        "", " ", " x", "x ", "a b", "x\n", "1", "train", "H100-80GB", "h100", "exclusive", "mig",
        "training", "online", "x" * 32, "x" * 33, "x" * 100, "x" * 101, "x" * 200, "x" * 201,
        0, -1, 1, 999, 1000, 1001, 1024, 1025, 4096, 4097, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1,
        2**63 - 1, 2**63, None, True, False, 1.0, [], [""], [" "], [" x"], ["a"], ["a"] * 64,
        ["a"] * 65, ["x" * 33], [1], {}, {"A": ""}, {"A": " "}, {"A": 1}, {"": "x"},
    ]
)  # fmt: skip
_EDGES = st.sampled_from(EDGES)
# Mostly-valid bodies: a valid base with a few fields replaced, so the generated cases reach deep.
_BASE = {"queue": "train", "command": ["python", "train.py"], "gpu_milli": 10}
_near_valid = st.builds(
    lambda changes, drop: {**{k: v for k, v in _BASE.items() if k not in drop}, **changes},
    st.dictionaries(
        st.sampled_from([*TASK_FIELDS, "idempotency_key"]), st.one_of(_EDGES, _values), max_size=3
    ),
    st.sets(st.sampled_from(sorted(_BASE)), max_size=1),
)


def _judge(serializer: serializers.Serializer, body: Any) -> Any:
    try:
        return serializer.run_validation(body)
    except serializers.ValidationError:
        return "refused"


@pytest.mark.parametrize(
    "serializer_class", [s.TaskInputSerializer, s.BulkTaskItemSerializer], ids=["single", "bulk item"]
)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(_bodies, _near_valid))
def test_the_lean_way_agrees_with_the_serializer_whenever_it_answers(serializer_class, body) -> None:
    serializer = serializer_class()
    fast = FastInput(serializer).values(body)
    if fast is not None:
        assert _judge(serializer, body) == fast


@pytest.mark.parametrize(
    "serializer_class", [s.TaskInputSerializer, s.BulkTaskItemSerializer], ids=["single", "bulk item"]
)
def test_every_field_at_every_edge_value_agrees_with_the_serializer(serializer_class) -> None:
    serializer = serializer_class()
    lean = FastInput(serializer)
    disagreements = []
    taken = 0
    for name in [*TASK_FIELDS, "idempotency_key"]:
        for value in EDGES:
            body = {**_BASE, name: value}
            fast = lean.values(body)
            if fast is not None:
                taken += 1
                if _judge(serializer, body) != fast:
                    disagreements.append((name, value))
    assert not disagreements
    assert taken > 100  # the lean way does answer: this is not a test of a function that always asks


@settings(max_examples=200, deadline=None)
@given(
    tasks=st.lists(st.one_of(_near_valid, st.just(_BASE)), max_size=4),
    tenant=st.one_of(st.none(), _strings),
)
def test_the_lean_way_agrees_for_a_bulk_body(tasks, tenant) -> None:
    body: dict[str, Any] = {"tasks": tasks} if tenant is None else {"tasks": tasks, "tenant": tenant}
    serializer = s.BulkSubmitInputSerializer()
    fast = FastInput(serializer).values(body)
    if fast is not None:
        assert _judge(serializer, body) == fast


@pytest.mark.parametrize(
    "body",
    [
        _BASE,
        {"queue": "bench", "gpu_milli": 1, "cpu_milli": 500, "command": ["python", "train.py"]},
        {
            "tenant": "ml-team",
            "queue": "train",
            "name": "resnet",
            "gpu_count": 2,
            "gpu_milli": 1000,
            "gpu_mem_mib": 40960,
            "cpu_milli": 8000,
            "host_mem_mib": 65536,
            "allowed_gpu_models": ["H100-80GB"],
            "isolation": "exclusive",
            "kind": "training",
            "sla_class": "batch",
            "priority": None,
            "preemptible": False,
            "gang_id": "g1",
            "gang_size": 2,
            "command": ["torchrun", "", " x "],
            "env": {"A": "1", "B": ""},
            "max_runtime_s": 3600,
            "profile_key": "resnet",
        },
    ],
    ids=["minimal", "the benchmark's", "every field"],
)
def test_plainly_valid_bodies_take_the_lean_way(body) -> None:
    fast = FastInput(s.TaskInputSerializer()).values(body)
    assert fast is not None and fast == s.TaskInputSerializer().run_validation(body)
    bulk = {"tasks": [{k: v for k, v in body.items() if k != "tenant"}] * 3}
    assert FastInput(s.BulkSubmitInputSerializer()).values(bulk) is not None


@pytest.mark.parametrize(
    "body",
    [
        {**_BASE, "gpu_cont": 2},
        {**_BASE, "gpu_milli": "10"},
        {**_BASE, "name": " padded "},
        {**_BASE, "command": [" ", "x"]},
        {**_BASE, "priority": 2**31},
        {"command": ["x"]},
    ],
    ids=["unknown field", "number as string", "trimmed name", "blank executable", "out of range", "no queue"],
)
def test_anything_doubtful_goes_to_the_serializer(body) -> None:
    assert FastInput(s.TaskInputSerializer()).values(body) is None
