"""Pinned MCP tool definitions: one row per (server tool id, MCP tool name).

Revision ID: 0009_definitions
Revises: 0007
Create Date: 2026-11-27 12:15:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009_definitions'
down_revision = '0008_approvals'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tool_definitions',
        sa.Column('server_tool_id', sa.String(200), primary_key=True),
        sa.Column('mcp_tool_name', sa.String(200), primary_key=True),
        sa.Column('state', sa.String(20), nullable=False),
        sa.Column('definition_hash', sa.String(80), nullable=False),
        sa.Column('definition', sa.JSON(), nullable=False),
        sa.Column('pinned_how', sa.String(20), nullable=False),
        sa.Column('approved_by', sa.String(200)),
        sa.Column('server_version', sa.String(100)),
        sa.Column('server_integrity', sa.String(80)),
        sa.Column('pinned_at', sa.String(32), nullable=False),
        sa.Column('pin_event_id', sa.String(200), nullable=False),
        sa.Column('pending', sa.JSON(), nullable=False),
        sa.Column('event_ids', sa.JSON(), nullable=False),
        sa.Column('updated_at', sa.String(32), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('tool_definitions')
