//! Failover under a stream of batches, for real: a primary and a streaming
//! standby named in `synchronous_standby_names` (an acknowledged commit is
//! on both), a writer on the multi-host URL with
//! `target_session_attrs=read-write`. The primary's postmaster is killed
//! with SIGKILL in the middle of the stream and the standby promoted. The
//! writer carries on: batches in flight wait (`unavailable`, `read_only`)
//! within the policy's patience and land on the new primary, or are
//! diverted; replay brings the diverted ones in. Recounted on the new
//! primary:
//! - every acknowledged message is stored, exactly once;
//! - no message is stored twice;
//! - every message not acknowledged is stored once, or was handed back.
mod common;
use std::collections::{BTreeMap, BTreeSet};

use common::pg_cluster::SyncPair;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::replay::ReplayOptions;

const BATCHES: usize = 40;
const KILL_AFTER: usize = 12;

#[test]
fn a_failover_mid_stream_loses_and_duplicates_nothing() {
    let mut pair = turnsafe_tests::require!(SyncPair::start());
    let db = pair.primary.create_db("failover");
    // The database exists on the standby once it has replayed its creation.
    let url = pair.multi_host_url(&db);
    // `doctor --db` on the primary: a standby in sync, so no warning.
    let primary_url: turnsafe_host::pg::DbUrl = pair.primary.url(&db).parse().expect("url");
    let (findings, facts) = turnsafe_host::doctor::examine_postgres(&primary_url, None);
    assert_eq!(facts["synchronous_replication"], true, "{facts}");
    assert!(findings.iter().all(|f| f.kind != "replication"), "{findings:?}");
    let home = Home::new();
    let mut store = pg::store(&url, home.path());

    let (sent, outcomes) = std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<usize>();
        let writer = scope.spawn(move || {
            let mut sent = Vec::new();
            let mut outcomes = Vec::new();
            for b in 0..BATCHES {
                let messages = batch(&format!("b{b}"), 3);
                sent.push(messages.iter().filter_map(|m| m.uid.clone()).collect::<Vec<_>>());
                outcomes.push(store.append_batch(&sid("s1"), &messages));
                let _ = tx.send(b);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            (sent, outcomes)
        });
        // SIGKILL the primary once the stream is under way, then promote.
        while let Ok(b) = rx.recv() {
            if b + 1 == KILL_AFTER {
                pair.kill_primary().expect("kill -9 the primary");
                pair.promote_standby().expect("promote the standby");
                break;
            }
        }
        writer.join().expect("writer")
    });

    let mut acknowledged = BTreeSet::new();
    let mut handed_back = BTreeSet::new();
    let mut causes: BTreeMap<String, usize> = BTreeMap::new();
    let mut diverted = 0;
    for (uids, out) in sent.iter().zip(&outcomes) {
        if let Some(c) = out.cause {
            *causes.entry(c.label().to_string()).or_default() += 1;
        }
        if out.persisted || out.receipt.is_some() {
            acknowledged.extend(uids.iter().cloned());
        }
        if out.receipt.is_some() {
            diverted += 1;
        }
        if out.handed_back > 0 {
            handed_back.extend(uids.iter().cloned());
        }
    }
    let url_new: turnsafe_host::pg::DbUrl = pair.standby.url(&db).parse().expect("url");
    let run = turnsafe_host::pg::replay::replay(
        home.path(),
        &url_new,
        &ReplayOptions {
            force: true,
            ..Default::default()
        },
    )
    .expect("replay into the new primary");
    let rows = pg::rows(&pair.standby, &db, "s1");
    let mut stored: BTreeMap<String, usize> = BTreeMap::new();
    for r in &rows {
        *stored.entry(r.0.clone()).or_default() += 1;
    }
    let lost: Vec<&String> = acknowledged.iter().filter(|u| stored.get(*u) != Some(&1)).collect();
    let duplicated: Vec<(&String, &usize)> = stored.iter().filter(|(_, n)| **n > 1).collect();
    let all: BTreeSet<String> = sent.iter().flatten().cloned().collect();
    let unaccounted: Vec<&String> = all
        .iter()
        .filter(|u| !stored.contains_key(*u) && !handed_back.contains(*u))
        .collect();
    println!(
        "failover: {} batches, {} acknowledged messages, {} diverted batches, {} replayed, causes {causes:?}, \
         lost {}, duplicated {}, unaccounted {}",
        BATCHES,
        acknowledged.len(),
        diverted,
        run.files.iter().map(|f| f.replayed).sum::<u64>(),
        lost.len(),
        duplicated.len(),
        unaccounted.len()
    );
    assert!(lost.is_empty(), "acknowledged messages lost: {lost:?}");
    assert!(duplicated.is_empty(), "duplicated: {duplicated:?}");
    assert!(
        unaccounted.is_empty(),
        "neither stored nor handed back: {unaccounted:?}"
    );
    assert!(
        causes.keys().any(|c| c == "unavailable" || c == "read_only"),
        "the failover was met by the writer: {causes:?}"
    );
    assert!(
        outcomes[KILL_AFTER + 5..].iter().all(|o| o.persisted),
        "the writer carries on against the new primary"
    );
    // The new primary has no standby: doctor warns that the promise now
    // rests on one server.
    let (findings, facts) = turnsafe_host::doctor::examine_postgres(&url_new, None);
    assert_eq!(facts["synchronous_replication"], false, "{facts}");
    let warning = findings
        .iter()
        .find(|f| f.kind == "replication")
        .expect("a replication warning");
    assert_eq!(warning.severity, "warning");
    assert!(warning.message.contains("rests on one server"), "{}", warning.message);
}
