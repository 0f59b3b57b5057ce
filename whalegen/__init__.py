"""WhaleGen: a control plane for GPU pools that schedules compute units, not whole cards."""

__version__ = "0.1.0"
