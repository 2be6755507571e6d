//! Scrubbing tool output: every secret value a run can reach is replaced by
//! `<secret:NAME>` before a tool's text goes anywhere (the model, the
//! history, the store, the event stream, logs).
//!
//! # What is recognised
//!
//! A value is not looked for as a fixed list of strings: the matcher walks
//! the value one unit at a time and lets each unit appear in any of the
//! forms below, so forms that mix escaped and literal characters match too.
//!
//! - **Text** (the value as it is, and escaped as JSON, URL or form
//!   encoders write it). Each character may appear literally, as a JSON
//!   escape (`\uXXXX` with hex digits of either case, a surrogate pair
//!   `\uD83D\uDE00` for a character outside the BMP, or one of `\"` `\\`
//!   `\/` `\b` `\f` `\n` `\r` `\t`), or byte by byte percent-encoded
//!   (`%XX`, either case) with `+` for a space. Any mix matches: every
//!   character escaped, only `&`, `<` and `>` escaped (Go's
//!   `\u0026`, `\u003c`, `\u003e`), only non-ASCII escaped (Python's
//!   `json.dumps`), query strings, form bodies.
//! - **Base64**, standard or URL-safe alphabet (either per character),
//!   padded or not, at each of the three alignments a value can have inside
//!   a longer encoded string (`Basic base64(user:token)`): the characters
//!   that depend on the value alone, then the last character the value
//!   shares with what follows and its `=` padding when present. One line
//!   break may stand between any two characters, whatever the width of the
//!   lines (`\n`, `\r\n`, `\r`, or the two-character JSON escapes `\n` and
//!   `\r\n` of a wrapped value inside a JSON string).
//! - **Hex** of the whole value's bytes, either case (per digit).
//! - A marker this scrubber writes (`<secret:NAME>`) is copied as it is, so
//!   scrubbing twice changes nothing.
//!
//! At each position the longest match of any value wins, and the text is
//! read once, left to right: a marker is never searched again.
//!
//! # What cannot be recognised, and why
//!
//! - Values shorter than [`MIN_LEN`] bytes: such a value (a PIN, a flag, a
//!   digit) occurs everywhere in ordinary output; each replacement would
//!   mangle the text and point at where the value occurs.
//! - Transformations that need a key or the whole text to undo: encryption,
//!   hashing, compression, or any encoding not listed (rot13, base32,
//!   ASCII85, reversed text, HTML entities): recognising them means running
//!   each such transformation over every value, and a tool can always pick
//!   one more.
//! - A value printed in pieces at different places (or with separators
//!   inside, `de:ad:be:ef`, spaces in base64): only contiguous forms match;
//!   any piece may be shorter than what could be told apart from ordinary
//!   text.
//! - Double encodings beyond the mixes above: base64 of the JSON-escaped
//!   value, percent-encoding of a percent-encoded value, hex of base64, and
//!   so on. Each layer multiplies the forms to try.
//! - The first base64 character of a value at a shifted alignment (it
//!   shares bits with what precedes the value, at most 4 of the value's).
//!
//! # Cutting
//!
//! Output that is cut at a limit is scrubbed first and cut after, with
//! [`Scrubber::scrub_cut`]: the reader keeps [`Scrubber::lookahead`] bytes
//! past the limit, so a form that starts before the limit is read whole and
//! replaced whole, and no cut leaves a secret's leading bytes behind.
//!
//! # Cost
//!
//! Text with no secret in it costs one table lookup per byte: `starts`
//! says which bytes may begin a form, and runs of other bytes are copied at
//! once. Matching allocates nothing.

use super::{ParamValue, SecretString, Values};

/// The shortest value that is scrubbed, in bytes.
pub const MIN_LEN: usize = 4;

/// The fewest base64 characters looked for at a shifted alignment: shorter
/// runs match unrelated base64 text too often.
const MIN_FRAGMENT: usize = 6;

/// One value, ready to be looked for: its forms are worked out once, and
/// every scrubber that looks for it shares them.
#[derive(Clone)]
pub struct Prepared(std::sync::Arc<Secret>);

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Prepared({})", self.0.marker)
    }
}

impl Prepared {
    /// `secret`, and the same without the white space at its ends when it
    /// has some: a header value's ends are dropped by every HTTP server,
    /// so an API echoes it back without them.
    ///
    /// An ASCII value is also looked for in UTF-16, little- and big-endian
    /// (each character beside a NUL): a tool that prints it so (Windows
    /// tools, `iconv -t UTF-16`) would carry it past every other form.
    pub fn all(name: &str, secret: &SecretString) -> Vec<Prepared> {
        let value = secret.expose();
        let trimmed = value.trim();
        let mut texts = vec![value.to_string()];
        if trimmed.len() != value.len() {
            texts.push(trimmed.to_string());
        }
        if value.is_ascii() {
            for t in texts.clone() {
                texts.push(t.chars().flat_map(|c| [c, '\0']).collect());
                texts.push(t.chars().flat_map(|c| ['\0', c]).collect());
            }
        }
        texts
            .into_iter()
            .filter_map(|t| Prepared::new(name, &SecretString::new(t)))
            .collect()
    }

    /// `secret`, to be replaced by `<secret:NAME>`; `None` when it is too
    /// short to be looked for.
    pub fn new(name: &str, secret: &SecretString) -> Option<Prepared> {
        let bytes = secret.expose().as_bytes();
        if bytes.len() < MIN_LEN {
            return None;
        }
        let base64: Vec<Base64Form> = (0..3)
            .map(|shift| base64_form(bytes, shift))
            .enumerate()
            .filter(|(shift, f)| *shift == 0 || f.digits.len() >= MIN_FRAGMENT)
            .map(|(_, f)| f)
            .collect();
        Some(Prepared(std::sync::Arc::new(Secret {
            value: secret.clone(),
            marker: format!("<secret:{name}>"),
            base64,
        })))
    }
}

struct Secret {
    value: SecretString,
    marker: String,
    /// Its base64 forms, one per alignment that is long enough.
    base64: Vec<Base64Form>,
}

/// The base64 of a value starting `shift` bytes into a 3-byte group: the
/// 6-bit digits that depend on the value alone, then the bits of the value
/// the next digit starts with (`tail_bits` of them, `tail` their value).
struct Base64Form {
    digits: Vec<u8>,
    tail: u8,
    tail_bits: u32,
}

/// What to look for and what replaces it.
pub struct Scrubber {
    secrets: Vec<Prepared>,
    /// The values looked for, by a hash of their bytes: a value added again
    /// is found without comparing it to every other.
    seen: std::collections::HashMap<u64, Vec<u32>>,
    /// Bytes some form starts with: most positions are skipped at once.
    starts: [bool; 256],
    /// The secrets whose value starts with a byte (for the text and hex
    /// forms), and whose base64 forms start with a digit: at a position,
    /// only those that can match there are tried, however many values
    /// there are.
    by_first_byte: Vec<Vec<u32>>,
    by_first_digit: Vec<Vec<u32>>,
    /// Every marker, to copy them as they are.
    markers: std::collections::HashSet<String>,
    longest_marker: usize,
    /// The longest text any form can match, in bytes.
    lookahead: usize,
}

/// Letters and digits only, lower case: a name made of a value has to
/// drop or change what a name may not hold (`sk-live-1` becomes
/// `sk_live_1`), which the scrubber would not know.
pub fn fold(text: &str) -> String {
    text.chars()
        .map(halfwidth)
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// A fullwidth letter or digit (`Ｓ`, `２`) as its ASCII one: the same
/// character to a reader, and to a model.
fn halfwidth(c: char) -> char {
    match c {
        '\u{FF10}'..='\u{FF19}' | '\u{FF21}'..='\u{FF3A}' | '\u{FF41}'..='\u{FF5A}' => {
            char::from_u32(c as u32 - 0xFEE0).unwrap_or(c)
        }
        c => c,
    }
}

/// Whether `text` holds one of `folded` (values folded, see [`folded`])
/// when it is folded too.
pub fn holds_folded(text: &str, folded: &[SecretString]) -> bool {
    let text = fold(text);
    folded.iter().any(|f| text.contains(f.expose()))
}

/// Shorter folded values would match names by chance.
pub const MIN_FOLDED: usize = 8;

/// `secret` folded, if long enough to be told in a name.
pub fn folded(secret: &SecretString) -> Option<SecretString> {
    let f = fold(secret.expose());
    (f.len() >= MIN_FOLDED).then(|| SecretString::new(f))
}

impl Default for Scrubber {
    fn default() -> Self {
        Scrubber {
            secrets: Vec::new(),
            seen: Default::default(),
            starts: [false; 256],
            by_first_byte: vec![Vec::new(); 256],
            by_first_digit: vec![Vec::new(); 64],
            markers: Default::default(),
            longest_marker: 0,
            lookahead: 0,
        }
    }
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scrubber({} values)", self.secrets.len())
    }
}

impl Scrubber {
    /// A scrubber for the secret values among `values`, each named by its
    /// parameter.
    /// A scrubber of each `(name, secret)`; the first name of a value
    /// stays its marker.
    pub fn of<'a>(secrets: impl IntoIterator<Item = &'a (String, SecretString)>) -> Scrubber {
        let mut s = Scrubber::default();
        for (name, secret) in secrets {
            s.add(name, secret);
        }
        s
    }

    pub fn from_values(values: &Values) -> Scrubber {
        let mut s = Scrubber::default();
        for (name, v) in values {
            if let ParamValue::Secret(secret) = v {
                s.add(name, secret);
            }
        }
        s
    }

    /// Look for `secret` too, replacing it by `<secret:NAME>`. A value
    /// already looked for keeps its first name.
    pub fn add(&mut self, name: &str, secret: &SecretString) {
        for p in Prepared::all(name, secret) {
            self.add_prepared(&p);
        }
    }

    /// Look for a prepared value too (its forms are shared, not worked out
    /// again). A value already looked for keeps its first name.
    pub fn add_prepared(&mut self, prepared: &Prepared) {
        let secret = &*prepared.0;
        let value = secret.value.expose();
        let bytes = value.as_bytes();
        let hash = {
            use std::hash::{BuildHasher, BuildHasherDefault};
            BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
                .hash_one(bytes)
        };
        let same = self.seen.entry(hash).or_default();
        if same
            .iter()
            .any(|&k| self.secrets[k as usize].0.value == secret.value)
        {
            return;
        }
        let index = u32::try_from(self.secrets.len()).unwrap_or(u32::MAX);
        same.push(index);
        let first = bytes[0];
        for b in [first, b'%', b'\\', b'<'] {
            self.starts[usize::from(b)] = true;
        }
        if first == b' ' {
            self.starts[usize::from(b'+')] = true;
        }
        self.by_first_byte[usize::from(first)].push(index);
        for f in &secret.base64 {
            if let Some(&d) = f.digits.first() {
                self.starts[usize::from(STANDARD[usize::from(d)])] = true;
                self.starts[usize::from(URL_SAFE[usize::from(d)])] = true;
                let bucket = &mut self.by_first_digit[usize::from(d)];
                if bucket.last() != Some(&index) {
                    bucket.push(index);
                }
            }
        }
        for digits in [HEX_LOWER, HEX_UPPER] {
            self.starts[usize::from(digits[usize::from(first >> 4)])] = true;
        }
        // Text: at most 12 bytes a character (a surrogate pair, or a
        // 4-byte character percent-encoded). Base64: each character, and
        // the last one and two `=`, after a line break of at most 4 bytes.
        let text = value.chars().count() * 12;
        let longest_base64 = secret
            .base64
            .iter()
            .map(|f| f.digits.len())
            .max()
            .unwrap_or(0);
        let wrapped = (longest_base64 + 3) * 5;
        let marker = &secret.marker;
        self.lookahead = self
            .lookahead
            .max(text)
            .max(wrapped)
            .max(bytes.len() * 2)
            .max(marker.len());
        self.longest_marker = self.longest_marker.max(marker.len());
        self.markers.insert(marker.clone());
        self.secrets.push(prepared.clone());
    }

    /// How many values are looked for.
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The longest text a form of a value can take, in bytes: what a
    /// reader must keep past a limit for [`Scrubber::scrub_cut`] to see a
    /// form that starts before the limit whole.
    pub fn lookahead(&self) -> usize {
        self.lookahead
    }

    /// `text` with every occurrence of a secret replaced. One left-to-right
    /// pass: a marker is never searched again.
    pub fn scrub(&self, text: &str) -> String {
        self.scrub_until(text, text.len()).0
    }

    /// Whether `bytes` (a tool's binary output: an image, a file) hold a
    /// secret in any form [`Scrubber::scrub`] recognises. Bytes are not
    /// scrubbed (a marker written into an image breaks it): what holds a
    /// secret is withheld whole. Its text is read with invalid UTF-8
    /// replaced, which leaves every form (valid UTF-8 itself) as it is.
    pub fn finds_in(&self, bytes: &[u8]) -> bool {
        if self.secrets.is_empty() {
            return false;
        }
        let text = String::from_utf8_lossy(bytes);
        self.scrub(&text) != text
    }

    /// `text` scrubbed, then cut at `limit` bytes of `text` (a character
    /// the limit falls inside is left out); whether anything was cut.
    ///
    /// A form that starts before the limit is replaced whole, even where it
    /// ends past the limit; nothing that starts at or after it is kept. So
    /// `text` should hold [`Scrubber::lookahead`] bytes more than `limit`
    /// when there are more: a form cut short by the end of `text` is not
    /// recognised.
    pub fn scrub_cut(&self, text: &str, limit: usize) -> (String, bool) {
        if text.len() <= limit {
            return (self.scrub(text), false);
        }
        let (out, reached) = self.scrub_until(text, limit);
        (out, reached < text.len())
    }

    /// Scrub the forms that start before `limit`; the text up to where the
    /// last of them ends (`limit` or past it), and that position.
    fn scrub_until(&self, text: &str, limit: usize) -> (String, usize) {
        let bytes = text.as_bytes();
        if self.secrets.is_empty() {
            let mut end = limit;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            return (text[..end].to_string(), end);
        }
        let mut out: Vec<u8> = Vec::with_capacity(limit);
        let mut i = 0;
        while i < limit {
            let run = bytes[i..limit]
                .iter()
                .position(|&b| self.starts[usize::from(b)])
                .map_or(limit, |k| i + k);
            out.extend_from_slice(&bytes[i..run]);
            i = run;
            if i >= limit {
                break;
            }
            match self.match_at(bytes, i) {
                Some((end, marker)) => {
                    out.extend_from_slice(marker.as_bytes());
                    i = end;
                }
                None => {
                    out.push(bytes[i]);
                    i += 1;
                }
            }
        }
        // Every form begins and ends on a character boundary of `text`:
        // it is ASCII, or the value's own characters whole. So where the
        // limit stopped the copy inside a character, the bytes of it
        // copied are the last ones out.
        let mut start = i;
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        out.truncate(out.len() - (i - start));
        let i = start;
        let out = String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        (out, i)
    }

    /// The longest form of any value at `i`: where it ends and its marker.
    /// Only values that can start here are tried: by the byte the text
    /// here spells (as it is, percent-encoded or JSON-escaped), the byte
    /// two hex digits spell, the base64 digit.
    fn match_at(&self, bytes: &[u8], i: usize) -> Option<(usize, &str)> {
        let b = bytes[i];
        if b == b'<' {
            if let Some(m) = self.marker_at(bytes, i) {
                return Some((i + m.len(), m));
            }
        }
        let spelled = match b {
            b'%' => hex_byte(bytes, i + 1),
            b'\\' => json_unescape(bytes, i).map(|(c, _)| {
                let mut buf = [0u8; 4];
                c.encode_utf8(&mut buf).as_bytes()[0]
            }),
            b'+' => Some(b' '),
            _ => None,
        };
        // (end, which secret)
        let mut best: Option<(usize, usize)> = None;
        let mut consider = |end: Option<usize>, k: u32| {
            if let Some(end) = end {
                if end > i && best.is_none_or(|(e, _)| end > e) {
                    best = Some((end, k as usize));
                }
            }
        };
        for first in std::iter::once(b).chain(spelled.filter(|&f| f != b)) {
            for &k in &self.by_first_byte[usize::from(first)] {
                let value = self.secrets[k as usize].0.value.expose();
                consider(match_text(value, bytes, i), k);
            }
        }
        if let Some(first) = hex_byte(bytes, i) {
            for &k in &self.by_first_byte[usize::from(first)] {
                let value = self.secrets[k as usize].0.value.expose();
                consider(match_hex(value.as_bytes(), bytes, i), k);
            }
        }
        let d = DECODE[usize::from(b)];
        if d != INVALID {
            for &k in &self.by_first_digit[usize::from(d)] {
                let forms = self.secrets[k as usize].0.base64.iter();
                for f in forms.filter(|f| f.digits.first() == Some(&d)) {
                    consider(match_base64(f, bytes, i), k);
                }
            }
        }
        best.map(|(end, k)| (end, self.secrets[k].0.marker.as_str()))
    }

    /// The marker at `i`, when it is one this scrubber writes.
    fn marker_at(&self, bytes: &[u8], i: usize) -> Option<&str> {
        let rest = &bytes[i..bytes.len().min(i + self.longest_marker)];
        if !rest.starts_with(b"<secret:") {
            return None;
        }
        let end = rest.iter().position(|&c| c == b'>')?;
        let m = std::str::from_utf8(&rest[..=end]).ok()?;
        self.markers.get(m).map(String::as_str)
    }
}

/// How many steps one text match may take before it gives up, per byte of
/// the value. Only a value with many `\` or `%` in it against text with
/// many of them makes the matcher retry; a match that runs out of steps
/// counts as a match up to the furthest byte it reached, so a slow match
/// scrubs more, never less.
const STEPS_PER_BYTE: usize = 16;

/// Where the value as text (each character literal, JSON-escaped or
/// percent-encoded) that starts at `start` ends.
fn match_text(value: &str, input: &[u8], start: usize) -> Option<usize> {
    let mut budget = Budget {
        steps: STEPS_PER_BYTE * value.len() + 64,
        furthest: start,
    };
    text_from(value.as_bytes(), 0, input, start, &mut budget)
}

struct Budget {
    steps: usize,
    furthest: usize,
}

/// The rest of `value` from byte `vi` at `p`. Where one input can be read
/// two ways (`%25` for a `%`, `\\` for a `\`), the longer reading is tried
/// first and the other after it fails.
fn text_from(
    value: &[u8],
    mut vi: usize,
    input: &[u8],
    mut p: usize,
    budget: &mut Budget,
) -> Option<usize> {
    loop {
        budget.furthest = budget.furthest.max(p);
        if vi == value.len() {
            return Some(p);
        }
        if budget.steps == 0 {
            return Some(budget.furthest);
        }
        budget.steps -= 1;
        let c = *input.get(p)?;
        let b = value[vi];
        let mut ways = [(0usize, 0usize); 3];
        let mut n = 0;
        if c == b'\\' && (b & 0xC0) != 0x80 {
            if let Some((vlen, plen)) = json_escape(value, vi, input, p) {
                ways[n] = (vi + vlen, p + plen);
                n += 1;
            }
        }
        if c == b'%' && hex_byte(input, p + 1) == Some(b) {
            ways[n] = (vi + 1, p + 3);
            n += 1;
        }
        if c == b || (c == b'+' && b == b' ') {
            ways[n] = (vi + 1, p + 1);
            n += 1;
        }
        if n == 0 {
            return None;
        }
        for &(v, q) in &ways[..n - 1] {
            if let Some(end) = text_from(value, v, input, q, budget) {
                return Some(end);
            }
        }
        (vi, p) = ways[n - 1];
    }
}

/// The JSON escape at `p` (`input[p]` is `\`) when it stands for the
/// character of `value` at `vi`: that character's length and the escape's.
fn json_escape(value: &[u8], vi: usize, input: &[u8], p: usize) -> Option<(usize, usize)> {
    let len = match value[vi] {
        b if b < 0x80 => 1,
        b if b >= 0xF0 => 4,
        b if b >= 0xE0 => 3,
        _ => 2,
    };
    let wanted = std::str::from_utf8(value.get(vi..vi + len)?)
        .ok()?
        .chars()
        .next()?;
    let (got, plen) = json_unescape(input, p)?;
    (got == wanted).then_some((len, plen))
}

/// The character the JSON escape at `p` stands for, and its length.
fn json_unescape(input: &[u8], p: usize) -> Option<(char, usize)> {
    if input.get(p) != Some(&b'\\') {
        return None;
    }
    Some(match *input.get(p + 1)? {
        b'u' => {
            let unit = hex_unit(input, p + 2)?;
            if (0xD800..0xDC00).contains(&unit) {
                if input.get(p + 6..p + 8)? != b"\\u" {
                    return None;
                }
                let low = hex_unit(input, p + 8)?;
                if !(0xDC00..0xE000).contains(&low) {
                    return None;
                }
                let c = char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))?;
                (c, 12)
            } else {
                (char::from_u32(unit)?, 6)
            }
        }
        b'"' => ('"', 2),
        b'\\' => ('\\', 2),
        b'/' => ('/', 2),
        b'b' => ('\u{8}', 2),
        b'f' => ('\u{c}', 2),
        b'n' => ('\n', 2),
        b'r' => ('\r', 2),
        b't' => ('\t', 2),
        _ => return None,
    })
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The byte two hex digits at `p` stand for.
fn hex_byte(input: &[u8], p: usize) -> Option<u8> {
    let hi = hex_digit(*input.get(p)?)?;
    let lo = hex_digit(*input.get(p + 1)?)?;
    Some(hi << 4 | lo)
}

/// The UTF-16 unit four hex digits at `p` stand for.
fn hex_unit(input: &[u8], p: usize) -> Option<u32> {
    let hi = hex_byte(input, p)?;
    let lo = hex_byte(input, p + 2)?;
    Some(u32::from(hi) << 8 | u32::from(lo))
}

/// Where the hex of the whole `value` that starts at `p` ends.
fn match_hex(value: &[u8], input: &[u8], p: usize) -> Option<usize> {
    for (k, &b) in value.iter().enumerate() {
        if hex_byte(input, p + 2 * k)? != b {
            return None;
        }
    }
    Some(p + 2 * value.len())
}

/// Where the base64 form `f` that starts at `p` ends: its digits (with one
/// line break allowed between two of them), then, when present, the digit
/// it shares with what follows and its padding.
fn match_base64(f: &Base64Form, input: &[u8], p: usize) -> Option<usize> {
    let mut q = p;
    for (j, &d) in f.digits.iter().enumerate() {
        if j > 0 {
            q = skip_break(input, q);
        }
        if DECODE[usize::from(*input.get(q)?)] != d {
            return None;
        }
        q += 1;
    }
    if f.tail_bits > 0 {
        let r = skip_break(input, q);
        let d = input.get(r).map_or(INVALID, |&c| DECODE[usize::from(c)]);
        if d != INVALID && u32::from(d) >> (6 - f.tail_bits) == u32::from(f.tail) {
            q = r + 1;
            for _ in 0..2 {
                let r = skip_break(input, q);
                if input.get(r) != Some(&b'=') {
                    break;
                }
                q = r + 1;
            }
        }
    }
    Some(q)
}

/// `q` past one line break, when one is there.
fn skip_break(input: &[u8], q: usize) -> usize {
    let rest = &input[q.min(input.len())..];
    for brk in [&b"\r\n"[..], b"\n", b"\r", b"\\r\\n", b"\\n", b"\\r"] {
        if rest.starts_with(brk) {
            return q + brk.len();
        }
    }
    q
}

/// The base64 digits of `value` when it starts `shift` bytes into a
/// 3-byte group.
fn base64_form(value: &[u8], shift: usize) -> Base64Form {
    let bit = |i: usize| -> u8 {
        let i = i - shift * 8;
        (value[i / 8] >> (7 - i % 8)) & 1
    };
    let bits = |from: usize, count: usize| (from..from + count).fold(0u8, |n, i| n << 1 | bit(i));
    let first_bit = shift * 8;
    let end_bit = first_bit + value.len() * 8;
    let first = first_bit.div_ceil(6);
    let last = end_bit / 6; // exclusive
    let digits = (first..last.max(first)).map(|k| bits(k * 6, 6)).collect();
    let tail_bits = end_bit - last.max(first) * 6;
    Base64Form {
        digits,
        tail: bits(last.max(first) * 6, tail_bits.min(5)),
        tail_bits: tail_bits.min(5) as u32,
    }
}

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";
const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";
const INVALID: u8 = 0xFF;

/// The 6-bit value of a base64 character of either alphabet.
const DECODE: [u8; 256] = {
    let mut t = [INVALID; 256];
    let mut i = 0;
    while i < 64 {
        t[STANDARD[i] as usize] = i as u8;
        t[URL_SAFE[i] as usize] = i as u8;
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = "canary-SEKRIT \"q\" /+&=?\\ 123";

    fn scrubber() -> Scrubber {
        let mut s = Scrubber::default();
        s.add("token", &SecretString::new(CANARY));
        s
    }

    /// A secret with white space at its ends (agents-exe's `Clear false`,
    /// a decoded value), echoed by an API that dropped those ends from
    /// its header: still scrubbed.
    #[test]
    fn a_secret_without_its_surrounding_white_space_is_scrubbed() {
        let mut s = Scrubber::default();
        s.add("tok", &SecretString::new("  pad-CANARY-9 \n"));
        assert_eq!(s.scrub("echo: pad-CANARY-9."), "echo: <secret:tok>.");
        assert_eq!(s.scrub("x  pad-CANARY-9 \ny"), "x<secret:tok>y");
    }

    /// A tool printing the value in UTF-16 (either byte order), or the
    /// base64 of that, gives it away no more than printing it plainly.
    #[test]
    fn a_secret_in_utf16_is_scrubbed_and_found_in_bytes() {
        let mut s = Scrubber::default();
        s.add("tok", &SecretString::new("CANARY-u16-77"));
        let le: String = "CANARY-u16-77".chars().flat_map(|c| [c, '\0']).collect();
        let be: String = "CANARY-u16-77".chars().flat_map(|c| ['\0', c]).collect();
        assert_eq!(s.scrub(&format!("a{le}b")), "a<secret:tok>b");
        assert_eq!(s.scrub(&format!("a{be}b")), "a<secret:tok>b");
        assert!(s.finds_in(le.as_bytes()));
        assert!(s.finds_in(b64(be.as_bytes(), STD, true).as_bytes()));
        assert!(!s.finds_in("CANARY-u16".as_bytes()));
    }

    #[test]
    fn base64_matches_the_reference_encoding() {
        assert_eq!(b64(b"", STD, true), "");
        assert_eq!(b64(b"f", STD, true), "Zg==");
        assert_eq!(b64(b"fo", STD, true), "Zm8=");
        assert_eq!(b64(b"fo", STD, false), "Zm8");
        assert_eq!(b64(b"foo", STD, true), "Zm9v");
        assert_eq!(b64(b"foobar", STD, true), "Zm9vYmFy");
        assert_eq!(b64(&[0xfb, 0xff], STD, true), "+/8=");
        assert_eq!(b64(&[0xfb, 0xff], URL, true), "-_8=");
    }

    fn percent_encode(value: &[u8], upper: bool, keep: &str) -> String {
        let mut out = String::new();
        for &b in value {
            let unreserved = b.is_ascii_alphanumeric() || b"-._~".contains(&b);
            if unreserved || keep.as_bytes().contains(&b) {
                out.push(b as char);
            } else if upper {
                out.push_str(&format!("%{b:02X}"));
            } else {
                out.push_str(&format!("%{b:02x}"));
            }
        }
        out
    }

    #[test]
    fn exact_matches_become_named_markers() {
        let s = scrubber();
        assert_eq!(
            s.scrub(&format!("the token is {CANARY}.")),
            "the token is <secret:token>."
        );
        assert_eq!(s.scrub("nothing here"), "nothing here");
    }

    #[test]
    fn base64_alone_and_inside_longer_strings() {
        let s = scrubber();
        for alphabet in [STD, URL] {
            let alone = b64(CANARY.as_bytes(), alphabet, true);
            assert_eq!(s.scrub(&format!("b64 {alone}")), "b64 <secret:token>");
            for prefix in ["", "u:", "us:", "user:", "x"] {
                for suffix in ["", "!", "!!", "?!?"] {
                    let embedded = b64(
                        format!("{prefix}{CANARY}{suffix}").as_bytes(),
                        alphabet,
                        true,
                    );
                    let out = s.scrub(&embedded);
                    assert!(out.contains("<secret:token>"), "{prefix}|{suffix}: {out}");
                    // What is left is the prefix's, the suffix's and at most
                    // the bits shared with them.
                    let left = out.len() - "<secret:token>".len();
                    assert!(left <= (prefix.len() + suffix.len()) * 4 / 3 + 6, "{out}");
                }
            }
        }
    }

    #[test]
    fn url_and_json_encodings() {
        let s = scrubber();
        let encoded = percent_encode(CANARY.as_bytes(), true, "");
        assert!(encoded.contains("%22"), "{encoded}");
        assert_eq!(
            s.scrub(&format!("?t={encoded}&x=1")),
            "?t=<secret:token>&x=1"
        );
        let form = encoded.replace("%20", "+");
        assert_eq!(s.scrub(&format!("t={form}")), "t=<secret:token>");
        let lower = percent_encode(CANARY.as_bytes(), false, "/");
        assert_eq!(s.scrub(&lower), "<secret:token>");
        let json = serde_json::to_string(&serde_json::json!({"t": CANARY})).unwrap();
        assert_eq!(s.scrub(&json), r#"{"t":"<secret:token>"}"#);
        let mut u = Scrubber::default();
        u.add("key", &SecretString::new("clé-secrète"));
        assert_eq!(
            u.scrub(r#"{"k": "cl\u00e9-secr\u00e8te"}"#),
            r#"{"k": "<secret:key>"}"#
        );
        assert_eq!(u.scrub("k=cl%C3%A9-secr%C3%A8te"), "k=<secret:key>");
    }

    #[test]
    fn short_values_and_plain_values_are_left_alone() {
        let values: Values = [
            (
                "pin".to_string(),
                ParamValue::Secret(SecretString::new("123")),
            ),
            (
                "tenant".to_string(),
                ParamValue::Plain(serde_json::json!("acme-corp")),
            ),
            (
                "token".to_string(),
                ParamValue::Secret(SecretString::new("s3cr3t-value")),
            ),
        ]
        .into();
        let s = Scrubber::from_values(&values);
        assert_eq!(
            s.scrub("pin 123, tenant acme-corp, token s3cr3t-value"),
            "pin 123, tenant acme-corp, token <secret:token>"
        );
        assert!(Scrubber::default().is_empty());
    }

    /// Base64 of `data` with `alphabet`, padded or not, for the tests.
    fn b64(data: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
        let mut out = String::new();
        for chunk in data.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for k in 0..4 {
                if k <= chunk.len() {
                    out.push(alphabet[((n >> (18 - 6 * k)) & 63) as usize] as char);
                } else if pad {
                    out.push('=');
                }
            }
        }
        out
    }

    /// `text` cut into lines of `width` characters joined by `newline`.
    fn wrap(text: &str, width: usize, newline: &str) -> String {
        let chars: Vec<char> = text.chars().collect();
        chars
            .chunks(width)
            .map(|c| c.iter().collect::<String>())
            .collect::<Vec<_>>()
            .join(newline)
    }

    const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    /// `\uXXXX` for every UTF-16 unit of `c`, in either case.
    fn u_escape(c: char, upper: bool) -> String {
        let mut units = [0u16; 2];
        c.encode_utf16(&mut units)
            .iter()
            .map(|u| {
                if upper {
                    format!("\\u{u:04X}")
                } else {
                    format!("\\u{u:04x}")
                }
            })
            .collect()
    }

    #[test]
    fn json_with_escaped_characters_in_any_mix() {
        let value = "k&y<1>-SEKRIT-\u{e9}-\u{1F600}-\"q\"";
        let mut s = Scrubber::default();
        s.add("token", &SecretString::new(value));
        // Every character escaped, in either case.
        for upper in [false, true] {
            let all: String = value.chars().map(|c| u_escape(c, upper)).collect();
            assert_eq!(
                s.scrub(&format!("{{\"t\":\"{all}\"}}")),
                r#"{"t":"<secret:token>"}"#
            );
        }
        // Go's default: `&`, `<`, `>` escaped, the rest as serde writes it.
        let json = serde_json::to_string(value).unwrap();
        let go = json
            .replace('&', "\\u0026")
            .replace('<', "\\u003c")
            .replace('>', "\\u003e");
        assert!(go.contains("\\u0026"), "{go}");
        assert_eq!(s.scrub(&format!("x {go} y")), "x \"<secret:token>\" y");
        // Python's default: every non-ASCII character escaped, the emoji
        // as a surrogate pair.
        let python: String = value
            .chars()
            .map(|c| match c {
                '"' => "\\\"".to_string(),
                c if c.is_ascii() => c.to_string(),
                c => u_escape(c, false),
            })
            .collect();
        assert!(python.contains("\\ud83d\\ude00"), "{python}");
        assert_eq!(s.scrub(&python), "<secret:token>");
        // Every other character escaped, mixed case.
        let mixed: String = value
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    u_escape(c, i % 4 == 0)
                } else if c == '"' {
                    "\\\"".to_string()
                } else {
                    c.to_string()
                }
            })
            .collect();
        assert_eq!(s.scrub(&mixed), "<secret:token>");
    }

    #[test]
    fn base64_wrapped_at_any_width() {
        let s = scrubber();
        for alphabet in [STD, URL] {
            for pad in [true, false] {
                for prefix in ["", "u", "us", "user:"] {
                    let encoded = b64(format!("{prefix}{CANARY}").as_bytes(), alphabet, pad);
                    for width in [1, 2, 3, 4, 7, 64, 76, 80] {
                        for newline in ["\n", "\r\n"] {
                            let wrapped = wrap(&encoded, width, newline);
                            let out = s.scrub(&format!("data:\n{wrapped}\nend"));
                            assert!(out.contains("<secret:token>"), "{width} {newline:?}: {out}");
                            // What is left is the prefix's characters and
                            // at most one shared with the value.
                            let left = out
                                .replace("<secret:token>", "")
                                .replace(['\r', '\n'], "")
                                .len();
                            assert!(
                                left <= "dataend".len() + prefix.len() * 4 / 3 + 2,
                                "{width} {newline:?} {prefix:?}: {out}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn hex_in_either_case() {
        let s = scrubber();
        let lower = hex::encode(CANARY);
        assert_eq!(s.scrub(&format!("hex {lower}.")), "hex <secret:token>.");
        let upper = lower.to_uppercase();
        assert_eq!(s.scrub(&format!("HEX={upper}")), "HEX=<secret:token>");
    }

    #[test]
    fn a_cut_inside_a_secret_replaces_it_whole() {
        let s = scrubber();
        let text = format!("abc {CANARY} and then more text");
        let start = 4;
        for limit in 0..text.len() {
            if !text.is_char_boundary(limit) {
                continue;
            }
            let (out, cut) = s.scrub_cut(&text, limit);
            assert!(cut, "{limit}");
            if limit <= start {
                assert_eq!(out, text[..limit], "{limit}");
            } else if limit < start + CANARY.len() {
                assert_eq!(out, "abc <secret:token>", "{limit}");
            } else {
                assert_eq!(
                    out,
                    format!("abc <secret:token>{}", &text[start + CANARY.len()..limit])
                );
            }
        }
        assert_eq!(s.scrub_cut(&text, text.len()), (s.scrub(&text), false));
        // Cut inside a character: before it.
        assert_eq!(s.scrub_cut("ab\u{e9}cdef", 3), ("ab".to_string(), true));
        // The lookahead covers the longest form: every character of the
        // value as a surrogate pair.
        let mut wide = Scrubber::default();
        wide.add("t", &SecretString::new("\u{1F600}".repeat(5)));
        let escaped = "\\ud83d\\ude00".repeat(5);
        assert!(wide.lookahead() >= escaped.len());
        let (out, _) = wide.scrub_cut(&format!("x{escaped}y"), 2);
        assert_eq!(out, "x<secret:t>");
    }

    #[test]
    fn many_values_each_tried_only_where_it_can_start() {
        let mut s = Scrubber::default();
        for n in 0..3000 {
            s.add(
                &format!("s{n}"),
                &SecretString::new(format!("value-{n:05}-x")),
            );
        }
        assert_eq!(s.scrub("a value-01234-x b"), "a <secret:s1234> b");
        assert_eq!(s.scrub(&hex::encode("value-02999-x")), "<secret:s2999>");
        let b64 = b64(b"value-00007-x", URL, false);
        assert_eq!(s.scrub(&format!("[{b64}]")), "[<secret:s7>]");
        assert_eq!(s.scrub("value%2D00042%2dx"), "<secret:s42>");
        assert_eq!(
            s.scrub("<secret:s7> <secret:other> value-1-x"),
            "<secret:s7> <secret:other> value-1-x"
        );
        // The same value again keeps its first name.
        s.add("again", &SecretString::new("value-00003-x"));
        assert_eq!(s.scrub("value-00003-x"), "<secret:s3>");
    }

    #[test]
    fn a_marker_is_not_scrubbed_again() {
        let mut s = Scrubber::default();
        s.add("secret", &SecretString::new("secret"));
        assert_eq!(s.scrub("a secret"), "a <secret:secret>");
    }
}
