"""The measured checkout's settings with the floor endpoints routed in front of its URLs."""

from whalegen.config.settings import *  # noqa: F403

ROOT_URLCONF = "wg_floor_urls"
