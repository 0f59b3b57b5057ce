"""Pre-carving in the production cycle: the forecast in, the layouts out (docs/scheduling.md §3b).

`decide` proposes the layouts (whalegen.scheduling.precarve); this reads what it needs (the settings and
the pool's arrivals forecast) and commits what it proposed the way a last-resort re-carve is committed:
the GPU's units become the new layout, which is the node's desired state the agent pulls and applies.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import F

from apps.common import hooks
from apps.inventory.models import ComputeUnit, Node
from apps.inventory.services import mig_units_create
from apps.scheduling.holders import gpu_units_held
from apps.scheduling.models import Cycle, Repartition
from whalegen.scheduling import Decisions, Snapshot
from whalegen.scheduling.precarve import PrecarveConfig

if TYPE_CHECKING:  # only annotations: the snapshot package imports this module
    from apps.scheduling.snapshot.pool import PoolSnapshot

logger = logging.getLogger(__name__)


def precarve_config() -> PrecarveConfig | None:
    """The cycle's pre-carve rules from the settings; None when `WHALEGEN_PRECARVE` is off."""
    if not settings.WHALEGEN_PRECARVE:
        return None
    return PrecarveConfig(
        max_gpus=settings.WHALEGEN_PRECARVE_MAX_GPUS,
        min_confidence=settings.WHALEGEN_PRECARVE_MIN_CONFIDENCE,
    )


def with_forecast(pure: Snapshot, *, pool_id: int, now: datetime, config: PrecarveConfig | None) -> Snapshot:
    """`decide`'s input with the pool's expected arrivals by shape; read only when pre-carving is on and an
    idle MIG GPU could be re-carved at all."""
    if config is None or not pure.idle_mig:
        return pure
    return replace(pure, forecast=hooks.pool_shape_forecast(pool_id=pool_id, now=now))


def precarves_commit(snapshot: PoolSnapshot, decisions: Decisions, cycle: Cycle, now: datetime) -> int:
    """Re-carve the GPUs `decide` proposed; returns how many were. Runs after the cycle's placements.

    Each GPU goes in its own savepoint under a lock on its node: one whose units are no longer exactly
    the free ones the snapshot saw (a task holds one, another writer re-carved it) is left as it is; it
    never rolls the cycle back (nobody waits on a pre-carve).
    """
    done = 0
    for proposal in decisions.precarves:
        node_id = snapshot.node_ids[proposal.gpu[0]]
        gpu = snapshot.gpus[(node_id, proposal.gpu[1])]
        try:
            with transaction.atomic():
                node = Node.objects.select_for_update().get(pk=node_id)
                # Under the node's lock no cycle binds on it (binding needs the lock and raises the version).
                count = ComputeUnit.objects.filter(gpu_id=gpu.pk).count()
                claimed = Repartition.objects.filter(gpu_id=gpu.pk, state=Repartition.State.WAITING).exists()
                if claimed or count != gpu.unit_count or gpu_units_held(gpu_id=gpu.pk):
                    logger.info("scheduling: %s changed since the snapshot; not pre-carved", gpu.view.name)
                    continue
                # The units' history, which the delete would take with it.
                hooks.gpu_units_deleting(gpu_id=gpu.pk)
                ComputeUnit.objects.filter(gpu_id=gpu.pk).delete()
                mig_units_create(
                    gpu_id=gpu.pk,
                    model=gpu.view.model,
                    layout=[(slot.mig_profile, slot.mig_start) for slot in proposal.plan.layout],
                )
                # A cycle that read the old units must lose its race on them: raise the node's version.
                Node.objects.filter(pk=node_id).update(version=F("version") + 1)
                generation = hooks.desired_generation(node=node, now=now)
                # The agent applies the new layout: its poll or heartbeat hears.
                hooks.nodes_changed([node_id])
                Repartition.objects.create(
                    pool_id=snapshot.pool_id,
                    gpu_id=gpu.pk,
                    task=None,
                    cycle=cycle,
                    generation=generation,
                    layout=[[slot.mig_profile, slot.mig_start] for slot in proposal.plan.layout],
                    state=Repartition.State.AHEAD,
                    created_at=now,
                    closed_at=now,
                    reason=proposal.reason[:500],
                )
                done += 1
        except Node.DoesNotExist:
            continue
    return done
