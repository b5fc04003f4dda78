"""The audit trail keeps each fact's signature verdict.

`audit_log.signature`: for a record of a signed topic (the pipeline's facts, circuit
transitions), how its pipeline signature checked out when it was folded (`valid`,
`unsigned`, `unknown_key`, `invalid`); NULL for records no signature is expected on,
and for rows folded before this revision (a rebuild fills it in).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("signature", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("signature")
