from tests.apps.fleet.conftest import agent_client, fleet  # noqa: F401  (the world with node credentials)
