"""Applied event ids are kept only for the read models that need them.

The invocations read model now recognises a repeated event by the ids already in its
timeline, and the audit trail is keyed by log position: neither writes nor reads
`projection_applied` rows any more, so theirs are deleted. Registry and circuits keep
theirs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 11:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM projection_applied WHERE consumer IN ('invocations', 'audit')")


def downgrade() -> None:
    # The deleted ids cannot be recovered, and code of revision 0003 does not need them
    # to be correct: it only skips fewer repeated events until its next rebuild.
    pass
