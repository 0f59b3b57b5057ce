"""`whalegen demo` with nothing configured: it migrates SQLite, seeds a fleet and serves API + admin."""

from __future__ import annotations

import re

import requests

from tests.whalegen.commands.conftest import Demo


def _get(demo: Demo, path: str, tenant: str = "vision") -> requests.Response:
    return requests.get(
        demo.url + path, headers={"Authorization": f"Bearer {demo.tokens[tenant]}"}, timeout=30
    )


def test_the_demo_prints_a_token_for_each_of_three_tenants(demo: Demo) -> None:
    assert set(demo.tokens) == {"vision", "speech", "ranking"}
    assert all(token.startswith("wg_") for token in demo.tokens.values())


def test_the_demo_fleet_spans_two_clusters_with_mig_and_non_mig_pools(demo: Demo) -> None:
    pools = {p["name"]: p for p in _get(demo, "/api/v1/pools/?limit=100").json()["results"]}
    assert set(pools) == {"h100-train", "a100-batch"}  # vision's quotas; the rest belong to others
    clusters = {c["name"] for c in _get(demo, "/api/v1/clusters/").json()["results"]}
    assert clusters == {"eu-west-1", "us-east-1"}  # the H100 pool spans both
    mig = _get(demo, "/api/v1/gpus/?pool=h100-train&partition_mode=mig&limit=100").json()["results"]
    assert mig and all(unit["kind"] == "mig" for gpu in mig for unit in gpu["units"])
    l4 = _get(demo, "/api/v1/gpus/?model=L4&limit=100", tenant="speech").json()
    assert l4["count"] == 12 and not any(gpu["mig_capable"] for gpu in l4["results"])
    quotas = _get(demo, "/api/v1/quotas/", tenant="speech").json()["results"]
    assert {q["pool"] for q in quotas} == {"h200-train", "l4-infer"}


def test_the_demo_tenants_see_only_their_own_seeded_tasks(demo: Demo) -> None:
    vision = {t["tenant"] for t in _get(demo, "/api/v1/tasks/").json()["results"]}
    ranking = {t["tenant"] for t in _get(demo, "/api/v1/tasks/", tenant="ranking").json()["results"]}
    assert vision == {"vision"} and ranking == {"ranking"}


def test_the_printed_admin_login_opens_the_admin(demo: Demo) -> None:
    session = requests.Session()
    login = session.get(demo.url + "/admin/login/", timeout=30)
    assert login.status_code == 200
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
    response = session.post(
        demo.url + "/admin/login/?next=/admin/",
        data={"csrfmiddlewaretoken": csrf, "username": "admin", "password": demo.admin_password},
        headers={"Referer": demo.url + "/admin/login/"},
        timeout=30,
    )
    assert response.status_code == 200 and "Site administration" in response.text
    assert session.get(demo.url + "/admin/workloads/task/", timeout=30).status_code == 200
    assert session.get(demo.url + "/static/admin/css/base.css", timeout=30).status_code == 200


def test_the_demo_serves_the_schema_and_swagger_ui(demo: Demo) -> None:
    assert requests.get(demo.url + "/api/schema/", timeout=30).status_code == 200
    assert requests.get(demo.url + "/api/docs/", timeout=30).status_code == 200
