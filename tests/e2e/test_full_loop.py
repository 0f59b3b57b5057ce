"""The whole loop end to end: tasks submitted over the REST API with tenant tokens, scheduling cycles
sent through Redis to two real Celery workers, real `whalegen agent` processes on simulated NVML that
start the processes, PostgreSQL under all of it.

The fleet spans two clusters: eu-1 holds an H100 node (GPU 0 in MIG mode carved 3g.40gb@0, GPU 1
whole) and an A100 node; us-1 holds a second A100 node and an L40S node. The simulator has no L4, so
the L40S stands in for the L4 inference pool of the issue. After each scenario the invariant checker
of tests/apps/scheduling reads the database: no unit held twice, no GPU, node or quota over-committed.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from tests.apps.scheduling.invariants import consistent_violations
from tests.e2e.conftest import AgentProcess, CeleryWorker, CyclePump, alive, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FINAL = {"succeeded", "failed", "cancelled"}
SLEEP = "import time; time.sleep({s})"
# A command that exits with `code` after `s` seconds, so a task's outcome is the process's own.
EXIT = "import sys, time; time.sleep({s}); sys.exit({code})"


@dataclass
class Plane:
    url: str
    tenants: dict[str, Any]
    tokens: dict[str, str]
    pools: dict[str, Any]
    queues: dict[str, Any]
    nodes: dict[str, Any]
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    root: Any = None

    def submit(self, tenant: str, **body: Any) -> dict[str, Any]:
        answer = requests.post(f"{self.url}/api/v1/tasks/", json=body, headers=self._auth(tenant), timeout=30)
        assert answer.status_code == 201, answer.text
        return answer.json()

    def get(self, tenant: str, task_id: int) -> dict[str, Any]:
        answer = requests.get(f"{self.url}/api/v1/tasks/{task_id}/", headers=self._auth(tenant), timeout=30)
        answer.raise_for_status()
        return answer.json()

    def post(self, tenant: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = requests.post(f"{self.url}{path}", json=body, headers=self._auth(tenant), timeout=30)
        assert answer.status_code in (200, 201), answer.text
        return answer.json()

    def _auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[tenant]}"}


def python(code: str) -> list[str]:
    return ["python3", "-c", code]


def states(ids: list[int]) -> dict[int, str]:
    from apps.workloads.models import Task

    return dict(Task.objects.filter(pk__in=ids).values_list("pk", "state"))


def explain(ids: list[int]) -> str:
    """What a timed-out wait prints: each task's state and why it still waits."""
    from apps.scheduling.models import Cycle
    from apps.workloads.models import Task

    rows = Task.objects.filter(pk__in=ids).order_by("pk")
    lines = [f"  task {t.pk} {t.name}: {t.state} attempts={t.attempts} {t.why_pending_code} {t.why_pending}"
             for t in rows]  # fmt: skip
    last = Cycle.objects.order_by("-pk").first()
    lines.append(f"  cycles run: {Cycle.objects.count()}; last stats: {last.stats if last else None}")
    return "\n".join(lines)


def wait_tasks(ids: list[int], wanted: set[str], timeout_s: float, what: str) -> dict[int, str]:
    """Wait until every task of `ids` is in one of `wanted`; on time-out say where each one is and why."""
    try:
        return wait_for(lambda: (s := states(ids)) and all(v in wanted for v in s.values()) and s,
                        timeout_s=timeout_s, what=what)  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{explain(ids)}") from None


def no_violations(plane: Plane) -> None:
    found = [v for pool in plane.pools.values() for v in consistent_violations(pool.pk)]
    assert not found, found


@pytest.fixture
def plane(live_server: Any, agents: Any, cycle_pump: CyclePump, settings: Any) -> Plane:
    """Two tenants with tokens, two pools over two clusters, four nodes each with its live agent; the
    cycle pump started once every agent has registered."""
    from apps.fleet.nodes import node_token_issue
    from apps.inventory.models import Gpu
    from apps.inventory.services import cluster_create, gpu_add, node_register, pool_create
    from apps.tenants.models import Membership
    from apps.tenants.services import membership_set, tenant_create, token_create
    from apps.workloads.services import queue_create, quota_set
    from tests.apps.factories import UserFactory

    settings.WHALEGEN_AGENT_HEARTBEAT_S = 1.0
    vision = tenant_create(slug="vision", name="Vision")
    speech = tenant_create(slug="speech", name="Speech")
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    membership_set(user=alice, tenant=vision, role=Membership.Role.MEMBER)
    membership_set(user=bob, tenant=speech, role=Membership.Role.MEMBER)
    eu, us = cluster_create(name="eu-1", region="eu-west"), cluster_create(name="us-1", region="us-east")
    train, infer = pool_create(name="train", runtime="process"), pool_create(name="infer", runtime="process")

    nodes: dict[str, Any] = {}
    specs: dict[str, list[dict[str, Any]]] = {}

    def node(cluster: Any, pool: Any, name: str, gpus: list[tuple[str, str, dict[str, Any]]]) -> None:
        made, _ = node_register(cluster=cluster, pool=pool, name=name, cpu_milli=32_000, mem_mib=262_144)
        for index, (model, _sku, extra) in enumerate(gpus):
            gpu_add(node=made, index=index, model=model, **extra)
        nodes[name] = made
        specs[name] = [{"sku": sku, **({"mig": "enabled"} if extra else {})} for _, sku, extra in gpus]

    mig = {"partition_mode": Gpu.PartitionMode.MIG, "mig_layout": [("3g.40gb", 0)]}
    node(eu, train, "h100-001", [("H100-80GB", "h100-80gb-sxm", mig), ("H100-80GB", "h100-80gb-sxm", {})])
    node(eu, train, "a100-001", [("A100-80GB", "a100-80gb", {})])
    node(us, train, "a100-002", [("A100-80GB", "a100-80gb", {})])
    node(us, infer, "l40s-001", [("L40S", "l40s", {})])

    # Submission charges the quota for pending tasks too, so the borrow limits are wide enough for every
    # scenario's queue; the guarantees (one GPU each in train) are what reclaim and fair share act on.
    quota_set(tenant=vision, pool=train, guaranteed_milli=1000, borrow_limit_milli=40_000)
    quota_set(tenant=speech, pool=train, guaranteed_milli=1000, borrow_limit_milli=40_000)
    quota_set(tenant=vision, pool=infer, guaranteed_milli=20_000)
    quota_set(tenant=speech, pool=infer, guaranteed_milli=20_000)
    queues = {
        "vision/train": queue_create(tenant=vision, pool=train, name="train", default_priority=5),
        "speech/train": queue_create(tenant=speech, pool=train, name="train", default_priority=5),
        "vision/infer": queue_create(tenant=vision, pool=infer, name="infer"),
        "speech/infer": queue_create(tenant=speech, pool=infer, name="infer"),
    }
    tokens = {
        "vision": token_create(user=alice, tenant=vision, name="e2e")[1],
        "speech": token_create(user=bob, tenant=speech, name="e2e")[1],
        # The platform admin belongs to no tenant; its token decides overrides all the same.
        "root": token_create(user=root, tenant=vision, name="ops")[1],
    }
    made = Plane(
        url=live_server.url,
        tenants={"vision": vision, "speech": speech},
        tokens=tokens,
        pools={"train": train, "infer": infer},
        queues=queues,
        nodes=nodes,
        root=root,
    )
    for name, node_row in nodes.items():
        made.agents[name] = agents(token=node_token_issue(node=node_row), node_name=name, gpus=specs[name])
        made.agents[name].start()
    wait_for(lambda: _registered(nodes), timeout_s=60, what="every agent to register and heartbeat")
    cycle_pump.start()
    return made


def _registered(nodes: dict[str, Any]) -> bool:
    from apps.inventory.models import Gpu, Node

    heard = Node.objects.filter(pk__in=[n.pk for n in nodes.values()], last_heartbeat_at__isnull=False)
    simulated = Gpu.objects.filter(node__in=nodes.values(), uuid__startswith="GPU-").count()
    return heard.count() == len(nodes) and simulated == 5


def test_fifty_mixed_tasks_and_a_gang_all_reach_a_final_state(plane: Plane) -> None:
    from apps.scheduling.models import Assignment

    started = time.monotonic()
    expected: dict[int, str] = {}
    owner: dict[int, str] = {}
    for n in range(50):
        tenant = ("vision", "speech")[n % 2]
        fails = n % 7 == 3
        body: dict[str, Any] = {
            "name": f"mix-{n}",
            "command": python(EXIT.format(s=0.3, code=3 if fails else 0)),
            "cpu_milli": 1000,
            "host_mem_mib": 1024,
            "max_runtime_s": 60,
        }
        if n % 5 == 4:  # an inference task on the L40S pool
            body.update(queue="infer", gpu_milli=1000)
        elif n % 5 == 1:  # a fractional task: fits the H100's 3g.40gb MIG instance
            body.update(queue="train", gpu_milli=400, gpu_mem_mib=20_000)
        else:
            body.update(queue="train", gpu_milli=1000)
        task_id = plane.submit(tenant, **body)["id"]
        expected[task_id], owner[task_id] = ("failed" if fails else "succeeded"), tenant
    gang = [
        plane.submit("vision", queue="train", name=f"gang-{n}", gang_id="g1", gang_size=2, gpu_milli=1000,
                     command=python(SLEEP.format(s=0.5)), max_runtime_s=60)["id"]
        for n in range(2)
    ]  # fmt: skip
    for task_id in gang:
        expected[task_id] = "succeeded"
    ids = list(expected)
    done = wait_tasks(ids, FINAL, timeout_s=150, what="50 mixed tasks and a gang to finish")
    assert done == expected, explain(ids)
    # The exit codes the API shows are the processes' own.
    exits = {i: plane.get(tenant, i)["exit_code"] for i, tenant in owner.items()}
    assert exits == {i: 3 if expected[i] == "failed" else 0 for i in owner}, exits
    # The gang was placed whole by one cycle.
    rows = list(Assignment.objects.filter(task_id__in=gang).values("cycle_id", "node_id", "task_id"))
    assert len(rows) == 2 and rows[0]["cycle_id"] == rows[1]["cycle_id"] is not None, rows
    # Tasks ran on every node, in both clusters.
    used = set(Assignment.objects.filter(task_id__in=ids).values_list("node__name", flat=True))
    assert {"h100-001", "a100-001", "a100-002", "l40s-001"} <= used, used
    no_violations(plane)
    print(f"\n50 mixed tasks + gang of 2: {time.monotonic() - started:.1f} s")


def test_a_cancel_while_running_stops_the_process(plane: Plane) -> None:
    from apps.fleet.models import TaskRun

    task = plane.submit("vision", queue="infer", name="long", command=python(SLEEP.format(s=60)))
    wait_tasks([task["id"]], {"running"}, timeout_s=30, what="the task to run")
    agent = plane.agents["l40s-001"]
    pid = wait_for(lambda: agent.task_pid(task["id"]), what="its pid")
    plane.post("vision", f"/api/v1/tasks/{task['id']}/cancel/", {"reason": "not needed"})
    wait_for(lambda: TaskRun.objects.filter(task_id=task["id"], state="stopped").exists(), what="the stop")
    assert not alive(pid)
    assert plane.get("vision", task["id"])["state"] == "cancelled"
    no_violations(plane)


def test_a_node_killed_mid_run_is_lost_and_its_task_reruns_elsewhere(plane: Plane) -> None:
    from apps.inventory.models import Node
    from apps.scheduling.models import Assignment

    body = {"queue": "train", "gpu_milli": 1000, "allowed_gpu_models": ["A100-80GB"], "max_runtime_s": 60}
    task = plane.submit("vision", name="survivor", command=python(SLEEP.format(s=4)), **body)
    wait_tasks([task["id"]], {"running"}, timeout_s=30, what="the task to run")
    first = Assignment.objects.get(task_id=task["id"]).node.name
    plane.agents[first].kill()
    wait_tasks([task["id"]], FINAL, timeout_s=60, what="the task to finish after its node was lost")
    final = plane.get("vision", task["id"])
    assert (final["state"], final["attempts"]) == ("succeeded", 1), final
    rows = Assignment.objects.filter(task_id=task["id"]).order_by("pk")
    nodes = list(rows.values_list("node__name", flat=True))
    other = {"a100-001": "a100-002", "a100-002": "a100-001"}[first]
    assert nodes == [first, other], nodes
    assert Node.objects.get(pk=plane.nodes[first].pk).state == "lost"
    no_violations(plane)


def test_an_agent_restarted_re_adopts_its_running_task(plane: Plane) -> None:
    task = plane.submit("speech", queue="infer", name="steady", command=python(EXIT.format(s=3, code=0)))
    wait_tasks([task["id"]], {"running"}, timeout_s=30, what="the task to run")
    agent = plane.agents["l40s-001"]
    pid = wait_for(lambda: agent.task_pid(task["id"]), what="its pid")
    agent.stop()
    assert alive(pid)
    agent.start()
    wait_tasks([task["id"]], FINAL, timeout_s=30, what="the re-adopted task to finish")
    final = plane.get("speech", task["id"])
    assert (final["state"], final["exit_code"], final["attempts"]) == ("succeeded", 0, 0), final
    no_violations(plane)


# A whole GPU of the train pool: its three whole GPUs take these first; the H100's MIG GPU (an idle
# 3g.40gb) is re-carved only for a task none of them can hold.
WHOLE_TRAIN_GPU = {"gpu_milli": 1000, "allowed_gpu_models": ["A100-80GB", "H100-80GB"]}
# The task that must preempt in a full pool asks a GPU outside MIG mode: a plain whole-GPU task would get
# the idle MIG GPU re-carved instead, which stops no running work and so comes before any preemption.
NON_MIG_TRAIN_GPU = {**WHOLE_TRAIN_GPU, "isolation": "exclusive"}


def _fill_train(plane: Plane, tenant: str, count: int, **extra: Any) -> list[int]:
    return [
        plane.submit(tenant, queue="train", name=f"{tenant}-fill-{n}", command=python(SLEEP.format(s=60)),
                     **WHOLE_TRAIN_GPU, **extra)["id"]
        for n in range(count)
    ]  # fmt: skip


def test_a_reclaim_preempts_borrowed_capacity_for_a_tenant_within_its_guarantee(plane: Plane) -> None:
    from apps.scheduling.models import Assignment, Repartition

    # Speech takes the three whole GPUs of the train pool: 1000 guaranteed + 2000 borrowed. Whole GPUs
    # were free for each, so the idle MIG GPU was not re-carved for any of them.
    speech = _fill_train(plane, "speech", 3)
    wait_tasks(speech, {"running"}, timeout_s=40, what="speech's three tasks to run")
    assert not Repartition.objects.filter(task_id__in=speech).exists()
    borrowed = set(
        Assignment.objects.filter(task_id__in=speech, borrowed=True).values_list("task_id", flat=True)
    )
    assert len(borrowed) == 2, borrowed
    # Vision, within its guarantee, asks for a whole GPU: one borrowed GPU is taken back.
    mine = plane.submit(
        "vision", queue="train", name="reclaimer", command=python(SLEEP.format(s=0.5)), **NON_MIG_TRAIN_GPU
    )
    wait_tasks([mine["id"]], FINAL, timeout_s=40, what="vision's task to reclaim a GPU and finish")
    assert plane.get("vision", mine["id"])["state"] == "succeeded"
    victims = preempted_for(mine["id"])
    assert len(victims) == 1 and set(victims) <= borrowed, (victims, borrowed)
    assert plane.get("speech", next(iter(victims)))["attempts"] == 1
    no_violations(plane)


def preempted_for(task_id: int) -> dict[int, str]:
    """The tasks a cycle preempted for `task_id`, with the reason written on their event."""
    from apps.workloads.models import TaskEvent

    rows = TaskEvent.objects.filter(to_state="preempted", reason__startswith=f"preempted for task {task_id}:")
    return dict(rows.values_list("task_id", "reason"))


def test_an_approved_override_raises_a_task_that_then_preempts_lower_priority_work(plane: Plane) -> None:
    from apps.workloads.models import Task

    # Vision fills its guarantee and borrows one GPU, speech fills its guarantee: the pool is full.
    low = _fill_train(plane, "vision", 2) + _fill_train(plane, "speech", 1)
    wait_tasks(low, {"running"}, timeout_s=40, what="the fill to run")
    urgent = plane.submit(
        "speech",
        queue="train",
        name="urgent",
        priority=5,
        command=python(SLEEP.format(s=0.5)),
        **NON_MIG_TRAIN_GPU,
    )
    time.sleep(3)  # a few cycles: at equal priority it waits, nobody is preempted
    assert plane.get("speech", urgent["id"])["state"] == "pending"
    wanted = {"task": urgent["id"], "wanted_priority": 50, "reason": "deadline tonight"}
    asked = plane.post("speech", "/api/v1/overrides/", wanted)
    decided = plane.post("root", f"/api/v1/overrides/{asked['id']}/approve/", {"comment": "approved"})
    assert (decided["state"], decided["decided_by"]) == ("approved", "root"), decided
    wait_tasks([urgent["id"]], FINAL, timeout_s=40, what="the raised task to preempt and finish")
    assert plane.get("speech", urgent["id"])["state"] == "succeeded"
    # One task of the fill (either tenant's: all run at priority 5) is preempted for the raised one.
    victims = preempted_for(urgent["id"])
    assert len(victims) == 1 and set(victims) <= set(low), (victims, explain(low))
    assert "priority 5 below 50" in next(iter(victims.values())), victims
    victim = Task.objects.get(pk=next(iter(victims)))
    assert victim.attempts == 1 and victim.state != "failed", explain(low)  # requeued, not failed
    no_violations(plane)


def test_a_task_whose_best_place_needs_a_new_mig_layout_waits_for_the_agent_to_recarve_the_gpu(
    plane: Plane,
) -> None:
    from apps.fleet.models import GpuPartition
    from apps.inventory.models import ComputeUnit, Gpu
    from apps.scheduling.models import Repartition

    gpu = Gpu.objects.get(node=plane.nodes["h100-001"], index=0)
    # 500 milli with 40 GB on a MIG instance: a 4g.40gb, which the GPU's one 3g.40gb@0 cannot give.
    task = plane.submit(
        "vision", queue="train", name="needs-4g", gpu_milli=500, gpu_mem_mib=40_000, isolation="mig",
        command=["sh", "-c", 'echo "on $CUDA_VISIBLE_DEVICES"'], max_runtime_s=60,
    )  # fmt: skip
    wait_tasks([task["id"]], FINAL, timeout_s=60, what="the task to wait for its layout, bind and finish")
    assert plane.get("vision", task["id"])["state"] == "succeeded", explain([task["id"]])
    # The cycle re-carved the idle GPU, held it for the task, and bound it once the agent said so.
    claim = Repartition.objects.get(task_id=task["id"])
    assert claim.state == "bound" and claim.layout == [["4g.40gb", 0], ["3g.40gb", 4]], claim
    report = GpuPartition.objects.get(gpu=gpu)
    assert report.state == "ok" and report.generation >= claim.generation
    assert sorted((i["profile"], i["start"]) for i in report.instances) == [("3g.40gb", 4), ("4g.40gb", 0)]
    assert [(u.mig_profile, u.mig_start) for u in ComputeUnit.objects.filter(pk=claim.unit_id)] == [
        ("4g.40gb", 0)
    ]
    # The process ran on the new MIG instance: CUDA_VISIBLE_DEVICES named the 4g.40gb's MIG UUID.
    new_instance = next(i for i in report.instances if i["profile"] == "4g.40gb")
    assert new_instance["mig_uuid"].startswith("MIG-"), new_instance
    output = plane.agents["h100-001"].task_output(task["id"]).strip()
    assert output == f"on {new_instance['mig_uuid']}", output
    no_violations(plane)


def _cycle_outcomes(workers: list[CeleryWorker]) -> list[Counter[str]]:
    """Per worker, how many `cycle_pool` runs ended with each status (the worker log prints the result)."""
    pattern = re.compile(r"apps\.scheduling\.tasks\.cycle_pool\[[^\]]+\] succeeded in [\d.]+s: '(\w+)'")
    return [Counter(pattern.findall(w.log())) for w in workers]


def test_two_workers_racing_cycles_on_one_pool_never_double_book(
    plane: Plane, celery_workers: list[CeleryWorker]
) -> None:
    from apps.scheduling.models import Cycle
    from apps.scheduling.tasks import cycle_pool

    pool = plane.pools["train"]
    ids = [
        plane.submit(("vision", "speech")[n % 2], queue="train", name=f"race-{n}", gpu_milli=1000,
                     allowed_gpu_models=["A100-80GB", "H100-80GB"], command=python(SLEEP.format(s=0.3)))["id"]
        for n in range(12)
    ]  # fmt: skip
    before = Cycle.objects.filter(pool=pool).count()
    outcomes_before = _cycle_outcomes(celery_workers)
    # Bursts of copies of one pool's cycle: each worker takes copies off the queue at once, so cycles of
    # the same pool run side by side on two processes.
    checks = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(s in FINAL for s in states(ids).values()):
        for _ in range(6):
            cycle_pool.delay(pool.pk)
        time.sleep(0.3)
        found = consistent_violations(pool.pk)
        assert not found, found
        checks += 1
    wait_tasks(ids, FINAL, timeout_s=5, what="the raced tasks to finish")
    assert set(states(ids).values()) == {"succeeded"}, explain(ids)
    assert Cycle.objects.filter(pool=pool).count() > before
    assert checks > 0
    # Both workers ran cycles, and at least once one found the pool's cycle already running on the other.
    now = _cycle_outcomes(celery_workers)
    ran = [after - earlier for after, earlier in zip(now, outcomes_before, strict=True)]
    assert all(sum(c.values()) > 0 for c in ran), ran
    assert sum(c["busy"] for c in ran) > 0, ran
