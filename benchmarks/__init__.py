"""Benchmarks: print figures and ratios against a baseline measured in the same run; never fail on speed."""
