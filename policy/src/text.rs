//! Strings built without `core::fmt`.
//!
//! Why: in the component, `format!` and `to_string()` on numbers or on
//! `Display` types pull in the whole formatting machinery (the `Formatter`,
//! padding, `Debug` for chars with its Unicode tables). The policy only
//! ever joins text and prints integers, so it does both by hand here, and
//! the native build runs the very same code.

#[allow(unused_imports)]
use crate::prelude::*;

/// Where `label` is in `labels`, or `labels.len()` when it is not there.
/// Every `from_label` is this one search over its enum's table of labels,
/// which is in the order of its `ALL`, so the component carries one search
/// instead of one per enum; a plain index rather than an `Option` comes
/// back in a register, not through memory, in each caller.
pub(crate) fn position(labels: &[&str], label: &str) -> usize {
    labels.iter().position(|l| *l == label).unwrap_or(labels.len())
}

/// The parts, joined: `cat(&["a", b, "c"])` is `format!("a{b}c")`.
pub(crate) fn cat(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        out.push_str(p);
    }
    out
}

/// Decimal digits of `n`, as `n.to_string()` writes them.
pub(crate) fn unsigned(n: u64) -> String {
    // u64::MAX has 20 digits; they are made last-first, at the buffer's end.
    let mut digits = [0u8; 20];
    let mut len = 0;
    let mut rest = n;
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        len += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    // `get`, not indexing: no panic path for a range that cannot fail.
    let used: &[u8] = digits.get(digits.len() - len..).unwrap_or_default();
    let mut out = String::with_capacity(len);
    for d in used {
        out.push(char::from(*d));
    }
    out
}

/// Decimal digits of `n`, with a leading `-` when negative, as `n.to_string()`.
pub(crate) fn signed(n: i64) -> String {
    let magnitude = unsigned(n.unsigned_abs());
    if n < 0 { cat(&["-", &magnitude]) } else { magnitude }
}

/// `s.parse::<u64>().ok()`: ASCII digits after an optional `+`, with no
/// overflow. One small loop instead of core's generic integer parser.
pub(crate) fn parse_u64(s: &str) -> Option<u64> {
    let digits = s.strip_prefix('+').unwrap_or(s);
    if digits.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for b in digits.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        n = push_digit(n, b - b'0')?;
    }
    Some(n)
}

/// `n * 10 + digit`, or `None` past u64's range. A compare, not
/// `checked_mul`, whose overflow check needs a 128-bit multiply on wasm32.
pub(crate) fn push_digit(n: u64, digit: u8) -> Option<u64> {
    if n > u64::MAX / 10 {
        return None;
    }
    (n * 10).checked_add(u64::from(digit))
}

/// `s.parse::<i64>().ok()`: an optional sign, then what [`parse_u64`] reads.
pub(crate) fn parse_i64(s: &str) -> Option<i64> {
    match s.strip_prefix('-') {
        // `-+5` is not a number.
        Some(rest) if !rest.starts_with('+') => 0i64.checked_sub_unsigned(parse_u64(rest)?),
        Some(_) => None,
        None => i64::try_from(parse_u64(s)?).ok(),
    }
}

/// Whether `needle` occurs in `hay`: `str::contains` without the two-way
/// searcher, which costs kilobytes in the component. The needles are short
/// fixed phrases, so the plain scan is as fast in practice.
pub(crate) fn contains(hay: &str, needle: &str) -> bool {
    find(hay, needle).is_some()
}

/// The byte index of the first `needle` in `hay`, as `str::find` gives it.
pub(crate) fn find(hay: &str, needle: &str) -> Option<usize> {
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_as_to_string_writes_them() {
        for n in [
            0i64,
            1,
            -1,
            9,
            10,
            -10,
            42,
            999,
            1000,
            i64::MAX,
            i64::MIN,
            -9_223_372_036_854_775_807,
        ] {
            assert_eq!(signed(n), n.to_string());
        }
        for n in [0u64, 7, 10, 123_456_789, u64::MAX, u64::MAX - 1, 1 << 63] {
            assert_eq!(unsigned(n), n.to_string());
        }
    }

    #[test]
    fn search_agrees_with_str() {
        let hays = ["", "a", "database is locked", "ééé locked é", "aaab", "disk i/o error"];
        let needles = ["", "a", "locked", "é l", "aab", "b", "zz", "disk i/o error!"];
        for h in hays {
            for n in needles {
                assert_eq!(find(h, n), h.find(n), "{h:?} {n:?}");
                assert_eq!(contains(h, n), h.contains(n), "{h:?} {n:?}");
            }
        }
    }

    #[test]
    fn integers_parse_as_str_parse_does() {
        let texts = [
            "",
            "0",
            "7",
            "+7",
            "-7",
            "-0",
            "+",
            "-",
            "+-1",
            "-+1",
            "++1",
            "--1",
            "01",
            "1a",
            " 1",
            "1 ",
            "١",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "18446744073709551615",
            "18446744073709551616",
            "+18446744073709551615",
            "99999999999999999999999",
        ];
        for t in texts {
            assert_eq!(parse_u64(t), t.parse::<u64>().ok(), "{t:?}");
            assert_eq!(parse_i64(t), t.parse::<i64>().ok(), "{t:?}");
        }
    }

    #[test]
    fn cat_joins() {
        assert_eq!(cat(&[]), "");
        assert_eq!(cat(&["a", "", "bc"]), "abc");
    }
}
