"""Alembic history of the projection store (one history: SQLite and PostgreSQL)."""
