"""Placement engine: snapshot types, filters, scores and `solve_cycle`. Pure: no Django, no I/O."""
