"""Django apps of the control plane. Each: models, services (write), selectors (read), api/, tasks."""
