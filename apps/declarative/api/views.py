"""Declarative objects over HTTP: apply documents, read any kind as documents, and the two lists no
other app had (members, GPU prices). Who may write what is each kind's rule (apps.declarative.kinds):
platform admins everything, tenant admins their tenants' members and queues."""

from __future__ import annotations

from dataclasses import asdict

from django.conf import settings
from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounting.selectors import gpu_prices
from apps.declarative import selectors, services
from apps.declarative.api import serializers as s
from apps.declarative.kinds import KINDS, Kind, MemberKind, kind_named
from apps.declarative.models import GpuPrice
from apps.tenants.access import request_access
from apps.tenants.models import Membership

KIND_NAMES = ", ".join(kind.plural for kind in KINDS)


def _kind(word: str) -> Kind:
    kind = kind_named(word)
    if kind is None:
        raise Http404(f"no kind {word!r}; the kinds are {KIND_NAMES}")
    return kind


def _selector(text: str) -> dict[str, str]:
    """`zone=eu-a,gpu=H100-80GB` → {"zone": "eu-a", "gpu": "H100-80GB"} (kubectl's equality selectors)."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    return {key.strip(): value.strip() for key, value in (pair for pair in pairs if len(pair) == 2)}


class ApplyApi(APIView):
    @extend_schema(
        operation_id="apply",
        request=s.ApplyInputSerializer,
        responses=s.ApplyOutputSerializer,
        summary="Apply documents (kubectl apply): created, configured, unchanged, pruned or refused",
    )
    def post(self, request: Request) -> Response:
        data = s.ApplyInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        results = services.objects_apply(
            documents=values["documents"],
            sources=values["sources"],
            access=request_access(request),
            user=request.user,
            dry_run=values["dry_run"],
            prune=values["prune"],
        )
        body = {"dry_run": values["dry_run"], "results": [asdict(result) for result in results]}
        return Response(s.ApplyOutputSerializer(body).data)


SELECTOR = OpenApiParameter("selector", str, description="labels, `key=value[,key=value]` (nodes)")
NAME = OpenApiParameter("name", str, description="only the object of this key")


class DocumentListApi(APIView):
    @extend_schema(
        operation_id="objects_list",
        parameters=[NAME, SELECTOR],
        responses=s.DocumentListSerializer,
        summary=f"The objects of a kind ({KIND_NAMES}) as documents `apply` takes back",
    )
    def get(self, request: Request, kind: str) -> Response:
        found = _kind(kind)
        items = selectors.documents_list(
            kind=found,
            access=request_access(request),
            name=request.query_params.get("name") or None,
            selector=_selector(request.query_params.get("selector", "")),
        )
        return Response({"kind": found.name, "items": items})


class DocumentDetailApi(APIView):
    @extend_schema(
        operation_id="objects_retrieve",
        responses=s.DocumentListSerializer,
        summary="One object as a document; 404 when it does not exist or is not yours to see",
    )
    def get(self, request: Request, kind: str, name: str) -> Response:
        found = _kind(kind)
        document = selectors.document_get(kind=found, access=request_access(request), name=name)
        return Response({"kind": found.name, "items": [document]})


class MemberListApi(generics.ListAPIView):
    """Memberships of the tenants the caller belongs to (all, for platform admins)."""

    serializer_class = s.MemberOutputSerializer
    filterset_class = None

    def get_queryset(self) -> QuerySet[Membership]:
        return MemberKind().visible(request_access(self.request))


class PriceListApi(APIView):
    @extend_schema(operation_id="prices_list", responses=s.PriceOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        applied = set(GpuPrice.objects.values_list("model", flat=True))
        rows = [
            {
                "model": model,
                "per_gpu_hour": price,
                "currency": settings.WHALEGEN_CURRENCY,
                "source": "applied" if model in applied else "environment",
            }
            for model, price in sorted(gpu_prices().items())
        ]
        return Response(s.PriceOutputSerializer(rows, many=True).data)
