"""Registry search: ranked full-text index (and, where pgvector is, stored embeddings).

`registry_tools` gets the indexed fields besides `description` (`search_name`,
`search_tags`, `search_parameters`) and `search_hash`, filled here for existing rows.
SQLite: an FTS5 table `registry_search` (porter stemmer) over those columns, with
`registry_tools` as its external content, kept by triggers. PostgreSQL: a stored
generated `search_vector` tsvector column (weights A..D by field) with a GIN index,
and, when the `vector` extension can be created, `registry_embeddings` (one vector per
content hash and model; outside the registry read model, so a rebuild reuses them).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 15:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

COLUMNS = ("search_name", "search_tags", "search_parameters")
FTS_COLUMNS = ("search_name", "search_tags", "description", "search_parameters")


def upgrade() -> None:
    with op.batch_alter_table("registry_tools") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("search_hash", sa.String(64), nullable=False,
                                   server_default=""))
    _fill_existing_rows()
    if op.get_bind().dialect.name == "postgresql":
        _postgresql_index()
    else:
        _sqlite_index()


def _fill_existing_rows() -> None:
    from domain.search import content_hash, field_texts

    bind = op.get_bind()
    tools = sa.table("registry_tools", sa.column("tool_id"), sa.column("current_version"),
                     sa.column("latest_version"), sa.column("description"),
                     sa.column("tags", sa.JSON()),
                     *(sa.column(name) for name in (*COLUMNS, "search_hash")))
    versions = sa.table("registry_versions", sa.column("tool_id"), sa.column("version"),
                        sa.column("manifest", sa.JSON()))
    for row in bind.execute(sa.select(tools)).mappings().all():
        shown = row["current_version"] or row["latest_version"]
        manifest = bind.execute(sa.select(versions.c.manifest).where(
            versions.c.tool_id == row["tool_id"], versions.c.version == shown)).scalar() or {}
        fields = field_texts(row["tool_id"], manifest, row["tags"] or [])
        bind.execute(tools.update().where(tools.c.tool_id == row["tool_id"]).values(
            search_name=fields["name"], search_tags=fields["tags"],
            search_parameters=fields["parameters"],
            search_hash=content_hash({**fields, "description": row["description"]})))


def _sqlite_index() -> None:
    columns = ", ".join(FTS_COLUMNS)
    new = ", ".join(f"new.{c}" for c in FTS_COLUMNS)
    old = ", ".join(f"old.{c}" for c in FTS_COLUMNS)
    op.execute(f"CREATE VIRTUAL TABLE registry_search USING fts5({columns}, "
               "content='registry_tools', content_rowid='rowid', "
               "tokenize='porter unicode61 remove_diacritics 2')")
    op.execute("CREATE TRIGGER registry_search_insert AFTER INSERT ON registry_tools BEGIN "
               f"INSERT INTO registry_search(rowid, {columns}) VALUES (new.rowid, {new}); END")
    op.execute("CREATE TRIGGER registry_search_delete AFTER DELETE ON registry_tools BEGIN "
               f"INSERT INTO registry_search(registry_search, rowid, {columns}) "
               f"VALUES ('delete', old.rowid, {old}); END")
    op.execute("CREATE TRIGGER registry_search_update AFTER UPDATE ON registry_tools BEGIN "
               f"INSERT INTO registry_search(registry_search, rowid, {columns}) "
               f"VALUES ('delete', old.rowid, {old}); "
               f"INSERT INTO registry_search(rowid, {columns}) VALUES (new.rowid, {new}); END")
    op.execute("INSERT INTO registry_search(registry_search) VALUES ('rebuild')")


def _postgresql_index() -> None:
    weighted = " || ".join(
        f"setweight(to_tsvector('english', coalesce({column}, '')), '{weight}')"
        for column, weight in zip(FTS_COLUMNS, "ABCD", strict=True))
    op.execute("ALTER TABLE registry_tools ADD COLUMN search_vector tsvector "
               f"GENERATED ALWAYS AS ({weighted}) STORED")
    op.execute("CREATE INDEX registry_search_vector ON registry_tools USING GIN (search_vector)")
    bind = op.get_bind()
    try:
        with bind.begin_nested():
            bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
    except sa.exc.DBAPIError:
        return  # no pgvector on this server: search stays full-text only
    op.execute("CREATE TABLE registry_embeddings (content_hash varchar(64) NOT NULL, "
               "model varchar(200) NOT NULL, embedding vector NOT NULL, "
               "PRIMARY KEY (content_hash, model))")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TABLE IF EXISTS registry_embeddings")
        op.execute("DROP INDEX IF EXISTS registry_search_vector")
        op.execute("ALTER TABLE registry_tools DROP COLUMN IF EXISTS search_vector")
    else:
        for action in ("insert", "delete", "update"):
            op.execute(f"DROP TRIGGER IF EXISTS registry_search_{action}")
        op.execute("DROP TABLE IF EXISTS registry_search")
    with op.batch_alter_table("registry_tools") as batch:
        for name in (*COLUMNS, "search_hash"):
            batch.drop_column(name)
