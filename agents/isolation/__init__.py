"""How a run is isolated on its host: the sandbox plan the agent writes and the launcher carries out."""
