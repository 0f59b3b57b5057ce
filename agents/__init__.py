"""The node agent: GPU backends (real and simulated NVML), reconcile loop, enforcers, runner."""
