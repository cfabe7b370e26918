//! Search never misses a committed message, wherever the index's
//! watermark stands: every word of every batch is found, through the index
//! or by the scan of what it lacks.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::search::{self, SearchOptions};

#[test]
fn every_committed_message_is_found_whatever_the_watermark() {
    let home = Home::new();
    let mut store = home.store();
    let mut words = Vec::new();
    for b in 0..12 {
        let msgs: Vec<_> = (0..5)
            .map(|i| {
                let word = format!("w{b}x{i}");
                words.push(word.clone());
                turnsafe_host::message::Message::new("user", &format!("{word} and filler text"))
            })
            .collect();
        assert!(
            store
                .append_batch(&sid(if b % 2 == 0 { "even" } else { "odd" }), &msgs)
                .persisted
        );
        // Index some of the way, sometimes.
        if b % 3 == 1 {
            store.catch_up_index(Some(7)).unwrap();
        }
    }
    drop(store);
    let read_only = SearchOptions {
        read_only: true,
        ..SearchOptions::default()
    };
    let unindexed = search::search(home.path(), "filler", &read_only).unwrap().unindexed;
    assert!(unindexed > 0 && unindexed < 60, "{unindexed}");
    for w in &words {
        let r = search::search(home.path(), w, &read_only).unwrap();
        assert_eq!(r.hits.len(), 1, "{w} missed");
    }
}
