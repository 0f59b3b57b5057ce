"""The operator's side of joining from the command line (`whalegen create join-token`, `whalegen delete
join-token|node-credential`, `whalegen approve node`) against the configured database, and a host
joining a live plane with `whalegen agent join` and nothing else."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from whalegen.cli import main
from whalegen.commands.create import parse_ttl

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("1h", 3600), ("7d", 604_800)],
    ids=["bare seconds", "seconds", "minutes", "an hour", "a week"],
)
def test_a_lifetime_reads_as_people_write_it(text: str, seconds: int) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["0", "1y", "-1h", "h"], ids=["zero", "years", "negative", "no number"])
def test_a_lifetime_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a lifetime"):
        parse_ttl(text)


def test_create_join_token_prints_the_secret_once_and_what_it_allows(world: Any, capsys: Any) -> None:
    from apps.fleet.models import JoinToken
    from apps.fleet.selectors import credential_hash

    assert (
        main(["create", "join-token", "--pool", "h100-train", "--ttl", "2h", "--uses", "3", "--approval"])
        == 0
    )
    out, err = capsys.readouterr()
    raw = out.strip()
    token = JoinToken.objects.get(token_hash=credential_hash(raw))
    assert (token.pool.name, token.cluster.name, token.max_uses, token.requires_approval) == (
        "h100-train",
        "eu-1",
        3,
        True,
    )
    assert token.created_by.startswith("cli:")
    assert "3 host(s)" in err and "approval" in err and "shown once" in err


def test_create_join_token_refuses_an_unknown_pool_and_a_bad_lifetime(world: Any, capsys: Any) -> None:
    assert main(["create", "join-token", "--pool", "nowhere"]) == 1
    assert "there is no pool 'nowhere'" in capsys.readouterr().err
    assert main(["create", "join-token", "--pool", "h100-train", "--ttl", "forever"]) == 2
    assert "is not a lifetime" in capsys.readouterr().err


def test_delete_join_token_revokes_it_by_name_and_keeps_it_listed(world: Any, capsys: Any) -> None:
    from apps.fleet.models import JoinToken

    assert main(["create", "join-token", "--pool", "h100-train", "--name", "rack-7"]) == 0
    capsys.readouterr()
    assert main(["delete", "join-token", "rack-7"]) == 0
    assert "join token rack-7 revoked at" in capsys.readouterr().out
    assert JoinToken.objects.get(name="rack-7").revoked_at is not None
    assert main(["delete", "join-token", "rack-8"]) == 1
    assert "no join token 'rack-8'" in capsys.readouterr().err


def test_delete_node_credential_lets_the_host_join_again(world: Any, capsys: Any) -> None:
    assert main(["delete", "node-credential", "eu-1/gpu-001"]) == 0
    assert "a host may join under this name" in capsys.readouterr().out
    world.node.refresh_from_db()
    assert world.node.agent_credential_hash == ""
    assert main(["delete", "node-credential", "gpu-001"]) == 1


def test_approve_node_from_the_command_line(world: Any, capsys: Any) -> None:
    from apps.fleet.join import join_token_create, node_join
    from tests.apps.fleet.test_join import host

    _, raw = join_token_create(pool=world.h100, cluster=world.node.cluster, ttl_s=60, requires_approval=True)
    node_join(message=host(raw))
    assert main(["approve", "node", "eu-1/gpu-new"]) == 0
    assert "node eu-1/gpu-new approved; it is ready" in capsys.readouterr().out
    assert main(["approve", "node", "eu-1/gpu-001"]) == 1
    assert "nothing to approve" in capsys.readouterr().err


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def create_log() -> Iterator[_Kept]:
    """The `whalegen.create` logger's records. On that logger, not the root: the command sets Django up,
    which replaces the root's handlers (pytest's `caplog` among them)."""
    kept = _Kept()
    log = logging.getLogger("whalegen.create")
    log.addHandler(kept)
    try:
        yield kept
    finally:
        log.removeHandler(kept)


def test_the_bootstrap_token_is_made_from_the_environment(
    db: None, create_log: _Kept, monkeypatch: Any
) -> None:
    """The compose stack's start-up step: off a terminal (as here) its sentences are log records of
    `whalegen.create`, without the program's name (docs/logs-and-metrics.md, "Logs")."""
    from apps.fleet.models import JoinToken

    def said() -> list[str]:
        messages = [record.getMessage() for record in create_log.records]
        create_log.records.clear()
        return messages

    monkeypatch.delenv("WHALEGEN_BOOTSTRAP_JOIN_TOKEN", raising=False)
    assert main(["create", "join-token", "--bootstrap"]) == 0
    assert said() == ["WHALEGEN_BOOTSTRAP_JOIN_TOKEN is not set; no bootstrap token"]
    monkeypatch.setenv("WHALEGEN_BOOTSTRAP_JOIN_TOKEN", "a-secret-the-operator-chose-0123")
    monkeypatch.setenv("WHALEGEN_BOOTSTRAP_POOL", "sim")
    assert main(["create", "join-token", "--bootstrap"]) == 0
    assert [message.split(" token ")[0] for message in said()] == ["made bootstrap"]
    assert main(["create", "join-token", "--bootstrap"]) == 0
    assert said()[0].startswith("refreshed bootstrap token")
    assert JoinToken.objects.get().pool.name == "sim"


@pytest.mark.django_db(transaction=True)
def test_a_host_joins_a_live_plane_with_the_agent_command_alone(
    live_server: Any, tmp_path: Path, capsys: Any
) -> None:
    """The plane over HTTP, the agent in its own process on the simulated example host: the join token
    from `whalegen create join-token`, then `whalegen agent join`; the node has the host's GPUs and its
    kept credential registers."""
    import json

    import requests

    from apps.inventory.models import Node
    from apps.inventory.services import cluster_create, pool_create
    from whalegen import protocol as p

    cluster_create(name="local")
    pool_create(name="sim", runtime="process")
    # In this process: a subprocess would reach the configured database, not this test's.
    assert main(["create", "join-token", "--pool", "sim", "--ttl", "10m"]) == 0
    secret = capsys.readouterr().out.strip()
    state = tmp_path / "state"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WHALEGEN_AGENT_")}
    joined = subprocess.run(
        [sys.executable, "-m", "whalegen", "agent", "join", "--server", live_server.url,
         "--join-token", secret, "--pool", "sim", "--name", "sim-host",
         "--backend", "sim", "--state-dir", str(state)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**clean, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert joined.returncode == 0, joined.stderr
    assert stat.S_IMODE((state / "node-credential.json").stat().st_mode) == 0o600
    node = Node.objects.get(name="sim-host")
    assert [g.model for g in node.gpus.order_by("index")] == ["H100-80GB", "H100-80GB", "L40S"]
    credential = json.loads((state / "node-credential.json").read_text())["credential"]
    body = p.Register(node_name="sim-host", hostname="h", agent_version="0.1").to_dict()
    answer = requests.post(
        live_server.url + p.REGISTER_PATH,
        json=body,
        headers={"Authorization": f"Bearer {credential}"},
        timeout=10,
    )
    assert answer.status_code == 200 and answer.json()["node_id"] == str(node.pk)
