// "The same" means the same bytes: the one comparison every "already
// stored" decision of this host goes through (a resend's uid conflict, a
// history edit applied already, a lost COMMIT's resolution). It is the
// native host's (host/src/same.rs) written again for JavaScript, and
// tests/canonical.json holds both to the same answers.
//
// A record's canonical bytes are the canonical JSON text of its JSON text:
// no insignificant whitespace; object members sorted by key comparing
// UTF-16 code units (RFC 8785, 3.2.3); strings written as RFC 8785 writes
// them (3.2.2.2); numbers as they were written, digit for digit (never
// rounded to a double: `1` and `1.0` are two numbers, and so are two
// integers past 2^53), with the one rewrite the native host's JSON reader
// makes: an exponent is written `e` with its sign (`1E2` is `1e+2`).
// A repeated key keeps its last value. The digest is `sha256:<hex>` of the
// canonical text's UTF-8 bytes.
//
// JSON.parse cannot be used for any of it: it turns every number into a
// double. So this is a small reader of its own that refuses what the native
// reader refuses (invalid JSON, lone surrogates, raw control characters in
// strings, more than 127 nested containers).
import { createHash } from 'node:crypto';

/** A text that is not JSON (or not JSON the native host would read). */
export class NotJson extends Error {
  constructor(message) {
    super(message);
    this.name = 'NotJson';
  }
}

// serde_json's recursion limit: its 128th nested container is refused.
const MAX_DEPTH = 127;

const isWs = (c) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
const isDigit = (c) => c >= 0x30 && c <= 0x39;

const SHORT_ESCAPES = { 0x22: '"', 0x5c: '\\', 0x2f: '/', 0x62: '\b', 0x66: '\f', 0x6e: '\n', 0x72: '\r', 0x74: '\t' };

/** A string value as RFC 8785 writes it. */
export function writeString(s) {
  return `"${s.replace(/["\\\u0000-\u001f]/g, (c) => {
    switch (c) {
      case '"': return '\\"';
      case '\\': return '\\\\';
      case '\b': return '\\b';
      case '\f': return '\\f';
      case '\n': return '\\n';
      case '\r': return '\\r';
      case '\t': return '\\t';
      default: return `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;
    }
  })}"`;
}

class Reader {
  constructor(text) {
    this.s = text;
    this.i = 0;
    this.depth = 0;
  }

  fail(why) {
    throw new NotJson(`${why} at character ${this.i}`);
  }

  ws() {
    const s = this.s;
    while (this.i < s.length && isWs(s.charCodeAt(this.i))) this.i += 1;
  }

  /** The canonical text of the value at the cursor. */
  value() {
    this.ws();
    if (this.i >= this.s.length) this.fail('EOF while parsing a value');
    const c = this.s.charCodeAt(this.i);
    switch (c) {
      case 0x7b: return this.object();
      case 0x5b: return this.array();
      case 0x22: return writeString(this.string());
      case 0x74: return this.literal('true');
      case 0x66: return this.literal('false');
      case 0x6e: return this.literal('null');
      default:
        if (c === 0x2d || isDigit(c)) return this.number();
        return this.fail('expected a value');
    }
  }

  literal(word) {
    if (this.s.startsWith(word, this.i)) {
      this.i += word.length;
      return word;
    }
    return this.fail('expected a value');
  }

  nest() {
    this.depth += 1;
    if (this.depth > MAX_DEPTH) this.fail('recursion limit exceeded');
    this.i += 1;
  }

  array() {
    this.nest();
    const items = [];
    this.ws();
    if (this.s.charCodeAt(this.i) === 0x5d) {
      this.i += 1;
    } else {
      for (;;) {
        items.push(this.value());
        this.ws();
        const c = this.s.charCodeAt(this.i);
        this.i += 1;
        if (c === 0x5d) break;
        if (c !== 0x2c) this.fail('expected `,` or `]`');
        this.ws();
        if (this.s.charCodeAt(this.i) === 0x5d) this.fail('trailing comma');
      }
    }
    this.depth -= 1;
    return `[${items.join(',')}]`;
  }

  object() {
    this.nest();
    // Last value wins for a repeated key, as the native reader keeps it.
    const members = new Map();
    this.ws();
    if (this.s.charCodeAt(this.i) === 0x7d) {
      this.i += 1;
    } else {
      for (;;) {
        this.ws();
        if (this.s.charCodeAt(this.i) !== 0x22) this.fail(this.s.charCodeAt(this.i) === 0x7d ? 'trailing comma' : 'expected a key');
        const key = this.string();
        this.ws();
        if (this.s.charCodeAt(this.i) !== 0x3a) this.fail('expected `:`');
        this.i += 1;
        members.set(key, this.value());
        this.ws();
        const c = this.s.charCodeAt(this.i);
        this.i += 1;
        if (c === 0x7d) break;
        if (c !== 0x2c) this.fail('expected `,` or `}`');
      }
    }
    this.depth -= 1;
    // The default sort compares UTF-16 code units, as RFC 8785 orders keys.
    const keys = [...members.keys()].sort();
    return `{${keys.map((k) => `${writeString(k)}:${members.get(k)}`).join(',')}}`;
  }

  /** The decoded string at the cursor (at its opening quote). */
  string() {
    const s = this.s;
    this.i += 1;
    let out = '';
    let run = this.i;
    for (;;) {
      if (this.i >= s.length) this.fail('EOF while parsing a string');
      const c = s.charCodeAt(this.i);
      if (c === 0x22) {
        out += s.slice(run, this.i);
        this.i += 1;
        return out;
      }
      if (c < 0x20) this.fail('control character found while parsing a string');
      if (c !== 0x5c) {
        this.i += 1;
        continue;
      }
      out += s.slice(run, this.i);
      this.i += 1;
      const e = s.charCodeAt(this.i);
      if (e === 0x75) {
        this.i += 1;
        const unit = this.hex4();
        if (unit >= 0xdc00 && unit <= 0xdfff) this.fail('lone trailing surrogate in hex escape');
        if (unit >= 0xd800 && unit <= 0xdbff) {
          // Only a `\u` escape of a trailing surrogate may follow.
          if (s.charCodeAt(this.i) !== 0x5c || s.charCodeAt(this.i + 1) !== 0x75) this.fail('lone leading surrogate in hex escape');
          this.i += 2;
          const low = this.hex4();
          if (low < 0xdc00 || low > 0xdfff) this.fail('lone leading surrogate in hex escape');
          out += String.fromCharCode(unit, low);
        } else {
          out += String.fromCharCode(unit);
        }
      } else if (Object.hasOwn(SHORT_ESCAPES, e)) {
        this.i += 1;
        out += SHORT_ESCAPES[e];
      } else {
        this.fail('invalid escape');
      }
      run = this.i;
    }
  }

  hex4() {
    const h = this.s.slice(this.i, this.i + 4);
    if (!/^[0-9A-Fa-f]{4}$/.test(h)) this.fail('invalid hex escape');
    this.i += 4;
    return Number.parseInt(h, 16);
  }

  /** A number's text as written, its exponent as the native reader writes it. */
  number() {
    const s = this.s;
    const digits = () => {
      const from = this.i;
      while (this.i < s.length && isDigit(s.charCodeAt(this.i))) this.i += 1;
      return s.slice(from, this.i);
    };
    let out = '';
    if (s.charCodeAt(this.i) === 0x2d) {
      out = '-';
      this.i += 1;
    }
    const int = digits();
    if (int === '') this.fail('invalid number');
    if (int.length > 1 && int[0] === '0') this.fail('invalid number');
    out += int;
    if (s.charCodeAt(this.i) === 0x2e) {
      this.i += 1;
      const frac = digits();
      if (frac === '') this.fail('invalid number');
      out += `.${frac}`;
    }
    const e = s.charCodeAt(this.i);
    if (e === 0x65 || e === 0x45) {
      this.i += 1;
      let sign = '+';
      const c = s.charCodeAt(this.i);
      if (c === 0x2b || c === 0x2d) {
        sign = s[this.i];
        this.i += 1;
      }
      const exp = digits();
      if (exp === '') this.fail('invalid number');
      out += `e${sign}${exp}`;
    }
    return out;
  }
}

/** The canonical JSON text of a JSON text; throws NotJson for what is not JSON. */
export function canonicalText(text) {
  if (typeof text !== 'string') throw new NotJson('not a text');
  // A lone surrogate cannot be written as UTF-8: there are no such bytes to compare.
  if (!text.isWellFormed()) throw new NotJson('a lone surrogate');
  const r = new Reader(text);
  const out = r.value();
  r.ws();
  if (r.i < text.length) r.fail('trailing characters');
  return out;
}

/**
 * The members of a JSON object text, each value's text exactly as written
 * (`{raw, canonical}` by key, the last of a repeated key): how a field is
 * taken out of a divert line without JSON.parse rounding its numbers.
 * Throws NotJson for a text that is not JSON or not an object.
 */
export function membersOf(text) {
  canonicalText(text);
  const r = new Reader(text);
  const members = new Map();
  r.ws();
  if (text.charCodeAt(r.i) !== 0x7b) throw new NotJson('not a JSON object');
  r.i += 1;
  r.depth = 1;
  r.ws();
  if (text.charCodeAt(r.i) === 0x7d) return members;
  for (;;) {
    r.ws();
    const key = r.string();
    r.ws();
    r.i += 1;
    r.ws();
    const from = r.i;
    const canonical = r.value();
    members.set(key, { raw: text.slice(from, r.i), canonical });
    r.ws();
    const c = text.charCodeAt(r.i);
    r.i += 1;
    if (c === 0x7d) return members;
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** The canonical JSON text of JSON bytes (a line of a file): bytes that are not UTF-8 are not JSON. */
export function canonicalBytes(bytes) {
  let text;
  try {
    text = utf8.decode(bytes);
  } catch {
    throw new NotJson('not UTF-8');
  }
  return canonicalText(text);
}

/**
 * The canonical JSON text of a live value: its JSON.stringify text, read
 * as any other text (what this host stores for it is that same text).
 */
export function canonical(value) {
  const text = JSON.stringify(value);
  if (typeof text !== 'string') throw new NotJson('the value has no JSON text');
  return canonicalText(text);
}

/** `sha256:<hex>` of `bytes` (a Buffer, or a string's UTF-8). */
export function digestBytes(bytes) {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

/** The digest of a live value's canonical bytes. */
export function digest(value) {
  return digestBytes(canonical(value));
}

/** The digest of a stored JSON text, or of its raw bytes when it is not JSON (what a ledger names for it). */
export function digestText(stored) {
  let c;
  try {
    c = canonicalText(stored);
  } catch {
    return digestBytes(stored);
  }
  return digestBytes(c);
}

const orNull = (f) => {
  try {
    return f();
  } catch (e) {
    if (e instanceof NotJson) return null;
    throw e;
  }
};

/** Whether two live values have the same canonical bytes. */
export function same(a, b) {
  const x = orNull(() => canonical(a));
  return x !== null && x === orNull(() => canonical(b));
}

/** Whether a stored JSON text holds the same canonical bytes as the live value `value`; a stored text that is not JSON is never the same. */
export function sameText(stored, value) {
  const x = orNull(() => canonicalText(stored));
  return x !== null && x === orNull(() => canonical(value));
}

/** Whether two JSON texts are one record. */
export function sameTexts(a, b) {
  const x = orNull(() => canonicalText(a));
  return x !== null && x === orNull(() => canonicalText(b));
}
