"""Operator metrics: the Prometheus scrape endpoint `/metrics` (see docs/metrics.md)."""
