"""Invocations: the latest progress, the checkpoints and the callback URL of each
invocation (folded from tool.execution.progressed / checkpointed and the request).

Revision ID: 0010_timeline
Revises: 0007
Create Date: 2026-11-27 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010_timeline'
down_revision = '0009_definitions'
branch_labels = None
depends_on = None

COLUMNS = (
    ('callback_url', sa.Text(), None),
    ('progress_sequence', sa.Integer(), None),
    ('progress_fraction', sa.Float(), None),
    ('progress_message', sa.Text(), None),
    ('progress_at', sa.String(length=32), None),
    ('checkpoints', sa.Integer(), '0'),
    ('checkpoint_bytes', sa.BigInteger(), '0'),
    ('checkpoint_stored_bytes', sa.BigInteger(), '0'),
    ('last_checkpoint_hash', sa.String(length=80), None),
)


def upgrade() -> None:
    with op.batch_alter_table('invocations') as batch:
        for name, kind, default in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=default is None,
                                       server_default=default))


def downgrade() -> None:
    with op.batch_alter_table('invocations') as batch:
        for name, _, _ in reversed(COLUMNS):
            batch.drop_column(name)
