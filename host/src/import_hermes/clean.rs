//! Hermes' cleaning of a snapshot's content (`AIAgent._save_session_log`):
//! an assistant's text content passes through `_clean_session_content`
//! before it is written, and every content through
//! `redact_sensitive_text`. The cleaning is reproduced here so that a
//! stored row can be compared with its snapshot entry; the redaction is
//! not (its patterns change between Hermes versions and it cannot be
//! undone), so a redacted entry is never found to be the same.

use serde_json::Value;

/// `content` as the snapshot holds it for a message of `role`: an
/// assistant's non-empty text cleaned, anything else as it is. (Hermes
/// cleans only text: content of another shape makes its snapshot writer
/// fail, so no snapshot holds it cleaned.)
pub fn snapshot_content(role: Option<&Value>, content: Option<&Value>) -> Value {
    match (role.and_then(Value::as_str), content) {
        (Some("assistant"), Some(Value::String(s))) if !s.is_empty() => Value::String(clean_session_content(s)),
        (_, Some(c)) => c.clone(),
        (_, None) => Value::Null,
    }
}

/// `_clean_session_content`: `<REASONING_SCRATCHPAD>` tags as `<think>`
/// tags, the newlines before a `<think>` and after a `</think>` each
/// collapsed to one (`re.sub(r'\n+(<think>)', ...)`, then
/// `re.sub(r'(</think>)\n+', ...)`), and Python's `str.strip()`.
pub fn clean_session_content(content: &str) -> String {
    let text = content
        .replace("<REASONING_SCRATCHPAD>", "<think>")
        .replace("</REASONING_SCRATCHPAD>", "</think>");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find('\n') {
        out.push_str(&rest[..at]);
        let run = rest[at..].len() - rest[at..].trim_start_matches('\n').len();
        let after = &rest[at + run..];
        // One newline where either substitution applies to this run; a
        // run applies to both only between `</think>` and `<think>`, and
        // both leave one newline.
        if out.ends_with("</think>") || after.starts_with("<think>") {
            out.push('\n');
        } else {
            out.push_str(&rest[at..at + run]);
        }
        rest = after;
    }
    out.push_str(rest);
    out.trim_matches(python_space).to_string()
}

/// Python's `str.isspace`: Unicode white space and the four information
/// separators U+001C to U+001F, which Rust's `char::is_whitespace` leaves
/// out.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}
