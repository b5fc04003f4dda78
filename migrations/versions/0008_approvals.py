"""Approvals read model: one row per invocation that waited for an approver.

Revision ID: 0008_approvals
Revises: 0007
Create Date: 2026-11-27 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008_approvals'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'approvals',
        sa.Column('invocation_id', sa.String(200), primary_key=True),
        sa.Column('tool_id', sa.String(200)),
        sa.Column('version', sa.String(100)),
        sa.Column('integrity', sa.String(71)),
        sa.Column('subject', sa.String(200)),
        sa.Column('policy_version', sa.String(200)),
        sa.Column('call_hash', sa.String(71)),
        sa.Column('parameters', sa.JSON()),
        sa.Column('reasons', sa.JSON()),
        sa.Column('requested_at', sa.String(32)),
        sa.Column('expires_at', sa.String(32)),
        sa.Column('decision', sa.String(10)),
        sa.Column('approved_hash', sa.String(71)),
        sa.Column('decided_by', sa.String(200)),
        sa.Column('decision_reason', sa.Text()),
        sa.Column('decided_at', sa.String(32)),
        sa.Column('outcome', sa.String(20)),
        sa.Column('error_code', sa.String(10)),
        sa.Column('finished_at', sa.String(32)),
    )
    op.create_index('ix_approvals_pending', 'approvals', ['outcome', 'expires_at'])


def downgrade() -> None:
    op.drop_index('ix_approvals_pending', table_name='approvals')
    op.drop_table('approvals')
