"""Policy names to policy objects: the baselines, `whalegen`, and `whalegen:opt=0` variants for ablations."""

from __future__ import annotations

from whalegen.placement.aware import GOODPUT_POLICIES, AwarePolicy
from whalegen.placement.policies import BASELINES, Policy
from whalegen.placement.whalegen_policy import WhalegenPolicy

POLICY_NAMES = (*BASELINES, *GOODPUT_POLICIES, "whalegen", "whalegen-aware")


def make_policy(name: str) -> Policy:
    """A policy by name; `whalegen:option=value:…` switches one of its ideas off or on."""
    base, *options = name.split(":")
    if base == "whalegen":
        return WhalegenPolicy(**dict(option.split("=", 1) for option in options))
    if base == "whalegen-aware":
        return AwarePolicy(**dict(option.split("=", 1) for option in options))
    factory = BASELINES.get(base) or GOODPUT_POLICIES.get(base)
    if factory is None or options:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return factory()
