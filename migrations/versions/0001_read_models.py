"""Read models: registry, invocations, circuits, audit trail, runner bookkeeping.

Revision ID: 0001
Revises:
Create Date: 2026-11-22 20:23:54.388111
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_heads',
    sa.Column('topic', sa.String(length=200), nullable=False),
    sa.Column('partition', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('last_offset', sa.BigInteger(), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.Column('records', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('topic', 'partition')
    )
    op.create_table('audit_log',
    sa.Column('topic', sa.String(length=200), nullable=False),
    sa.Column('partition', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('offset', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('event_id', sa.String(length=200), nullable=False),
    sa.Column('type', sa.String(length=100), nullable=False),
    sa.Column('time', sa.String(length=32), nullable=False),
    sa.Column('invocation_id', sa.String(length=200), nullable=True),
    sa.Column('tool_id', sa.String(length=200), nullable=True),
    sa.Column('document', sa.Text(), nullable=False),
    sa.Column('redactions', sa.Integer(), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('topic', 'partition', 'offset')
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index('ix_audit_log_invocation', ['invocation_id'], unique=False)
        batch_op.create_index('ix_audit_log_time', ['time'], unique=False)
        batch_op.create_index('ix_audit_log_tool', ['tool_id'], unique=False)
        batch_op.create_index('ix_audit_log_type', ['type'], unique=False)

    op.create_table('circuits',
    sa.Column('service_id', sa.String(length=200), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('previous_state', sa.String(length=20), nullable=False),
    sa.Column('failure_count', sa.Integer(), nullable=False),
    sa.Column('success_count', sa.Integer(), nullable=False),
    sa.Column('since', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('transitions', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('service_id')
    )
    op.create_table('invocations',
    sa.Column('invocation_id', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('tool_id', sa.String(length=200), nullable=True),
    sa.Column('version_range', sa.String(length=200), nullable=True),
    sa.Column('version', sa.String(length=100), nullable=True),
    sa.Column('subject', sa.String(length=200), nullable=True),
    sa.Column('requested_by', sa.String(length=200), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('duration_ms', sa.Float(), nullable=True),
    sa.Column('error_code', sa.String(length=10), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('failed_stage', sa.String(length=20), nullable=True),
    sa.Column('result_summary', sa.Text(), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('timeline', sa.JSON(), nullable=False),
    sa.Column('requested_at', sa.String(length=32), nullable=True),
    sa.Column('updated_at', sa.String(length=32), nullable=False),
    sa.Column('finished_at', sa.String(length=32), nullable=True),
    sa.PrimaryKeyConstraint('invocation_id')
    )
    with op.batch_alter_table('invocations', schema=None) as batch_op:
        batch_op.create_index('ix_invocations_tool_status', ['tool_id', 'status'], unique=False)

    op.create_table('projection_applied',
    sa.Column('consumer', sa.String(length=100), nullable=False),
    sa.Column('event_id', sa.String(length=200), nullable=False),
    sa.PrimaryKeyConstraint('consumer', 'event_id')
    )
    op.create_table('projection_offsets',
    sa.Column('consumer', sa.String(length=100), nullable=False),
    sa.Column('topic', sa.String(length=200), nullable=False),
    sa.Column('partition', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('next_offset', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('consumer', 'topic', 'partition')
    )
    op.create_table('registry_tools',
    sa.Column('tool_id', sa.String(length=200), nullable=False),
    sa.Column('tool_type', sa.String(length=40), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('current_version', sa.String(length=100), nullable=True),
    sa.Column('latest_version', sa.String(length=100), nullable=False),
    sa.Column('lifecycle', sa.String(length=20), nullable=False),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.Column('search_text', sa.Text(), nullable=False),
    sa.Column('versions_count', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('tool_id')
    )
    op.create_table('registry_versions',
    sa.Column('tool_id', sa.String(length=200), nullable=False),
    sa.Column('version', sa.String(length=100), nullable=False),
    sa.Column('tool_type', sa.String(length=40), nullable=False),
    sa.Column('executor', sa.String(length=200), nullable=True),
    sa.Column('integrity', sa.String(length=80), nullable=False),
    sa.Column('lifecycle', sa.String(length=20), nullable=False),
    sa.Column('lifecycle_reason', sa.Text(), nullable=True),
    sa.Column('replacement_tool_id', sa.String(length=200), nullable=True),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('manifest', sa.JSON(), nullable=False),
    sa.Column('files', sa.JSON(), nullable=False),
    sa.Column('published_at', sa.String(length=32), nullable=False),
    sa.Column('published_by', sa.String(length=200), nullable=True),
    sa.Column('source', sa.Text(), nullable=True),
    sa.Column('event_id', sa.String(length=200), nullable=False),
    sa.PrimaryKeyConstraint('tool_id', 'version')
    )


def downgrade() -> None:
    op.drop_table('registry_versions')
    op.drop_table('registry_tools')
    op.drop_table('projection_offsets')
    op.drop_table('projection_applied')
    with op.batch_alter_table('invocations', schema=None) as batch_op:
        batch_op.drop_index('ix_invocations_tool_status')

    op.drop_table('invocations')
    op.drop_table('circuits')
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index('ix_audit_log_type')
        batch_op.drop_index('ix_audit_log_tool')
        batch_op.drop_index('ix_audit_log_time')
        batch_op.drop_index('ix_audit_log_invocation')

    op.drop_table('audit_log')
    op.drop_table('audit_heads')
