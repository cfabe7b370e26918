//! A small JSON value, its parser and its writer: what the policy's JSON
//! entry points need, and nothing more.
//!
//! Why not serde_json here: in the component, serde_json with its map,
//! float parsing and printing tables cost about a fifth of the module,
//! while the policy reads and writes only objects, strings, booleans and
//! integers. Native hosts keep using serde_json on the text this writes.
//!
//! The writer produces exactly serde_json's compact form: object keys in
//! sorted order, the same string escapes, integers as integers. Numbers in
//! input are kept as text; [`Json::as_i64`] reads integral values exactly
//! (`5.0` and `1e3` are integers; `1.5` is not), with no float arithmetic.

#[allow(unused_imports)]
use crate::prelude::*;
use crate::text;

/// Deepest nesting of arrays and objects accepted, whatever the innermost
/// holds: serde_json's, which every native host reads JSON with (it
/// refuses the 128th level), so that the component and the hosts accept
/// the same texts.
const MAX_DEPTH: usize = 127;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Json {
    Null,
    Bool(bool),
    /// A number, as its (validated) text.
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    /// Fields in input order; a repeated key means its last value.
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub(crate) fn int(n: i64) -> Json {
        Json::Num(text::signed(n))
    }

    pub(crate) fn uint(n: u64) -> Json {
        Json::Num(text::unsigned(n))
    }

    pub(crate) fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    /// The value of `key` in an object; `None` for a missing key or a non-object.
    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub(crate) fn is_object(&self) -> bool {
        matches!(self, Json::Obj(_))
    }

    /// An integral number, saturated to the i64 range.
    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Num(text) => integral(text),
            _ => None,
        }
    }

    /// A non-negative integral number that fits a u64.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            // Byte tests: a `char` pattern decodes the text in the component.
            Json::Num(text) if !text.bytes().any(|b| matches!(b, b'-' | b'.' | b'e' | b'E')) => {
                crate::text::parse_u64(text)
            }
            Json::Num(_) => self.as_i64().and_then(|n| u64::try_from(n).ok()),
            _ => None,
        }
    }

    /// Compact JSON text, keys sorted, as serde_json writes it.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Num(n) => out.push_str(n),
            Json::Str(s) => write_str(s, out),
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push('{');
                let mut last: Option<&str> = None;
                while let Some((k, v)) = next_field(fields, last) {
                    if last.is_some() {
                        out.push(',');
                    }
                    write_str(k, out);
                    out.push(':');
                    v.write(out);
                    last = Some(k);
                }
                out.push('}');
            }
        }
    }
}

/// The field with the least key greater than `after` (any key when
/// `after` is `None`), and of repeated keys the last one: writing fields
/// in this order is serde_json's key order. A scan per field rather than a
/// sort: the objects the policy writes have a handful of keys (it never
/// writes back an object it parsed), and a sort, with the insertions and
/// their bounds checks, costs more in the component than the whole scan.
fn next_field<'a>(fields: &'a [(String, Json)], after: Option<&str>) -> Option<&'a (String, Json)> {
    let mut next: Option<&(String, Json)> = None;
    for field in fields {
        let later = after.is_none_or(|a| field.0.as_str() > a);
        // `<=`, so that of equal keys the last one stays.
        if later && next.is_none_or(|n| field.0 <= n.0) {
            next = Some(field);
        }
    }
    next
}

fn write_str(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let b = c as u32 as usize;
                out.push_str("\\u00");
                out.push(HEX[b >> 4] as char);
                out.push(HEX[b & 0xf] as char);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The integer a number's text denotes, if it is integral; saturated.
///
/// The value is digits x 10^(exp - fraction length): integral when every
/// digit at or past the point is zero. One pass over the digits, with no
/// copy of them.
fn integral(text: &str) -> Option<i64> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    // Byte searches, not `split_once` with a `char`, which brings `memchr`.
    let (mantissa, exp) = match body.bytes().position(|b| b == b'e' || b == b'E') {
        Some(i) => (body.get(..i)?, text::parse_i64(body.get(i + 1..)?)?),
        None => (body, 0),
    };
    let (int_part, frac_part) = match mantissa.bytes().position(|b| b == b'.') {
        Some(i) => (mantissa.get(..i)?, mantissa.get(i + 1..)?),
        None => (mantissa, ""),
    };
    // How many digits stand before the point. Wrapping, as the build
    // without overflow checks always computed it.
    let point = (int_part.len() as i64).wrapping_add(exp);
    let saturated = if negative { i64::MIN } else { i64::MAX };
    // In u64; past its range the value saturates.
    let mut n: Option<u64> = Some(0);
    let mut at: i64 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        if at < point {
            n = n.and_then(|n| text::push_digit(n, b - b'0'));
        } else if b != b'0' {
            return None;
        }
        at += 1;
    }
    // The zeros the exponent adds; 20 of them overflow any value but 0.
    for _ in 0..point.saturating_sub(at).clamp(0, 20) {
        n = n.and_then(|n| text::push_digit(n, 0));
    }
    let Some(n) = n else {
        return Some(saturated);
    };
    Some(match (negative, i64::try_from(n)) {
        (false, Ok(n)) => n,
        (true, Ok(n)) => -n,
        (true, Err(_)) if n == 1u64 << 63 => i64::MIN,
        (_, Err(_)) => saturated,
    })
}

/// Parse one JSON text (surrounding whitespace allowed).
pub fn parse(text: &str) -> Result<Json, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(p.error("trailing characters"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        text::cat(&[what, " at byte ", &text::unsigned(self.i as u64)])
    }

    /// The bytes after the cursor. `get`, not indexing, here and in
    /// [`Parser::since`]: the cursor only moves forward within the text, so
    /// the range is always there, and a range that cannot fail needs no
    /// panic path, whose message formatting costs the component more.
    fn rest(&self) -> &[u8] {
        self.s.get(self.i..).unwrap_or_default()
    }

    /// The bytes from `start` to the cursor.
    fn since(&self, start: usize) -> &[u8] {
        self.s.get(start..self.i).unwrap_or_default()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> Result<(), String> {
        if self.rest().starts_with(lit.as_bytes()) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(self.error("expected value"))
        }
    }

    /// A value inside `depth` arrays and objects.
    fn value(&mut self, depth: usize) -> Result<Json, String> {
        // Checked where a level opens: a check on every value let an
        // empty array or object pass one level past the limit.
        if depth >= MAX_DEPTH && matches!(self.s.get(self.i), Some(b'[' | b'{')) {
            return Err(self.error("recursion limit exceeded"));
        }
        match self.s.get(self.i) {
            None => Err(self.error("EOF while parsing a value")),
            Some(b'n') => self.eat("null").map(|()| Json::Null),
            Some(b't') => self.eat("true").map(|()| Json::Bool(true)),
            Some(b'f') => self.eat("false").map(|()| Json::Bool(false)),
            Some(b'"') => self.string().map(Json::Str),
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    self.ws();
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(self.error("expected `,` or `]`")),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return Err(self.error("key must be a string"));
                    }
                    let key = self.string()?;
                    self.ws();
                    if self.s.get(self.i) != Some(&b':') {
                        return Err(self.error("expected `:`"));
                    }
                    self.i += 1;
                    self.ws();
                    let v = self.value(depth + 1)?;
                    fields.push((key, v));
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(fields));
                        }
                        _ => return Err(self.error("expected `,` or `}`")),
                    }
                }
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("expected value")),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.s.get(self.i) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.i;
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        let int_start = self.i;
        let n = self.digits();
        if n == 0 || (n > 1 && self.s.get(int_start) == Some(&b'0')) {
            return Err(self.error("invalid number"));
        }
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.error("invalid number"));
            }
        }
        if let Some(b'e' | b'E') = self.s.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.s.get(self.i) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("invalid number"));
            }
        }
        // The text is ASCII digits and signs: valid UTF-8.
        let text = core::str::from_utf8(self.since(start)).map_err(|_| self.error("invalid number"))?;
        Ok(Json::Num(text.to_string()))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .ok_or_else(|| self.error("EOF in escape"))?;
        let mut n = 0u32;
        for b in h {
            let d = (*b as char).to_digit(16).ok_or_else(|| self.error("invalid escape"))?;
            n = n * 16 + d;
        }
        self.i += 4;
        Ok(n)
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let start = self.i;
            while let Some(&b) = self.s.get(self.i) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            let chunk = core::str::from_utf8(self.since(start)).map_err(|_| self.error("invalid UTF-8"))?;
            out.push_str(chunk);
            match self.s.get(self.i) {
                None => return Err(self.error("EOF while parsing a string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let e = *self.s.get(self.i).ok_or_else(|| self.error("EOF in escape"))?;
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if !self.rest().starts_with(b"\\u") {
                                    return Err(self.error("lone leading surrogate"));
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.error("invalid surrogate pair"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            out.push(char::from_u32(code).ok_or_else(|| self.error("invalid unicode escape"))?);
                        }
                        _ => return Err(self.error("invalid escape")),
                    }
                }
                Some(_) => return Err(self.error("control character in a string")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_what_serde_json_writes() {
        let inputs = [
            r#"{"b":1,"a":[true,false,null],"c":{"z":"\u0001\b\f\n\r\t\"\\/é😀","y":-7}}"#,
            r#"[]"#,
            r#"{}"#,
            r#""\ud83d\ude00""#,
            r#"{"k":"x","k":"y"}"#,
        ];
        for text in inputs {
            let ours = parse(text).unwrap().to_text();
            let theirs: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(ours, theirs.to_string(), "{text}");
        }
    }

    #[test]
    fn numbers_read_as_integers_exactly() {
        let n = |t: &str| parse(t).unwrap().as_i64();
        assert_eq!(n("5"), Some(5));
        assert_eq!(n("-5"), Some(-5));
        assert_eq!(n("5.0"), Some(5));
        assert_eq!(n("1e3"), Some(1000));
        assert_eq!(n("1.5e1"), Some(15));
        assert_eq!(n("1.5"), None);
        assert_eq!(n("0.0"), Some(0));
        assert_eq!(n("-0"), Some(0));
        assert_eq!(n("1e-3"), None);
        assert_eq!(n("100e-2"), Some(1));
        assert_eq!(n("1e40"), Some(i64::MAX));
        assert_eq!(n("-1e40"), Some(i64::MIN));
        assert_eq!(n("0e99"), Some(0));
        assert_eq!(n("1.20e1"), Some(12));
        assert_eq!(n("1.25e1"), None);
        assert_eq!(n("1e9223372036854775806"), Some(i64::MAX));
        // An exponent past i64 is read as no integer, not a guess.
        assert_eq!(n("1e9223372036854775808"), None);
        assert_eq!(n("9223372036854775807"), Some(i64::MAX));
        assert_eq!(n("18446744073709551615"), Some(i64::MAX));
        assert_eq!(parse("18446744073709551615").unwrap().as_u64(), Some(u64::MAX));
        assert_eq!(parse("-1").unwrap().as_u64(), None);
    }

    #[test]
    fn malformed_text_is_an_error_never_a_panic() {
        for bad in [
            "",
            "{",
            "[1,",
            "{\"a\"}",
            "01",
            "1.",
            "-",
            "\"\\x\"",
            "\"\\ud800\"",
            "nul",
            "[1]x",
            "{\"a\":1,}",
            "\"\u{1}\"",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(parse(&deep).is_err());
    }
}
