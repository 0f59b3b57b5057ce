"""`bench placement` times the production decision, and it decides what the engine alone decides."""

from __future__ import annotations

from whalegen.placement.types import TaskRequest
from whalegen.sim.bench import bench_cluster, fingerprint, synthetic_cluster


def _tasks() -> list[TaskRequest]:
    shapes = ((1, 250), (1, 500), (1, 1000), (2, 1000), (4, 1000), (1, 125))
    return [
        TaskRequest(f"t{i}", 4000 + 1000 * (i % 3), 16_384 * (1 + i % 2), num, milli)
        for i, (num, milli) in enumerate(shapes * 8)
    ]


def test_bench_places_through_decide_exactly_as_the_engine_alone_past_a_full_cluster() -> None:
    for policy in ("fgd", "whalegen"):
        figures = bench_cluster(synthetic_cluster(6), _tasks(), policy, seed=3, fill=1.3, naive_tasks=10)
        decided, alone = figures["decide"], figures["engine_alone"]
        assert decided["tasks"] == alone["tasks"] > 0
        # Past 100 % of capacity some tasks must fail, so the equality below is not trivially "all".
        assert 0 < decided["placements"] < decided["tasks"]
        assert decided["placements"] == alone["placements"]
        assert figures["decide_first_tasks"]["tasks"] == figures["naive_fgd_first_tasks"]["tasks"] == 10
        assert figures["decide_cpu_over_engine_alone_cpu"] is not None


def test_decision_fingerprint_repeats_for_one_policy_and_tells_two_policies_apart() -> None:
    cluster, tasks = synthetic_cluster(6), _tasks()
    first = fingerprint(cluster, tasks, "whalegen", seed=3, fill=1.3)
    again = fingerprint(cluster, tasks, "whalegen", seed=3, fill=1.3)
    other = fingerprint(cluster, tasks, "random", seed=3, fill=1.3)
    assert first == again
    assert 0 < first["placements"] < first["tasks"]
    # Different decisions give different digests, through decide and through the engine alone.
    assert other["decide_sha256"] != first["decide_sha256"]
    assert other["engine_sha256"] != first["engine_sha256"]
