//! Which engine a `Store` writes to: SQLite under the home, or a
//! PostgreSQL server with the divert folder under the home. Either one is
//! boxed behind the same `SharedStore`, so nothing past this room asks
//! which.

use std::path::Path;

use turnsafe_host::backend::LeaseOptions;
use turnsafe_host::pg::DbUrl;
use turnsafe_host::store::{SharedStore, StoreOptions};

/// The store of `home`: on the PostgreSQL server `db` names, else SQLite.
pub(crate) fn open(home: &Path, db: Option<&DbUrl>, opts: StoreOptions) -> Result<SharedStore, String> {
    let Some(url) = db else {
        return SharedStore::open(home, opts).map_err(|e| e.to_string());
    };
    // The divert folder is on this machine whatever the server does:
    // the home exists before the first batch.
    turnsafe_host::durable::create_dir_all(home, 0o700)
        .map_err(|e| format!("could not create {}: {e}", home.display()))?;
    let lease = LeaseOptions {
        holder: opts.holder,
        lease_ttl: opts.lease_ttl,
    };
    let store = turnsafe_host::pg::open_store(url.clone(), home, lease);
    Ok(SharedStore::over(store, home))
}
