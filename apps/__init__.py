"""Django apps of the control plane. Each: models, services (write), selectors (read), api/, tasks.

`LAYERS` is the order the apps import each other in: an app imports only apps before it (lower), never
one after it. docs/architecture.md says why each app sits where it does; tests/test_import_rules.py
holds every import, at module level or inside a function, to it.
"""

LAYERS = (
    "common",
    "periodic",
    "tenants",
    "inventory",
    "workloads",
    "approvals",
    "scheduling",
    "accounting",
    "fleet",
    "forecasting",
    "logs",
    "declarative",
    "metrics",
    "dashboard",
)
