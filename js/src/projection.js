// The text projection of a message's `content` that the index holds and
// the `content` column stores, as the native host makes it.

/** Keys sorted at every level, as serde_json writes a map (the content projection of a non-text value). */
function sortedJson(v) {
  if (Array.isArray(v)) return `[${v.map(sortedJson).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${sortedJson(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

/** The text projection of `content` the index holds (host/src/message.rs `text_of`). */
export function textOf(content) {
  if (content === null || content === undefined) return null;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    const texts = content.map((p) => (typeof p === 'string' ? p
      : (p !== null && typeof p === 'object' && typeof p.text === 'string' ? p.text : null))).filter((t) => t !== null);
    return texts.length ? texts.join('\n') : null;
  }
  if (typeof content === 'object') return typeof content.text === 'string' ? content.text : sortedJson(content);
  return sortedJson(content);
}
