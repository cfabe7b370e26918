//! `docs/POLICY.md` is generated from the code; this fails when it is stale.
//! Regenerate with `UPDATE_DOCS=1 cargo test -p turnsafe-policy --test policy_doc`.

#[test]
fn policy_doc_is_fresh() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/POLICY.md");
    let want = turnsafe_policy::table::render_markdown();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).expect("write docs/POLICY.md");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/POLICY.md is stale; run `UPDATE_DOCS=1 cargo test -p turnsafe-policy --test policy_doc` and commit it"
    );
}
