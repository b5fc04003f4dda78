"""Fixtures shared by every test package."""

from tests.redis_server import redis_url  # noqa: F401  (a real Redis for the session)
