"""Periodic work with a leader: Celery beat on two or more hosts, one of them sending (docs/operations.md)."""
