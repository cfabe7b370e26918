//! What a flush needs from the host before its first step: the batch's
//! uids, the seed, the durability of its COMMIT, and an unsettled capture
//! that keeps the batch from the database. The flush machine runs on it,
//! and its outcome hands the uids back in the report.

#[allow(unused_imports)]
use crate::prelude::*;
use serde::{Deserialize, Serialize};

use crate::model::{Cause, Durability};

/// Everything a flush needs from the host before its first step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FlushStart {
    pub session: String,
    /// The uid of every message, in batch order: the batch size is its length.
    pub uids: Vec<String>,
    /// The uids the host minted for messages that came without one.
    pub minted_uids: Vec<String>,
    /// The seed of the retry jitter.
    pub seed: u64,
    /// An unsettled capture that holds rows of this session the database
    /// lacks, as the host read it from the capture's manifest. The batch is
    /// diverted with the capture's cause, without touching the database:
    /// a commit now would build on a history without those rows.
    #[serde(default)]
    pub pending_capture: Option<PendingCapture>,
    /// How the host's COMMIT reaches the disk. A commit under
    /// [`Durability::Unsynced`] is reported `durable: false`, and its copy
    /// never says "saved" without saying that.
    #[serde(default)]
    pub durability: Durability,
}

/// A capture of a retired generation that is not settled yet.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PendingCapture {
    /// Absolute path of the capture folder.
    pub path: String,
    /// The cause its manifest records.
    pub cause: Cause,
}
