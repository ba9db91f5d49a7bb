-- schema.sql - the SQLite store's tables (src/stores/sqlite.c), created
-- when a file is opened for the first time. Every statement is IF NOT
-- EXISTS: the store runs this whole file on a file of schema version 0 and
-- on one that has no lease_history yet (a table added without raising the
-- version), then sets PRAGMA user_version = 1 when it was below. Runnable
-- alone: sqlite3 lease.db < schema.sql.
--
-- A row per key ever acquired, kept forever (release only clears the
-- owner), so the token counter survives release and expiry.
CREATE TABLE IF NOT EXISTS lease (
    key         TEXT PRIMARY KEY,
    -- NULL when free
    owner       TEXT,
    label       TEXT NOT NULL DEFAULT '',
    token       INTEGER NOT NULL DEFAULT 0 CHECK (token >= 0),
    -- the kernel's boot id when expires_ms was written
    boot_id     TEXT NOT NULL DEFAULT '',
    -- CLOCK_BOOTTIME, ms
    expires_ms  INTEGER NOT NULL DEFAULT 0,
    ttl_ms      INTEGER NOT NULL DEFAULT 0,
    acquired_ms INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- The highest token seen by each fenced resource.
CREATE TABLE IF NOT EXISTS lease_fence (
    resource TEXT PRIMARY KEY,
    mark     INTEGER NOT NULL CHECK (mark >= 0)
) WITHOUT ROWID;

-- Values written under a lease (lease_guarded_put), with the token that
-- wrote them.
CREATE TABLE IF NOT EXISTS lease_data (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    token INTEGER NOT NULL,
    key   TEXT NOT NULL
) WITHOUT ROWID;

-- The grant history: one row per grant, the newest LEASE_HISTORY_KEEP of
-- each key. Newer than schema version 1, which it does not raise: older
-- builds ignore it.
CREATE TABLE IF NOT EXISTS lease_history (
    key         TEXT NOT NULL,
    token       INTEGER NOT NULL,
    owner       TEXT NOT NULL,
    label       TEXT NOT NULL DEFAULT '',
    ttl_ms      INTEGER NOT NULL DEFAULT 0,
    -- wall clock, ms
    acquired_ms INTEGER NOT NULL,
    -- lease_ended: 0 held, 1 released, 2 expired, 3 lost
    ended       INTEGER NOT NULL DEFAULT 0,
    -- wall clock, ms; 0 unknown
    ended_ms    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, token)
) WITHOUT ROWID;
