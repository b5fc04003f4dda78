"""Fixtures shared by every test package."""

from hypothesis import settings

from tests.redis_server import redis_url  # noqa: F401  (a real Redis for the session)

# Property tests run on busy 2-core machines: no example may fail for taking long.
settings.register_profile("toolexec", deadline=None)
settings.load_profile("toolexec")
