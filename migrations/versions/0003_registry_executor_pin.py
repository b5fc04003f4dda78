"""Registry: the executor version (and integrity) each tool version was published with.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('registry_versions') as batch:
        batch.add_column(sa.Column('executor_pin', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('registry_versions') as batch:
        batch.drop_column('executor_pin')
