"""`apply`: documents in, one result per object out (created, configured, unchanged, pruned, refused),
each with its field-level difference.

1. Parse every document against its kind (apps.declarative.kinds). Any invalid document stops the whole
   apply before anything is written; each message names the document, the path and the field
   (`fleet.yaml#3 spec.guaranteed_gpus: …`).
2. Apply in dependency order (clusters, pools, nodes, tenants, members, queues, quotas, budgets,
   prices), each object in its own savepoint: a refused object (a reference that does not exist, a change
   the object does not allow, a caller without the role) is reported and the others go on.
3. With `prune`: delete what an earlier apply made, of the kinds these documents hold, that they no longer
   name — in reverse order, each refused with its reason while in use.
4. Dry run: all of the above inside one transaction that is rolled back, so the difference shown is the
   one the services would really make (their validation included), and nothing stays.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.common.errors import ApplicationError
from apps.declarative import kinds as k
from apps.declarative.fields import FieldError
from apps.declarative.models import AppliedObject
from apps.tenants.selectors import Access
from apps.workloads.services import user_actor

API_VERSION = "whalegen/v1"
TOP_LEVEL = {"apiVersion", "kind", "metadata", "spec", "status"}


class Outcome:
    CREATED = "created"
    CONFIGURED = "configured"
    UNCHANGED = "unchanged"
    PRUNED = "pruned"
    REFUSED = "refused"


@dataclass(frozen=True)
class Document:
    kind: k.Kind
    ident: dict[str, str]
    labels: dict[str, str]
    spec: dict[str, Any]  # every field: given, defaulted, or k.KEEP
    source: str

    @property
    def key(self) -> str:
        return self.kind.key(self.ident)


@dataclass
class Result:
    kind: str
    key: str
    outcome: str
    source: str = ""
    diff: dict[str, list[Any]] = field(default_factory=dict)  # "spec.weight": [old, new]
    reason: str = ""
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- parsing


def _parse_metadata(kind: k.Kind, metadata: Any, where: str, errors: list[str]) -> tuple[dict, dict]:
    if not isinstance(metadata, dict):
        errors.append(f"{where} metadata: is missing or not a mapping; write metadata: {{name: …}}")
        return {}, {}
    allowed = {*kind.identity, "labels", "annotations"}
    for key in sorted(set(metadata) - allowed):
        errors.append(
            f"{where} metadata.{key}: unknown; a {kind.name}'s metadata has {', '.join(kind.identity)}"
        )
    ident = {}
    for part in kind.identity:
        value = metadata.get(part)
        if not isinstance(value, str) or not value.strip():
            errors.append(f"{where} metadata.{part}: is required (text) for a {kind.name}")
        elif "/" in value or len(value) > 150:
            errors.append(f"{where} metadata.{part}: {value!r} may not contain '/' or exceed 150 characters")
        else:
            ident[part] = value
    labels: dict[str, str] = {}
    if "labels" in metadata:
        if not kind.has_labels:
            errors.append(f"{where} metadata.labels: a {kind.name} carries no labels (only nodes do)")
        else:
            try:
                labels = k.f.labels(metadata["labels"])
            except FieldError as exc:
                errors.append(f"{where} metadata.labels{exc.path}: {exc.message}")
    return ident, labels


def _parse_spec(kind: k.Kind, spec: Any, where: str, errors: list[str]) -> dict[str, Any]:
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        errors.append(f"{where} spec: is not a mapping; write spec: {{field: value}}")
        return {}
    for key in sorted(set(spec) - set(kind.fields)):
        errors.append(f"{where} spec.{key}: unknown field; a {kind.name}'s spec has {', '.join(kind.fields)}")
    out: dict[str, Any] = {}
    for name, rule in kind.fields.items():
        if name not in spec:
            if rule.default is k.REQUIRED:
                errors.append(f"{where} spec.{name}: is required for a {kind.name}")
            else:
                out[name] = _plain(rule.default)
            continue
        try:
            out[name] = rule.parse(spec[name])
        except FieldError as exc:
            errors.append(f"{where} spec.{name}{exc.path}: {exc.message}")
    return out


def _plain(default: Any) -> Any:
    """A default as YAML would have given it: TextChoices members as plain strings, lists copied."""
    if isinstance(default, str):
        return str(default)
    return copy.deepcopy(default) if isinstance(default, (list, dict)) else default


def documents_parse(documents: Sequence[Any], sources: Sequence[str]) -> list[Document]:
    """Every document checked; raises ValidationError({"documents": [one line per problem]})."""
    errors: list[str] = []
    parsed: list[Document] = []
    seen: dict[tuple[str, str], str] = {}
    for index, raw in enumerate(documents):
        where = sources[index] if index < len(sources) and sources[index] else f"document#{index + 1}"
        if not isinstance(raw, dict):
            errors.append(f"{where}: is not a mapping; a document has kind, metadata and spec")
            continue
        version = raw.get("apiVersion", API_VERSION)
        if version != API_VERSION:
            errors.append(f"{where} apiVersion: {version!r} is not {API_VERSION!r}")
        kind = k.kind_named(str(raw.get("kind", "")))
        if kind is None or raw.get("kind") != kind.name:
            known = ", ".join(kind.name for kind in k.KINDS)
            errors.append(
                f"{where} kind: {raw.get('kind')!r} is not a kind apply knows; write one of {known}"
            )
            continue
        for key in sorted(set(raw) - TOP_LEVEL):
            errors.append(f"{where} {key}: unknown; a document has {', '.join(sorted(TOP_LEVEL))}")
        before = len(errors)
        ident, labels = _parse_metadata(kind, raw.get("metadata"), where, errors)
        spec = _parse_spec(kind, raw.get("spec"), where, errors)
        if len(errors) > before:
            continue
        document = Document(kind=kind, ident=ident, labels=labels, spec=spec, source=where)
        first = seen.setdefault((kind.name, document.key), where)
        if first != where:
            errors.append(f"{where}: {kind.name} {document.key!r} is already described by {first}")
            continue
        parsed.append(document)
    if errors:
        raise ValidationError({"documents": errors})
    return parsed


# ------------------------------------------------------------------------------------------- applying


def spec_hash(document: Document) -> str:
    body = {"kind": document.kind.name, "ident": document.ident, "labels": document.labels}
    body["spec"] = {name: value for name, value in document.spec.items() if value is not k.KEEP}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _difference(document: Document, obj: Any) -> tuple[dict[str, list[Any]], dict[str, Any], list[str]]:
    """(diff for people, the spec fields that change, notes) between the object and the document."""
    kind, current = document.kind, document.kind.current(obj)
    diff: dict[str, list[Any]] = {}
    changes: dict[str, Any] = {}
    notes: list[str] = []
    for name, rule in kind.fields.items():
        wanted = document.spec[name]
        if not rule.compared or wanted is k.KEEP or _same(current[name], wanted):
            continue
        if rule.create_only:
            if wanted != rule.default:
                notes.append(f"spec.{name} is read only when the object is made; left as it is")
            continue
        diff[f"spec.{name}"] = [current[name], wanted]
        changes[name] = wanted
    if kind.has_labels:
        old = kind.labels_of(obj)
        for label in sorted(set(old) | set(document.labels)):
            if old.get(label) != document.labels.get(label):
                diff[f"metadata.labels.{label}"] = [old.get(label), document.labels.get(label)]
    return diff, changes, notes


def _same(old: Any, new: Any) -> bool:
    # 8 == 8.0 and True != 1: YAML numbers compare by value, booleans only with booleans.
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    return bool(old == new)


def _refusal_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        if hasattr(exc, "error_dict"):
            return "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in exc.message_dict.items())
        return " ".join(exc.messages)
    if isinstance(exc, ApplicationError):
        return exc.message
    return str(exc)


def _record(document: Document, actor: str, *, changed: bool) -> None:
    """Mark the object as applied from its document. An object first made by hand is adopted: from now
    on its file owns it (and `--prune` may delete it)."""
    digest = spec_hash(document)
    record = AppliedObject.objects.filter(kind=document.kind.name, key=document.key).first()
    if record is not None and not changed and record.spec_hash == digest and record.source == document.source:
        return
    AppliedObject.objects.update_or_create(
        kind=document.kind.name,
        key=document.key,
        defaults={
            "source": document.source,
            "applied_by": actor,
            "applied_at": timezone.now(),
            "spec_hash": digest,
        },
    )


def _apply_one(document: Document, ctx: k.Context) -> Result:
    kind = document.kind
    result = Result(kind=kind.name, key=document.key, outcome=Outcome.UNCHANGED, source=document.source)
    refusal = kind.write_refusal(ctx.access, document.ident)
    if refusal:
        result.outcome, result.reason = Outcome.REFUSED, refusal
        return result
    ctx.source, ctx.spec, ctx.notes = document.source, document.spec, []
    try:
        with transaction.atomic():
            obj = kind.find(document.ident)
            if obj is None:
                obj = kind.create(document.ident, document.labels, document.spec, ctx)
                result.outcome = Outcome.CREATED
                result.diff = {
                    f"spec.{name}": [None, value]
                    for name, value in document.spec.items()
                    if value is not k.KEEP
                }
                result.diff.update(
                    {f"metadata.labels.{key}": [None, v] for key, v in document.labels.items()}
                )
            else:
                result.diff, changes, notes = _difference(document, obj)
                ctx.notes.extend(notes)
                if result.diff:
                    kind.update(obj, changes, document.labels if kind.has_labels else None, ctx)
                    result.outcome = Outcome.CONFIGURED
            _record(document, ctx.actor, changed=result.outcome != Outcome.UNCHANGED)
    except (ValidationError, ApplicationError) as exc:
        result.outcome, result.reason, result.diff = Outcome.REFUSED, _refusal_text(exc), {}
    result.notes = list(ctx.notes)
    return result


def _prune(documents: list[Document], ctx: k.Context) -> list[Result]:
    """Objects applied earlier from a document, of the kinds given now, that no document names now."""
    named = {(d.kind.name, d.key) for d in documents}
    kinds = sorted({d.kind for d in documents}, key=lambda kind: -kind.order)
    results: list[Result] = []
    for kind in kinds:
        for record in AppliedObject.objects.filter(kind=kind.name).order_by("-key"):
            if (kind.name, record.key) in named:
                continue
            ident = kind.ident_from_key(record.key)
            if kind.write_refusal(ctx.access, ident):
                continue  # someone else's (another tenant's queue): not this caller's to prune
            result = Result(kind=kind.name, key=record.key, outcome=Outcome.PRUNED, source=record.source)
            obj = kind.find(ident)
            if obj is None:  # gone by other means: only the record is left to forget
                record.delete()
                result.notes.append("already gone; its record is forgotten")
                results.append(result)
                continue
            reason = kind.delete_refusal(obj)
            if not reason:
                try:
                    with transaction.atomic():
                        kind.delete(obj, ctx)
                        record.delete()
                except (ValidationError, ApplicationError) as exc:
                    reason = _refusal_text(exc)
            if reason:
                result.outcome, result.reason = Outcome.REFUSED, f"not pruned: {reason}"
            results.append(result)
    return results


def objects_apply(
    *,
    documents: Sequence[Any],
    sources: Sequence[str] = (),
    access: Access,
    user: AbstractBaseUser | None,
    dry_run: bool = False,
    prune: bool = False,
) -> list[Result]:
    """Apply documents as `user` (None: the system, as the demo seeds itself); see the module's docstring."""
    parsed = documents_parse(documents, sources)  # 1
    ordered = sorted(parsed, key=lambda d: d.kind.order)  # stable: the file's order within a kind
    ctx = k.Context(access=access, user=user, actor=user_actor(user), source="")
    with transaction.atomic():
        results = [_apply_one(document, ctx) for document in ordered]  # 2
        if prune:
            results += _prune(parsed, ctx)  # 3
        if dry_run:
            transaction.set_rollback(True)  # 4
    return results
