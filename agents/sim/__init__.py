"""Simulated NVML: Layer A (`core`, pure Python), Layer B (`shim`, pynvml's C library stand-in)."""
