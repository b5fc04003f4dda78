"""Log identity of the read models: the record before each stored position, the cluster.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('projection_offsets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_record', sa.String(length=64), nullable=True))
    op.create_table('projection_sources',
    sa.Column('consumer', sa.String(length=100), nullable=False),
    sa.Column('cluster_id', sa.String(length=200), nullable=True),
    sa.Column('updated_at', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('consumer')
    )


def downgrade() -> None:
    op.drop_table('projection_sources')
    with op.batch_alter_table('projection_offsets', schema=None) as batch_op:
        batch_op.drop_column('last_record')
