"""`apply` through its service: the example fleet from an empty database, idempotence, the round trip
through documents, dry-run differences, prune refusals and validation messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.core.exceptions import ValidationError

from apps.declarative.kinds import BY_NAME
from apps.declarative.models import AppliedObject
from apps.declarative.selectors import documents_list
from apps.declarative.services import objects_apply
from apps.inventory.models import ComputeUnit, Gpu, Node
from apps.tenants.selectors import Access
from apps.workloads.models import Queue, Quota

FLEET = Path(__file__).resolve().parents[3] / "docs" / "examples" / "fleet.yaml"
ADMIN = Access(platform_admin=True)


def _fleet() -> tuple[list[dict], list[str]]:
    documents = [doc for doc in yaml.safe_load_all(FLEET.read_text()) if doc]
    return documents, [f"fleet.yaml#{n}" for n in range(1, len(documents) + 1)]


def _outcomes(results) -> dict[str, str]:
    return {f"{r.kind}/{r.key}": r.outcome for r in results}


@pytest.fixture
def admin(db):
    from tests.apps.factories import UserFactory

    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def fleet(admin):
    documents, sources = _fleet()
    return objects_apply(documents=documents, sources=sources, access=ADMIN, user=admin)


def test_the_example_fleet_applies_to_an_empty_database(fleet) -> None:
    assert {r.outcome for r in fleet} == {"created"}, [r for r in fleet if r.outcome != "created"]
    assert Node.objects.count() == 10
    assert Gpu.objects.filter(node__name="eu-h100-01", partition_mode="mig").count() == 2
    assert ComputeUnit.objects.filter(gpu__node__name="eu-h100-01", kind="mig").count() == 11
    assert Gpu.objects.filter(model="L4").count() == 12
    quota = Quota.objects.get(tenant__slug="vision", pool__name="h100-train")
    assert (quota.guaranteed_milli, quota.borrow_limit_milli) == (16_000, 8_000)
    assert AppliedObject.objects.get(kind="Queue", key="vision/train").source.startswith("fleet.yaml#")


def test_applying_the_same_file_twice_changes_nothing(fleet, admin) -> None:
    documents, sources = _fleet()
    again = objects_apply(documents=documents, sources=sources, access=ADMIN, user=admin)
    assert set(_outcomes(again).values()) == {"unchanged"}


@pytest.mark.parametrize("kind", sorted(BY_NAME))
def test_every_kind_read_back_as_documents_applies_unchanged(fleet, admin, kind: str) -> None:
    documents = documents_list(kind=BY_NAME[kind], access=ADMIN)
    assert documents, f"the example fleet has no {kind}"
    text = yaml.safe_dump_all(documents)  # what `get -o yaml` prints
    again = objects_apply(documents=list(yaml.safe_load_all(text)), access=ADMIN, user=admin)
    assert set(_outcomes(again).values()) == {"unchanged"}


def test_a_dry_run_shows_the_field_differences_and_keeps_nothing(fleet, admin) -> None:
    changed = [
        {"kind": "Queue", "metadata": {"tenant": "vision", "name": "train"}, "spec": {"pool": "h100-train"}},
        {
            "kind": "Quota",
            "metadata": {"tenant": "vision", "pool": "h100-train"},
            "spec": {"guaranteed_gpus": 20},
        },
        {"kind": "Pool", "metadata": {"name": "new-pool"}, "spec": {}},
    ]
    results = objects_apply(documents=changed, access=ADMIN, user=admin, dry_run=True)
    by_key = {f"{r.kind}/{r.key}": r for r in results}
    assert by_key["Queue/vision/train"].diff == {"spec.default_priority": [10, 0], "spec.weight": [2, 1]}
    assert by_key["Quota/vision/h100-train"].diff == {
        "spec.guaranteed_gpus": [16, 20],
        "spec.borrow_limit_gpus": [8, 0],
    }
    assert by_key["Pool/new-pool"].outcome == "created"
    assert Queue.objects.get(tenant__slug="vision", name="train").weight == 2
    assert not Node.objects.filter(pool__name="new-pool").exists()
    from apps.inventory.models import Pool

    assert not Pool.objects.filter(name="new-pool").exists()


def test_prune_deletes_what_the_file_no_longer_names_and_refuses_what_is_in_use(fleet, admin) -> None:
    from apps.tenants.models import Tenant
    from apps.workloads.services import TaskSubmission, task_submit

    speech = Tenant.objects.get(slug="speech")
    task_submit(tenant=speech, request=TaskSubmission(queue="serve", gpu_milli=250), submitted_by=admin)
    documents, sources = _fleet()
    keep = [
        (d, s)
        for d, s in zip(documents, sources, strict=True)
        if not (d["kind"] == "Queue" and d["metadata"]["name"] in ("serve", "batch"))
    ]
    results = objects_apply(
        documents=[d for d, _ in keep], sources=[s for _, s in keep], access=ADMIN, user=admin, prune=True
    )
    outcomes = {f"{r.kind}/{r.key}": r for r in results if r.outcome in ("pruned", "refused")}
    assert outcomes["Queue/vision/batch"].outcome == "pruned"
    assert outcomes["Queue/speech/serve"].outcome == "refused"
    assert "unfinished tasks" in outcomes["Queue/speech/serve"].reason
    assert not Queue.objects.filter(tenant__slug="vision", name="batch").exists()


def test_prune_refuses_a_pool_with_nodes_with_the_reason(fleet, admin) -> None:
    documents, sources = _fleet()
    keep = [
        (d, s)
        for d, s in zip(documents, sources, strict=True)
        if d["kind"] == "Pool" and d["metadata"]["name"] != "l4-infer"
    ]
    results = objects_apply(
        documents=[d for d, _ in keep], sources=[s for _, s in keep], access=ADMIN, user=admin, prune=True
    )
    refused = {r.key: r.reason for r in results if r.outcome == "refused"}
    assert refused == {"l4-infer": "not pruned: pool 'l4-infer' still has 3 nodes; remove or move them first"}


@pytest.mark.parametrize(
    ("document", "want"),
    [
        (
            {
                "kind": "Quota",
                "metadata": {"tenant": "vision", "pool": "p"},
                "spec": {"guaranteed_gpus": "8"},
            },
            "fleet.yaml#1 spec.guaranteed_gpus: is the string '8'; write a number of GPUs, e.g. 8 or 0.5",
        ),
        (
            {
                "kind": "Quota",
                "metadata": {"tenant": "vision", "pool": "p"},
                "spec": {"guaranteed_gpus": 0.0001},
            },
            "fleet.yaml#1 spec.guaranteed_gpus: is 0.0001; GPUs are counted in thousandths (milli-GPUs)",
        ),
        (
            {"kind": "Pool", "metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {}},
            "fleet.yaml#1 metadata.labels: a Pool carries no labels (only nodes do)",
        ),
        (
            {"kind": "Pool", "metadata": {"name": "p"}, "spec": {"runtime": "vm"}},
            "fleet.yaml#1 spec.runtime: is the string 'vm'; write one of container, process",
        ),
        (
            {"kind": "Pools", "metadata": {"name": "p"}},
            "fleet.yaml#1 kind: 'Pools' is not a kind apply knows; write one of Cluster, Pool, Node, Tenant, "
            "Member, Queue, Quota, Budget, GpuPrice",
        ),
        (
            {"kind": "Queue", "metadata": {"tenant": "vision"}, "spec": {"pool": "p", "colour": "red"}},
            "fleet.yaml#1 metadata.name: is required (text) for a Queue",
        ),
        (
            {
                "kind": "Node",
                "metadata": {"cluster": "c", "name": "n"},
                "spec": {
                    "pool": "p",
                    "gpus": [{"model": "H100-80GB", "partition": "mig", "mig": ["9g.80gb@0"]}],
                },
            },
            "fleet.yaml#1 spec.gpus[0].mig: '9g.80gb@0' is not PROFILE@START with a profile of H100-80GB",
        ),
    ],
    ids=[
        "a quoted number",
        "finer than a milli-GPU",
        "labels on a pool",
        "an unknown runtime",
        "an unknown kind",
        "a missing name",
        "a MIG profile the model lacks",
    ],
)
def test_a_bad_document_is_refused_naming_document_path_and_field(admin, document: dict, want: str) -> None:
    with pytest.raises(ValidationError) as refused:
        objects_apply(documents=[document], sources=["fleet.yaml#1"], access=ADMIN, user=admin)
    messages = refused.value.message_dict["documents"]
    assert any(message.startswith(want) for message in messages), messages


def test_cordon_labels_and_a_moved_node_go_through_the_node_services(fleet, admin) -> None:
    documents = documents_list(kind=BY_NAME["Node"], access=ADMIN, name="eu-west-1/eu-l4-01")
    documents[0]["spec"]["cordoned"] = True
    documents[0]["metadata"]["labels"]["rack"] = "r7"
    [result] = objects_apply(documents=documents, access=ADMIN, user=admin)
    assert result.outcome == "configured"
    assert result.diff == {"spec.cordoned": [False, True], "metadata.labels.rack": [None, "r7"]}
    node = Node.objects.get(name="eu-l4-01")
    assert (node.state, node.labels["rack"]) == ("cordoned", "r7")
    assert objects_apply(documents=documents, access=ADMIN, user=admin)[0].outcome == "unchanged"
