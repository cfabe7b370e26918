//! A write transaction on PostgreSQL, as every writer here begins one:
//! with the `synchronous_commit` its outcome reports (`SET LOCAL`), and
//! the rules it checks. A leaf: it imports nothing of the engine, so every
//! room of `pg/` may use it.

use postgres::Client;

/// The `synchronous_commit` level every write transaction on a connection
/// sets for itself: `level` as `SHOW synchronous_commit` gave it at
/// connect; `None` for `off`, which promises nothing.
///
/// Why per transaction: the server's setting can change under a live
/// connection (a reload of `postgresql.conf`, `ALTER SYSTEM`), and a
/// connection pooler may hand the next transaction another backend with
/// other session settings. A setting local to the transaction is the one
/// neither can undo before its COMMIT, so `durable: true` stays true of
/// every batch it is reported for.
pub(super) fn sync_level(level: &str) -> Option<&'static str> {
    Some(match level {
        "off" => return None,
        "local" => "local",
        "remote_write" => "remote_write",
        "remote_apply" => "remote_apply",
        // `on`, and any spelling this build does not know: the default,
        // which waits for the local flush and the synchronous standbys.
        _ => "on",
    })
}

/// A select-list expression (a literal, for `concat!`) that sets the
/// transaction's level from parameter `$n` (a level, or NULL for none), as
/// `SET LOCAL` does (`set_config(..., true)`): a write's first statement
/// carries it, so the setting costs no round trip of its own.
macro_rules! set_level_sql {
    ($n:literal) => {
        concat!(
            "CASE WHEN $",
            $n,
            "::text IS NULL THEN NULL ELSE set_config('synchronous_commit', $",
            $n,
            "::text, true) END"
        )
    };
}
pub(super) use set_level_sql;

/// What every write transaction on a connection checks and sets: the
/// database's generation the handle opened, and the [`sync_level`].
#[derive(Clone, Copy)]
pub(super) struct TxRules<'a> {
    pub generation: &'a str,
    pub sync_level: Option<&'a str>,
}

/// A write transaction on `client` that first sets `level` (see
/// [`sync_level`]) with `SET LOCAL`: one more round trip than `BEGIN`
/// alone, for the edits and migrations, which are not on a batch's path.
pub(super) fn begin<'c>(
    client: &'c mut Client,
    level: Option<&str>,
) -> Result<postgres::Transaction<'c>, postgres::Error> {
    let mut tx = client.transaction()?;
    if let Some(level) = level.and_then(sync_level) {
        tx.batch_execute(&format!("SET LOCAL synchronous_commit = {level}"))?;
    }
    Ok(tx)
}
