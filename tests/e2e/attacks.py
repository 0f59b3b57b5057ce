"""The attack a tenant's task makes on its host, as one POSIX shell script (it runs under dash on a host
and busybox sh in the test image), and how a test reads its verdicts.

The attacker is told everything an attacker could find out (the worst case): the agent's pid, state
directory and credential file, the victim's pid, its run directory and output, another GPU's device node.
Each probe prints `BLOCKED <name>` when the attempt failed, or `BREACH <name>: <what it got>`.
"""

from __future__ import annotations

import re

# Every probe the suite expects a verdict for, in the order the script makes them.
PROBES = (
    "own-env-has-no-agent-variables",
    "read-node-credential",
    "read-agent-environment",
    "list-agent-state-dir",
    "read-agent-state-file",
    "read-victim-environment",
    "read-victim-output",
    "list-victim-run-dir",
    "signal-victim",
    "open-another-gpu",
    "kill-victim",
)

SCRIPT = r"""
# Where it runs, and what it may use (the positive controls the test checks beside the probes).
echo "RUNTIME ${container:-host} uid=$(id -u)"
echo "GPU NODES $(ls /dev | grep -c '^nvidia[0-9]')"
if [ -n "$A_OWN_GPU" ] && (exec 3<"$A_OWN_GPU") 2>/dev/null; then echo "OWN GPU OPENS"; fi
probe() {
  name=$1; shift
  if out=$("$@" 2>&1); then
    echo "BREACH $name: $(printf %s "$out" | tr '\0\n' '  ' | head -c 300)"
  else
    echo "BLOCKED $name"
  fi
}
if env | grep -E '^WHALEGEN_AGENT|^WHALEGEN_RUN_PLANE=.*token' >/dev/null; then
  echo "BREACH own-env-has-no-agent-variables: $(env | grep '^WHALEGEN_AGENT' | tr '\n' ' ')"
else
  echo "BLOCKED own-env-has-no-agent-variables"
fi
probe read-node-credential cat "$A_TOKEN_FILE"
probe read-agent-environment cat "/proc/$A_AGENT_PID/environ"
# A listing that names the agent's own files (not the skeleton of paths a private /tmp re-creates).
probe list-agent-state-dir sh -c "ls -a '$A_STATE_DIR' | grep -E 'agent-state|outbox|tasks|lease|token'"
probe read-agent-state-file cat "$A_STATE_DIR/agent-state.json"
probe read-victim-environment cat "/proc/$A_VICTIM_PID/environ"
probe read-victim-output sh -c "cat '$A_VICTIM_OUTPUT'/*"
probe list-victim-run-dir ls "$A_VICTIM_RUN_DIR"
probe signal-victim kill -0 "$A_VICTIM_PID"
probe open-another-gpu sh -c "exec 3<'$A_OTHER_GPU'"
probe kill-victim kill -9 "$A_VICTIM_PID"
echo "ATTACK DONE"
"""

_VERDICT = re.compile(r"^(BLOCKED|BREACH) ([a-z-]+)(?::.*)?$")


def verdicts(output: str) -> dict[str, str]:
    """probe name → the line it printed."""
    found = {}
    for line in output.splitlines():
        match = _VERDICT.match(line.strip())
        if match:
            found[match.group(2)] = line.strip()
    return found


def breaches(output: str) -> list[str]:
    """The probes that got through, or that printed no verdict at all (a probe that never ran proves
    nothing)."""
    found = verdicts(output)
    return [
        found.get(name, f"NO VERDICT {name}")
        for name in PROBES
        if not found.get(name, "").startswith("BLOCKED")
    ]
