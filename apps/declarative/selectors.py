"""Reads: the objects of a kind as documents (`get -o yaml`), through what the caller may see, with where
each was last applied from."""

from __future__ import annotations

from typing import Any

from django.http import Http404

from apps.declarative.kinds import Kind
from apps.declarative.models import AppliedObject, GpuPrice
from apps.declarative.services import API_VERSION
from apps.tenants.selectors import Access


def document_of(kind: Kind, obj: Any, source: str | None) -> dict[str, Any]:
    """The object as a document `apply` takes back unchanged (its `status` is ignored there)."""
    metadata: dict[str, Any] = dict(kind.ident_of(obj))
    if kind.has_labels:
        metadata["labels"] = kind.labels_of(obj)
    current = kind.current(obj)
    spec = {name: current[name] for name, rule in kind.fields.items() if rule.compared}
    status = {**kind.status(obj), "applied_from": source}
    return {
        "apiVersion": API_VERSION,
        "kind": kind.name,
        "metadata": metadata,
        "spec": spec,
        "status": status,
    }


def _labels_match(kind: Kind, obj: Any, selector: dict[str, str]) -> bool:
    labels = kind.labels_of(obj)
    return all(labels.get(key) == value for key, value in selector.items())


def documents_list(
    *, kind: Kind, access: Access, name: str | None = None, selector: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every object of `kind` the caller may see (or the one keyed `name`), as documents, by key."""
    objs = [obj for obj in kind.visible(access) if name is None or kind.key(kind.ident_of(obj)) == name]
    if selector:
        objs = [obj for obj in objs if _labels_match(kind, obj, selector)]
    sources = dict(AppliedObject.objects.filter(kind=kind.name).values_list("key", "source"))
    keyed = sorted(((kind.key(kind.ident_of(obj)), obj) for obj in objs), key=lambda pair: pair[0])
    return [document_of(kind, obj, sources.get(key)) for key, obj in keyed]


def document_get(*, kind: Kind, access: Access, name: str) -> dict[str, Any]:
    found = documents_list(kind=kind, access=access, name=name)
    if not found:
        raise Http404(f"no {kind.name.lower()} {name!r}")
    return found[0]


def applied_source(*, kind: str, key: str) -> str:
    """Where the object was last applied from ("" when no file applied it), for the admin's column."""
    return AppliedObject.objects.filter(kind=kind, key=key).values_list("source", flat=True).first() or ""


def gpu_prices_applied() -> dict[str, float]:
    """GPU model → price per GPU-hour of every GpuPrice document applied; accounting reads it through
    apps.common.hooks.gpu_prices_applied, with these winning over WHALEGEN_GPU_PRICES."""
    return dict(GpuPrice.objects.values_list("model", "per_gpu_hour"))
