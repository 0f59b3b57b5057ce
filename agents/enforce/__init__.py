"""Enforcers: MIG layouts, MPS daemons, time-slice memory watchdog. Each is idempotent."""
