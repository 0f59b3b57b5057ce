"""Scenario replay: the format's errors, determinism, quotas, gangs, priority preemption and reclaim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from whalegen.sim.scenario import ScenarioError, parse_scenario, run_scenario

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "scenarios" / "two-tenants.yaml"

POOL = """
pool:
  node_groups:
    - {name: n, count: 1, gpu_model: H100-80GB, gpus_per_node: 4, cpu_milli: 64000, mem_mib: 524288}
"""


def _scenario(tenants: str, streams: str, *, preemption: bool = True, horizon_s: int = 3600) -> str:
    return (
        f"name: t\nhorizon_s: {horizon_s}\ncycle_s: 10\npreemption: {str(preemption).lower()}\n"
        f"{POOL}tenants:\n{tenants}streams:\n{streams}"
    )


ONE_TENANT = "  - {name: a, guaranteed_milli: 4000}\n"
ONE_STREAM = (
    "  - {name: s, tenant: a, arrival: {process: every, every_s: 60}, runtime: {dist: fixed, s: 300}, "
    "shape: {num_gpu: 1}}\n"
)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param("- a list", "scenario: must be a mapping", id="the top is not a mapping"),
        pytest.param("name: [unclosed", "not valid YAML at line 1", id="broken YAML names the line"),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM).replace("horizon_s: 3600", "horizon_s: -1"),
            "horizon_s: must be above 0, got -1",
            id="a negative horizon",
        ),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM).replace("gpus_per_node: 4", "gpus_per_node: four"),
            "pool.node_groups[0].gpus_per_node: must be an integer, got 'four'",
            id="a word for a count",
        ),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM).replace("H100-80GB", "H900"),
            "pool.node_groups[0].gpu_model: unknown GPU model 'H900'",
            id="an unknown GPU model",
        ),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM.replace("tenant: a", "tenant: b")),
            "streams[0].tenant: no tenant 'b' (tenants: a)",
            id="a stream of an unknown tenant",
        ),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM.replace("num_gpu: 1", "num_gpu: 2, gpu_milli: 500")),
            "streams[0].shape.gpu_milli: must be at most 1000, and 1000 when num_gpu > 1",
            id="a fraction on several GPUs",
        ),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM.replace("num_gpu: 1", "num_gpu: 8")),
            "streams[0].shape: 8 GPU(s)",
            id="a shape no node holds",
        ),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM.replace("process: every", "process: bursty")),
            "streams[0].arrival.process: must be poisson, every or at, got 'bursty'",
            id="an unknown arrival process",
        ),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM.replace("dist: fixed, s: 300", "dist: normal")),
            "streams[0].runtime.dist: must be fixed, exponential, lognormal or uniform",
            id="an unknown run time distribution",
        ),
        pytest.param(
            _scenario(ONE_TENANT, ONE_STREAM.replace("shape:", "gang: 2, shape:")),
            "streams[0].gang: unknown field",
            id="a misspelt field",
        ),
        pytest.param(
            _scenario(
                "  - {name: a, guaranteed_milli: 1000}\n", ONE_STREAM.replace("num_gpu: 1", "num_gpu: 2")
            ),
            "streams[0]: one arrival asks 2000 milli-GPU, above tenant a's quota",
            id="an arrival above its tenant's quota",
        ),
        pytest.param(
            _scenario(
                "  - {name: a, guaranteed_milli: 8000}\n",
                ONE_STREAM.replace("shape: {num_gpu: 1}", "gang_size: 3, shape: {num_gpu: 2}"),
            ),
            "streams[0].gang_size: a gang of 3 members of 2 GPU(s) never fits: the empty pool holds at most "
            "2 such members at once",
            id="a gang bigger than the pool",
        ),
    ],
)
def test_a_bad_scenario_is_one_error_naming_the_field(text: str, error: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text)
    assert error in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_command_reports_a_bad_scenario_in_one_line_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(_scenario(ONE_TENANT, ONE_STREAM.replace("num_gpu: 1", "num_gpu: x")))
    done = subprocess.run(
        [sys.executable, "-m", "whalegen.cli", "replay", "--scenario", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "streams[0].shape.num_gpu: must be an integer" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_example_scenario_parses_and_holds_every_rule_for_both_policies() -> None:
    scenario = parse_scenario(EXAMPLE.read_text())
    for policy in ("fgd", "whalegen"):
        result = run_scenario(scenario, policy, 1)
        # The replay raises on a breach; these counts prove it looked, every cycle.
        assert result.checks["quota"] > 100 and result.checks["gang"] > 100
        assert result.gangs > 0
        for tenant in result.tenants:
            assert tenant.max_used_pct_of_limit <= 100.0
        research = next(t for t in result.tenants if t.tenant == "research")
        assert research.borrowing_s > 0  # it bursts above its guarantee
        assert result.preemptions > 0
        assert result.not_started == 0


def test_a_replay_is_deterministic_for_its_seed_and_differs_across_seeds() -> None:
    # The example's first 40 minutes: borrowing, reclaim and gangs, at a third of the cost.
    scenario = parse_scenario(EXAMPLE.read_text().replace("horizon_s: 7200", "horizon_s: 2400"))
    one = run_scenario(scenario, "whalegen", 3)
    again = run_scenario(scenario, "whalegen", 3)
    other = run_scenario(scenario, "whalegen", 4)
    assert one.starts_s == again.starts_s
    assert one.tenants == again.tenants
    assert one.starts_s != other.starts_s


GANG_POOL = _scenario(
    "  - {name: a, guaranteed_milli: 4000}\n",
    "  - {name: filler, tenant: a, arrival: {process: every, every_s: 30}, count: 6,"
    " runtime: {dist: uniform, min_s: 100, max_s: 900}, shape: {num_gpu: 1}}\n"
    "  - {name: g, tenant: a, arrival: {process: at, at_s: [45, 50]}, runtime: {dist: fixed, s: 200},"
    " shape: {num_gpu: 1}, gang_size: 3}\n",
)


def test_a_gang_starts_all_together_or_not_at_all() -> None:
    result = run_scenario(parse_scenario(GANG_POOL), "bestfit", 7)
    assert result.not_started == 0
    for n in (0, 1):
        starts = {result.starts_s[f"g-{n}.{m}"] for m in range(3)}
        assert len(starts) == 1, starts
    # Both gangs had to wait for room (four GPUs, six one-GPU fillers ahead of them).
    assert min(result.starts_s["g-0.0"]) > 50


PRIORITY = _scenario(
    # Room in the quota for the urgent task: a tenant at its limit does not preempt its own work.
    "  - {name: a, guaranteed_milli: 4000, borrow_limit_milli: 2000}\n",
    "  - {name: low, tenant: a, arrival: {process: every, every_s: 10}, count: 4,"
    " runtime: {dist: fixed, s: 3000}, shape: {num_gpu: 1}, preemptible: true}\n"
    "  - {name: urgent, tenant: a, arrival: {process: at, at_s: [600]}, runtime: {dist: fixed, s: 300},"
    " shape: {num_gpu: 2}, priority: 10}\n",
)


@pytest.mark.parametrize("policy", ["fgd", "whalegen", "bestfit"])
def test_a_high_priority_arrival_preempts_preemptible_work(policy: str) -> None:
    result = run_scenario(parse_scenario(PRIORITY), policy, 1)
    assert result.preemptions == 2
    # It starts one cycle after the victims stop, long before they would have ended (at ~3000 s).
    assert result.starts_s["urgent-0"][0] <= 620
    urgent = next(p for p in result.priorities if p.priority == 10)
    assert urgent.mean_wait_s <= 20
    # The victims went back to the queue and ran again after their back-off.
    restarted = [t for t, s in result.starts_s.items() if t.startswith("low-") and len(s) == 2]
    assert len(restarted) == 2


def _reclaim(preemption: bool) -> str:
    return _scenario(
        "  - {name: a, guaranteed_milli: 1000, borrow_limit_milli: 3000}\n"
        "  - {name: b, guaranteed_milli: 3000}\n",
        "  - {name: burst, tenant: a, arrival: {process: every, every_s: 5}, count: 4,"
        " runtime: {dist: fixed, s: 3000}, shape: {num_gpu: 1}}\n"
        "  - {name: owner, tenant: b, arrival: {process: at, at_s: [900]}, runtime: {dist: fixed, s: 600},"
        " shape: {num_gpu: 2}}\n",
        preemption=preemption,
    )


def test_a_tenant_under_its_guarantee_gets_it_back_by_reclaim() -> None:
    result = run_scenario(parse_scenario(_reclaim(True)), "whalegen", 1)
    a, b = result.tenants
    assert a.borrowing_s > 0
    # a's borrowed (not preemptible) tasks are reclaimed for b's guarantee.
    assert a.preemptions == 2
    assert result.starts_s["owner-0"][0] <= 920
    assert b.short_s <= 20


def test_without_preemption_the_owner_waits_for_the_borrower_to_finish() -> None:
    result = run_scenario(parse_scenario(_reclaim(False)), "whalegen", 1)
    a, b = result.tenants
    assert a.preemptions == 0
    assert result.starts_s["owner-0"][0] >= 3000
    assert b.short_s >= 2000


MIG_POOL = """
name: mig
horizon_s: 1200
pool:
  node_groups:
    - {name: m, count: 1, gpu_model: A100-80GB, gpus_per_node: 2, cpu_milli: 64000, mem_mib: 524288,
       partition_mode: mig}
    - {name: w, count: 1, gpu_model: A100-80GB, gpus_per_node: 1, cpu_milli: 64000, mem_mib: 524288}
tenants:
  - {name: a, guaranteed_milli: 3000}
streams:
  - {name: iso, tenant: a, arrival: {process: poisson, rate_per_h: 90},
     runtime: {dist: exponential, mean_s: 300},
     shape: {num_gpu: 1, gpu_milli: 400, gpu_mem_mib: 18000, isolation: mig}}
  - {name: whole, tenant: a, arrival: {process: every, every_s: 300}, runtime: {dist: fixed, s: 200},
     shape: {num_gpu: 1}}
"""


def test_mig_isolated_tasks_run_on_mig_gpus_side_by_side() -> None:
    result = run_scenario(parse_scenario(MIG_POOL), "whalegen", 2)
    assert result.not_started == 0
    assert result.checks["capacity"] > 0
    iso = [nodes for t, nodes in result.nodes_of.items() if t.startswith("iso-")]
    assert iso and all(set(nodes) == {"m-00"} for nodes in iso)
    # Only the MIG node serves them (the whole-GPU node offers no MIG instance), and it ran many.
    assert len(iso) > 4


tenant_specs = st.tuples(st.integers(0, 4), st.integers(0, 4))
stream_specs = st.tuples(
    st.integers(0, 2),  # tenant
    st.sampled_from([(1, 1000), (2, 1000), (1, 250), (1, 500)]),
    st.integers(1, 3),  # gang size
    st.integers(0, 5),  # priority
    st.booleans(),  # preemptible
    st.integers(10, 60),  # arrivals per hour
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tenants=st.lists(tenant_specs, min_size=3, max_size=3),
    streams=st.lists(stream_specs, min_size=1, max_size=4),
    mode=st.sampled_from(["whole", "shared"]),
    policy=st.sampled_from(["whalegen", "fgd", "bestfit"]),
)
def test_random_scenarios_never_exceed_a_quota_or_split_a_gang(
    tenants: list[tuple[int, int]],
    streams: list[tuple[int, tuple[int, int], int, int, bool, int]],
    mode: str,
    policy: str,
) -> None:
    tenant_text = "".join(
        f"  - {{name: t{i}, guaranteed_milli: {1000 * g}, borrow_limit_milli: {1000 * b}}}\n"
        for i, (g, b) in enumerate(tenants)
    )
    stream_text = "".join(
        f"  - {{name: s{i}, tenant: t{t}, arrival: {{process: poisson, rate_per_h: {rate}}}, "
        f"runtime: {{dist: lognormal, median_s: 300, sigma: 0.8}}, shape: {{num_gpu: {n}, gpu_milli: {m}}}, "
        f"gang_size: {gang}, priority: {prio}, preemptible: {str(pre).lower()}}}\n"
        for i, (t, (n, m), gang, prio, pre, rate) in enumerate(streams)
    )
    text = _scenario(tenant_text, stream_text, horizon_s=1200).replace(
        "mem_mib: 524288}", f"mem_mib: 524288, partition_mode: {mode}}}"
    )
    try:
        scenario = parse_scenario(text)
    except ScenarioError as error:
        # Refused up front: an arrival bigger than its tenant's quota, a gang bigger than the pool.
        assume("above tenant" not in str(error) and "never fits" not in str(error))
        raise
    result = run_scenario(scenario, policy, 5)  # raises InvariantError on a quota or gang breach
    for tenant in result.tenants:
        assert tenant.max_used_pct_of_limit <= 100.0
    assert result.checks["quota"] > 0 or result.tasks == 0 or all(t.tasks == 0 for t in result.tenants)
