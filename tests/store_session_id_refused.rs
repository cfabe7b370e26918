//! Session ids become file names, so anything that could leave the
//! sessions folder is refused before any effect.
use turnsafe_host::store::SessionId;

#[test]
fn traversal_and_separators_are_refused() {
    for bad in [
        "",
        "..",
        "../x",
        "a/b",
        "a\\b",
        "/etc/passwd",
        ".hidden",
        "a..b",
        "x\0y",
        "sp ace",
        &"a".repeat(129),
    ] {
        assert!(SessionId::new(bad).is_err(), "accepted {bad:?}");
    }
    for good in ["s1", "chat-2026-11-30", "user:42.turn_7", &"a".repeat(128)] {
        assert!(SessionId::new(good).is_ok(), "refused {good:?}");
    }
}
