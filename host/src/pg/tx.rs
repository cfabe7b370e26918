//! A write transaction on PostgreSQL, as every writer here begins one:
//! with the `synchronous_commit` its outcome reports (`SET LOCAL`), and
//! the rules it checks. A leaf: it imports nothing of the engine, so every
//! room of `pg/` may use it.

use postgres::Client;

/// The `SET LOCAL` that keeps `level` (`SHOW synchronous_commit` at
/// connect) for one transaction; `None` for `off`, which promises nothing.
///
/// Why per transaction: the server's setting can change under a live
/// connection (a reload of `postgresql.conf`, `ALTER SYSTEM`), and a
/// connection pooler may hand the next transaction another backend with
/// other session settings. A `SET LOCAL` inside the transaction is the one
/// setting neither can undo before its COMMIT, so `durable: true` stays
/// true of every batch it is reported for.
pub(super) fn sync_local(level: &str) -> Option<&'static str> {
    Some(match level {
        "off" => return None,
        "local" => "SET LOCAL synchronous_commit = local",
        "remote_write" => "SET LOCAL synchronous_commit = remote_write",
        "remote_apply" => "SET LOCAL synchronous_commit = remote_apply",
        // `on`, and any spelling this build does not know: the default,
        // which waits for the local flush and the synchronous standbys.
        _ => "SET LOCAL synchronous_commit = on",
    })
}

/// What every write transaction on a connection checks and sets: the
/// database's generation the handle opened, and the [`sync_local`].
#[derive(Clone, Copy)]
pub(super) struct TxRules<'a> {
    pub generation: &'a str,
    pub sync_local: Option<&'a str>,
}

/// A write transaction on `client` that first sets `sync_local` (see
/// [`sync_local`]). One more round trip than `BEGIN` alone.
pub(super) fn begin<'c>(
    client: &'c mut Client,
    sync_local: Option<&str>,
) -> Result<postgres::Transaction<'c>, postgres::Error> {
    let mut tx = client.transaction()?;
    if let Some(sql) = sync_local {
        tx.batch_execute(sql)?;
    }
    Ok(tx)
}
