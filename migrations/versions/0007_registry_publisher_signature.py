"""Registry: the publisher signature (key id and signature) of each tool version.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 16:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('registry_versions') as batch:
        batch.add_column(sa.Column('publisher_signature', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('registry_versions') as batch:
        batch.drop_column('publisher_signature')
