"""Trace loaders and the replay harness that drives the placement engine. Pure: no Django."""
