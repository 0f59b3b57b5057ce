"""schemathesis over the committed OpenAPI document (docs/openapi.yaml) against the plane on a live
server (real PostgreSQL): every operation, all four phases (examples, coverage, fuzzing, stateful),
as a tenant member (with a fixed seed) and as a platform admin (with a random seed, printed, so a
failure can be replayed with `--seed`): two runs, both personas and both kinds of seed. It fails on
any 5xx and on any answer the document does not describe: status code, content type, headers, body.

Bounded: 3 examples per operation and phase (the coverage phase adds its boundary cases, ~2,000
requests a run); about two minutes a run on a quiet 2-core machine, four or five on a loaded one.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = ROOT / "docs" / "openapi.yaml"
FIXED_SEED = 20261201
MAX_EXAMPLES = 3  # per operation and phase; the coverage phase adds its boundary cases on top
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
    ]
)


@pytest.fixture
def tokens(world: Any) -> dict[str, str]:
    from apps.tenants.services import token_create

    _, member = token_create(user=world.alice, tenant=world.tenant_a, name="fuzz-member")
    _, admin = token_create(user=world.root, tenant=world.tenant_a, name="fuzz-admin")
    return {"member": member, "admin": admin}


def _schemathesis(base_url: str, token: str, seed: int, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        str(SCHEMA),
        "--url",
        base_url,
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        CHECKS,
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(seed),
        "--workers",
        "2",
        "--request-timeout",
        "30",
        "--suppress-health-check",
        "all",
        "--no-color",
    ]
    # The coverage phase would also send every method a path does not have (the 405s are tested in
    # test_contract.py); leaving those out keeps the run bounded.
    (tmp_path / "schemathesis.toml").write_text("[phases.coverage]\nunexpected-methods = []\n")
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("persona", "seeded"),
    [("member", "fixed"), ("admin", "random")],
    ids=["a tenant member, fixed seed", "a platform admin, random seed"],
)
def test_the_api_answers_every_generated_request_as_its_schema_says(
    live_server: Any, tokens: dict[str, str], persona: str, seeded: str, tmp_path: Path, settings: Any
) -> None:
    settings.WHALEGEN_FORECAST_INLINE = True  # no worker here: forecasts run in the request
    seed = FIXED_SEED if seeded == "fixed" else random.SystemRandom().randrange(2**31)
    done = _schemathesis(live_server.url, tokens[persona], seed, tmp_path)
    tail = "\n".join(done.stdout.splitlines()[-80:])
    print(f"schemathesis seed {seed} as {persona}:\n{tail}")  # shown with -s / on failure
    assert done.returncode == 0, (
        f"schemathesis (seed {seed}, as {persona}) found problems:\n{tail}\n{done.stderr}"
    )
