//! Collecting with plain loops.
//!
//! Why: in the component, every `iter().map(..).collect()` brings its own
//! instance of the adapters and of `Vec`'s collecting specialisations, and
//! collecting into a `Result` brings a few more; a loop over `push` costs a
//! few dozen bytes. These helpers keep the call sites as short as the
//! iterator form.

#[allow(unused_imports)]
use crate::prelude::*;

/// `items.iter().map(f).collect::<Vec<_>>()`.
pub(crate) fn map<T, U>(items: &[T], mut f: impl FnMut(&T) -> U) -> Vec<U> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        out.push(f(item));
    }
    out
}

/// `items.iter().map(f).collect::<Result<Vec<_>, String>>()`: the first
/// error, or every item mapped.
pub(crate) fn try_map<T, U>(items: &[T], mut f: impl FnMut(&T) -> Result<U, String>) -> Result<Vec<U>, String> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        out.push(f(item)?);
    }
    Ok(out)
}
