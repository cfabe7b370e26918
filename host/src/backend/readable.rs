//! One rule for every read through a handle: a handle that a sticky cause
//! quarantined (its database replaced or corrupt, its WAL deleted under
//! it, ...) reads nothing from that database, as it writes nothing to it.
//! What it would read is not the database it wrote to, or cannot be
//! trusted; the operator's steps come first.
//!
//! Every read of the [`super::Backend`] seam on either engine (`rows`,
//! `archived`, `transcript`, `search`, `stored_uids`, `graph_read`,
//! `identity`) calls [`readable`] before it touches the database, and so
//! refuses with the same error.

use std::fmt::Display;

use turnsafe_policy::Cause;

use super::ReadError;

/// `Ok` when a handle whose sticky cause is `sticky` may read `location`;
/// else the refusal every read gives: the sticky cause, and a message that
/// names the database (as it may be shown: never a password).
pub fn readable(sticky: Option<Cause>, location: &dyn Display) -> Result<(), ReadError> {
    match sticky {
        None => Ok(()),
        Some(cause) => Err(ReadError {
            message: format!("reading {location}: the store refuses to touch its database until an operator acts"),
            cause: Some(cause),
        }),
    }
}
