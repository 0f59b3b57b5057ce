"""The deployment files stay true to the code: `.env.example` lists every variable the code reads, the
compose file's services restart and report health, the agent image installs no Django, and the agent's
simulated backend runs with no spec given."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
# A variable read in the code: through the settings' typed helpers or os.environ / os.getenv, the name
# possibly on the next line (ruff format wraps long calls).
READ = re.compile(
    r"""(?:\benv(?:str|int|float|bool|list|prices)\(|os\.environ(?:\.get\(|\[)|os\.getenv\()\s*["']([A-Z][A-Z0-9_]+)["']"""
)
# The system's own, not WhaleGen settings: Django's module variable and the search path tools run with.
NOT_OURS = {"DJANGO_SETTINGS_MODULE", "PATH", "HOME"}


def variables_read() -> dict[str, str]:
    found: dict[str, str] = {}
    for package in ("whalegen", "apps", "agents", "docker"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in READ.findall(path.read_text()):
                found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def variables_listed() -> set[str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return {m.group(1) for line in lines if (m := re.match(r"^#?\s*([A-Z][A-Z0-9_]+)=", line))}


def test_env_example_lists_every_variable_the_plane_and_agent_read() -> None:
    read = variables_read()
    assert len(read) > 40, "the scan found too few variables: is the pattern still right?"
    missing = {name: where for name, where in read.items() if name not in variables_listed() | NOT_OURS}
    assert missing == {}, f"add these to .env.example (name: first file reading it): {missing}"


def test_env_example_names_nothing_the_code_does_not_read() -> None:
    assert variables_listed() - set(variables_read()) == set()


def test_the_variable_scan_sees_a_name_wrapped_onto_the_next_line() -> None:
    assert READ.findall('x = envfloat(\n    "WHALEGEN_X_S", 1.0)\ny = os.environ.get("WHALEGEN_Y")') == [
        "WHALEGEN_X_S",
        "WHALEGEN_Y",
    ]


def test_every_long_running_compose_service_restarts_and_has_a_healthcheck() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    long_running = {name for name in services if name != "migrate"}
    assert {"postgres", "redis", "web", "worker", "beat", "agent", "prometheus"} <= long_running
    for name in long_running:
        assert services[name].get("restart") in ("always", "unless-stopped"), name
    # The agent serves nothing a probe could ask; its restart policy is what brings it back.
    assert {name for name in long_running if "healthcheck" not in services[name]} == {"agent"}
    assert "/readyz" in " ".join(services["web"]["healthcheck"]["test"])


def test_the_compose_agent_runs_the_simulated_backend_without_a_spec_flag() -> None:
    agent = yaml.safe_load(COMPOSE.read_text())["services"]["agent"]
    command = agent["command"]
    assert command[command.index("--backend") + 1] == "sim"
    assert "--sim-spec" not in command


def test_the_agent_image_installs_only_the_agent_extra_and_it_has_no_django() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile.agent").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs and all("[agent]" in line and "plane" not in line for line in installs), installs
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["agent"]]
    heavy = ("django", "celery", "psycopg", "xgboost", "numpy", "pandas", "gunicorn")
    assert [req for req in wanted if req.lower().startswith(heavy)] == []
    assert "COPY apps" not in dockerfile, "the agent image must not carry the plane's Django apps"


def test_the_plane_image_is_multi_stage_and_runs_unprivileged() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+(?:\s+AS\s+(\S+))?", dockerfile, flags=re.MULTILINE | re.IGNORECASE)
    assert len(stages) >= 2, "a build stage and a runtime stage"
    assert re.search(r"^COPY --from=", dockerfile, flags=re.MULTILINE)
    assert re.search(r"^USER\s+\S+", dockerfile, flags=re.MULTILINE)


def test_agent_inspect_with_the_sim_backend_needs_no_further_flags(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("WHALEGEN_AGENT_SIM_SPEC", None)
    done = subprocess.run(
        [sys.executable, "-m", "whalegen", "agent", "inspect", "--backend", "sim"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    host = json.loads(done.stdout)
    models = [gpu["inventory"]["model"] for gpu in host["gpus"]]
    assert models == ["H100-80GB", "H100-80GB", "L40S"]


def test_agent_help_says_what_sim_uses_without_a_spec() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "whalegen", "agent", "--help"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "example-host.yaml" in " ".join(done.stdout.split())


def test_the_plane_image_carries_every_file_the_demo_reads_from_the_source_tree() -> None:
    """`whalegen demo` seeds from the example fleet file; an image without it fails at its first step."""
    from whalegen.commands.demo import FLEET_FILE

    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    copied = re.findall(r"^COPY\s+(?!--from)(\S+)\s", dockerfile, flags=re.MULTILINE)
    assert any(FLEET_FILE.as_posix().startswith(source.rstrip("/")) for source in copied), copied
    assert (ROOT / FLEET_FILE).is_file()


# ---- the shipped defaults for a fleet (issue #42 item 2): code, compose, .env.example and docs agree ----
def _defaults_of(code: str) -> dict[str, Any]:
    """What `code` prints (JSON) in a process whose environment sets none of the plane's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHALEGEN_") and k != "WEB_CONCURRENCY"}
    env.update(PYTHONPATH=str(ROOT), SECRET_KEY="test-only-not-secret")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def plane_defaults() -> dict[str, Any]:
    return _defaults_of(
        "import json, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'whalegen.config.settings'\n"
        "import django; django.setup(); from django.conf import settings as s\n"
        "print(json.dumps({n: getattr(s, n) for n in ('WHALEGEN_AGENT_HEARTBEAT_S', "
        "'WHALEGEN_AGENT_POLL_WAIT_S', 'WHALEGEN_NODE_LOST_HEARTBEATS')}))"
    )


def gunicorn_defaults() -> dict[str, Any]:
    return _defaults_of(
        "import json, runpy; c = runpy.run_path('docker/gunicorn.conf.py')\n"
        "print(json.dumps({n: c[n] for n in ('workers', 'threads', 'keepalive', 'worker_connections')}))"
    )


def env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return {
        m.group(1): m.group(2) for line in lines if (m := re.match(r"^#?\s*([A-Z][A-Z0-9_]+)=(.*)$", line))
    }


def test_the_shipped_fleet_pace_is_one_value_everywhere() -> None:
    """The plane's defaults, compose's, .env.example's and the docs' tables name the same heartbeat and
    long-poll wait; the default holds no long poll (a web thread per agent: docs/notes/agent-fleet.md)."""
    plane = plane_defaults()
    assert plane["WHALEGEN_AGENT_POLL_WAIT_S"] == 0.0
    compose_env = yaml.safe_load(COMPOSE.read_text())["x-plane-env"]
    listed = env_example()
    fleet_doc = (ROOT / "docs" / "fleet.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for name in ("WHALEGEN_AGENT_HEARTBEAT_S", "WHALEGEN_AGENT_POLL_WAIT_S"):
        default = f"{plane[name]:g}"
        assert compose_env[name] == f"${{{name}:-{default}}}", name
        assert listed[name] == default, name
        for doc in (fleet_doc, readme):
            (row,) = [line for line in doc.splitlines() if line.startswith(f"| `{name}` |")]
            assert row.split("|")[2].strip().strip("`") == default, row
    assert listed["WHALEGEN_NODE_LOST_HEARTBEATS"] == str(plane["WHALEGEN_NODE_LOST_HEARTBEATS"])


def test_the_agent_follows_the_plane_pace_it_ships_with() -> None:
    """The agent's own defaults (library and CLI) are the plane's heartbeat and a cap on the poll wait at
    least the plane's, so an agent left at its defaults keeps exactly the pace the plane asks for."""
    from agents.agent import AgentConfig, _replace_intervals
    from whalegen.commands.agent import add_arguments

    plane = plane_defaults()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cli = parser.parse_args([])
    library = AgentConfig(server="http://plane", token="t", state_dir=Path("/nonexistent"))
    assert cli.heartbeat_s == library.heartbeat_s == plane["WHALEGEN_AGENT_HEARTBEAT_S"]
    assert cli.poll_wait_s == library.poll_wait_s
    paced = _replace_intervals(
        library, plane["WHALEGEN_AGENT_HEARTBEAT_S"], plane["WHALEGEN_AGENT_POLL_WAIT_S"]
    )
    assert (paced.heartbeat_s, paced.poll_wait_s) == (10.0, 0.0)


def test_the_web_sizing_in_the_docs_is_the_gunicorn_file() -> None:
    """docs/operations.md's thread and connection figures are what docker/gunicorn.conf.py opens, and
    .env.example lists the same defaults; the systemd web unit runs gunicorn from that file."""
    web = gunicorn_defaults()
    listed = env_example()
    assert int(listed["WEB_CONCURRENCY"]) == web["workers"]
    assert int(listed["WHALEGEN_WEB_THREADS"]) == web["threads"]
    assert int(listed["WHALEGEN_WEB_KEEPALIVE_S"]) == web["keepalive"]
    assert int(listed["WHALEGEN_WEB_CONNECTIONS"]) == web["worker_connections"]
    operations = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert f"`WEB_CONCURRENCY` ({web['workers']}) × `WHALEGEN_WEB_THREADS` ({web['threads']})" in operations
    assert f"{web['workers'] * web['threads']} PostgreSQL connections per web host" in operations
    assert (
        "ExecStart=/opt/whalegen/bin/gunicorn -c docker/gunicorn.conf.py whalegen.config.wsgi" in operations
    )
