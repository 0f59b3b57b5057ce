"""Writes for the fleet: clusters, pools, nodes, their GPUs and the compute units carved from them."""

from __future__ import annotations

import hashlib
import secrets
import uuid as uuidlib
from collections.abc import Iterable, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from apps.common.models import save_validated
from apps.common.words import plural
from apps.inventory.models import Cluster, ComputeUnit, Gpu, Node, Pool
from whalegen.gpus import UnknownGpuModel, get_model, mig_profiles
from whalegen.gpus.mig import profile_by_name


def cluster_create(*, name: str, region: str = "") -> Cluster:
    cluster = Cluster(name=name, region=region)
    cluster.full_clean()
    cluster.save()
    return cluster


def cluster_update(*, cluster: Cluster, values: dict[str, Any]) -> Cluster:
    """Region and the whole-cluster cordon (the scheduler reads `cordoned` on every cycle)."""
    return save_validated(cluster, {k: v for k, v in values.items() if k in ("region", "cordoned")})


def cluster_delete_refusal(cluster: Cluster) -> str:
    """Why `cluster` may not be deleted ("" when it may)."""
    nodes = cluster.nodes.count()
    if nodes:
        return f"cluster {cluster.name!r} still has {plural(nodes, 'node')}; remove them first"
    return ""


def pool_create(
    *,
    name: str,
    description: str = "",
    runtime: str = Pool.Runtime.CONTAINER,
    allowed_image_prefixes: Sequence[str] = (),
    image_pull_policy: str = Pool.PullPolicy.MISSING,
    join_requires_approval: bool = False,
) -> Pool:
    pool = Pool(
        name=name,
        description=description,
        runtime=runtime,
        allowed_image_prefixes=list(allowed_image_prefixes),
        image_pull_policy=image_pull_policy,
        join_requires_approval=join_requires_approval,
    )
    pool.full_clean()
    pool.save()
    return pool


def pool_update(*, pool: Pool, values: dict[str, Any]) -> Pool:
    """Description and runtime settings: a new runtime or image rule applies to tasks submitted
    afterwards (each task keeps what it got at submission)."""
    allowed = (
        "description",
        "runtime",
        "allowed_image_prefixes",
        "image_pull_policy",
        "join_requires_approval",
    )
    return save_validated(pool, {k: v for k, v in values.items() if k in allowed})


def node_register(
    *,
    cluster: Cluster,
    pool: Pool,
    name: str,
    cpu_milli: int,
    mem_mib: int,
    labels: dict[str, str] | None = None,
) -> tuple[Node, str]:
    """Register a node and return it with its agent credential (plaintext shown once, hash stored)."""
    credential = "wgn_" + secrets.token_urlsafe(32)
    node = Node(
        cluster=cluster,
        pool=pool,
        name=name,
        cpu_milli=cpu_milli,
        mem_mib=mem_mib,
        labels=labels or {},
        agent_credential_hash=hashlib.sha256(credential.encode()).hexdigest(),
    )
    node.full_clean()
    node.save()
    return node, credential


def node_settings_update(*, node: Node, values: dict[str, Any]) -> Node:
    """Labels, capacity and pool, validated. The caller (apps.fleet.nodes.node_update) has checked that a
    node changing pool runs nothing."""
    plain = {k: v for k, v in values.items() if k in ("labels", "cpu_milli", "mem_mib", "pool")}
    if plain:
        save_validated(node, plain)
        # Placement reads labels, capacity and pool: the cycle's compare-and-set must see the change.
        Node.objects.filter(pk=node.pk).update(version=F("version") + 1)
    return node


def node_delete(*, node: Node) -> None:
    """Delete a node whose refusal (apps.fleet.nodes.node_delete_refusal) was asked first, inside the
    same transaction."""
    node.delete()  # its GPUs and units go with it (CASCADE); nothing refers to them once it holds nothing


def mig_units_create(*, gpu_id: int, model: str, layout: Iterable[tuple[str, int]]) -> list[ComputeUnit]:
    """The MIG instances of a re-carved GPU, one per (profile name, start slice), in one INSERT.

    The layout comes from the placement planner, which checked it against the model's MIG table; the
    caller has deleted the GPU's old units (`gpu_add` checks a layout given by a person)."""
    return ComputeUnit.objects.bulk_create(
        ComputeUnit(
            gpu_id=gpu_id,
            kind=ComputeUnit.Kind.MIG,
            mig_profile=profile.name,
            mig_start=start,
            gpu_milli=profile.gpu_milli,
            mem_mib=profile.mem_mib,
        )
        for name, start in layout
        for profile in [profile_by_name(model, name)]
    )


@transaction.atomic
def gpu_add(
    *,
    node: Node,
    index: int,
    model: str,
    uuid: str | None = None,
    partition_mode: str = Gpu.PartitionMode.WHOLE,
    mig_layout: Sequence[tuple[str, int]] = (),
    mps_shares: int = 0,
) -> Gpu:
    """Add a GPU of a catalogue model and carve its compute units.

    whole: one unit of 1000 milli. mig: one unit per (profile name, start slice) in `mig_layout`, checked
    against the model's MIG table. mps / timeslice: `mps_shares` equal units (thread % for MPS).
    """
    try:
        spec = get_model(model)
    except UnknownGpuModel as exc:
        raise ValidationError({"model": [str(exc)]}) from exc
    if spec.mem_mib is None:
        raise ValidationError({"model": [f"{spec.name} is a trace-only model with unknown memory"]})
    if partition_mode == Gpu.PartitionMode.MIG and not spec.mig_capable:
        raise ValidationError({"partition_mode": [f"{spec.name} does not support MIG"]})
    gpu = Gpu.objects.create(
        node=node,
        index=index,
        uuid=uuid or f"GPU-{uuidlib.uuid4()}",
        model=spec.name,
        mem_mib=spec.mem_mib,
        mig_capable=spec.mig_capable,
        partition_mode=partition_mode,
    )
    units: list[ComputeUnit] = []
    if partition_mode == Gpu.PartitionMode.WHOLE:
        units.append(ComputeUnit(gpu=gpu, kind=ComputeUnit.Kind.WHOLE, gpu_milli=1000, mem_mib=spec.mem_mib))
    elif partition_mode == Gpu.PartitionMode.MIG:
        profiles = {p.name: p for p in mig_profiles(spec.name)}
        used = 0
        for profile_name, start in mig_layout:
            profile = profiles.get(profile_name)
            if profile is None:
                raise ValidationError({"mig_layout": [f"{spec.name} has no MIG profile {profile_name!r}"]})
            mask = profile.slice_mask(start)
            if start not in profile.starts or used & mask:
                raise ValidationError({"mig_layout": [f"{profile_name} cannot start at slice {start} here"]})
            used |= mask
            units.append(
                ComputeUnit(
                    gpu=gpu,
                    kind=ComputeUnit.Kind.MIG,
                    mig_profile=profile.name,
                    mig_start=start,
                    gpu_milli=profile.gpu_milli,
                    mem_mib=profile.mem_mib,
                )
            )
    else:
        if mps_shares < 1:
            raise ValidationError({"mps_shares": ["an MPS or time-sliced GPU needs at least one share"]})
        kind = (
            ComputeUnit.Kind.MPS if partition_mode == Gpu.PartitionMode.MPS else ComputeUnit.Kind.TIME_SLICE
        )
        for _ in range(mps_shares):
            units.append(
                ComputeUnit(
                    gpu=gpu,
                    kind=kind,
                    gpu_milli=1000 // mps_shares,
                    mem_mib=spec.mem_mib // mps_shares,
                    mps_thread_pct=100 // mps_shares if kind == ComputeUnit.Kind.MPS else None,
                )
            )
    ComputeUnit.objects.bulk_create(units)
    return gpu
