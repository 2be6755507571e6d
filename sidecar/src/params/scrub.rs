//! Scrubbing tool output: every secret value a run can reach is replaced by
//! `<secret:NAME>` before a tool's text goes anywhere (the model, the
//! history, the store, the event stream, logs).
//!
//! Tools print secrets in the forms programs print them, so each value is
//! looked for as it is and as:
//! - base64, standard and URL-safe, padded or not, and at each of the three
//!   alignments it can have inside a longer encoded string (`Basic
//!   base64(user:token)`): the characters that depend on the value alone;
//! - URL-encoded (upper- and lower-case hex, `+` or `%20` for a space, `/`
//!   kept or encoded);
//! - JSON-escaped (as serde and as ASCII-only encoders write it, `\/` too).
//!
//! Values shorter than [`MIN_LEN`] bytes are left alone: such a value (a
//! PIN, a flag, a digit) occurs everywhere in ordinary output, and each
//! replacement would mangle the text and point at where the value occurs.

use super::{ParamValue, SecretString, Values};

/// The shortest value that is scrubbed, in bytes.
pub const MIN_LEN: usize = 4;

/// The shortest base64 fragment looked for at a shifted alignment: shorter
/// ones match unrelated base64 text too often.
const MIN_FRAGMENT: usize = 6;

/// What to look for, longest first, and what replaces it.
pub struct Scrubber {
    needles: Vec<(Vec<u8>, String)>,
    /// Bytes some needle starts with: most positions are skipped at once.
    starts: [bool; 256],
}

impl Default for Scrubber {
    fn default() -> Self {
        Scrubber {
            needles: Vec::new(),
            starts: [false; 256],
        }
    }
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scrubber({} patterns)", self.needles.len())
    }
}

impl Scrubber {
    /// A scrubber for the secret values among `values`, each named by its
    /// parameter.
    pub fn from_values(values: &Values) -> Scrubber {
        let mut s = Scrubber::default();
        for (name, v) in values {
            if let ParamValue::Secret(secret) = v {
                s.add(name, secret);
            }
        }
        s
    }

    /// Look for `secret` too, replacing it by `<secret:NAME>`.
    pub fn add(&mut self, name: &str, secret: &SecretString) {
        let value = secret.expose();
        if value.len() < MIN_LEN {
            return;
        }
        let marker = format!("<secret:{name}>");
        for form in forms(value.as_bytes()) {
            if !self.needles.iter().any(|(n, _)| *n == form) {
                self.starts[usize::from(form[0])] = true;
                self.needles.push((form, marker.clone()));
            }
        }
        // Longest first: a full encoding goes before its fragments.
        self.needles.sort_by_key(|n| std::cmp::Reverse(n.0.len()));
    }

    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// `text` with every occurrence of a secret replaced. One left-to-right
    /// pass: a marker is never searched again.
    pub fn scrub(&self, text: &str) -> String {
        if self.needles.is_empty() {
            return text.to_string();
        }
        let bytes = text.as_bytes();
        let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
        let mut i = 0;
        'outer: while i < bytes.len() {
            if !self.starts[usize::from(bytes[i])] {
                out.push(bytes[i]);
                i += 1;
                continue;
            }
            for (needle, marker) in &self.needles {
                if bytes[i..].starts_with(needle) {
                    out.extend_from_slice(marker.as_bytes());
                    i += needle.len();
                    continue 'outer;
                }
            }
            out.push(bytes[i]);
            i += 1;
        }
        // A needle may begin or end inside a multi-byte character only if
        // the value itself does, which a `str` value cannot.
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

/// Every form of `value` to look for.
fn forms(value: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![value.to_vec()];
    for alphabet in [STANDARD, URL_SAFE] {
        let full = base64(value, alphabet);
        out.push(full.trim_end_matches('=').as_bytes().to_vec());
        out.push(full.into_bytes());
        for shift in 0..3 {
            let fragment = base64_fragment(value, shift, alphabet);
            if fragment.len() >= MIN_FRAGMENT {
                out.push(fragment.into_bytes());
            }
        }
    }
    let text = String::from_utf8_lossy(value);
    for upper in [true, false] {
        for keep in ["", "/", "!'()*"] {
            let encoded = percent_encode(value, upper, keep);
            out.push(encoded.replace("%20", "+").into_bytes());
            out.push(encoded.into_bytes());
        }
    }
    let json = serde_json::to_string(text.as_ref()).unwrap_or_default();
    let json = json[1..json.len() - 1].to_string();
    out.push(json.replace('/', "\\/").into_bytes());
    out.push(ascii_json(&json).into_bytes());
    out.push(json.into_bytes());
    out.retain(|f| !f.is_empty());
    out
}

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Padded base64.
fn base64(data: &[u8], alphabet: &[u8; 64]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(alphabet[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The base64 characters that depend on `value` alone when it starts
/// `shift` bytes into a 3-byte group of a longer encoded string.
fn base64_fragment(value: &[u8], shift: usize, alphabet: &[u8; 64]) -> String {
    let mut padded = vec![0u8; shift];
    padded.extend_from_slice(value);
    let encoded = base64(&padded, alphabet);
    // Characters (6 bits each) fully inside the value's bits.
    let first_bit = shift * 8;
    let end_bit = padded.len() * 8;
    let first = first_bit.div_ceil(6);
    let last = end_bit / 6; // exclusive
    if last <= first {
        return String::new();
    }
    encoded[first..last].to_string()
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

/// JSON text with every non-ASCII character as `\uXXXX` (as Python's
/// `json.dumps` writes by default).
fn ascii_json(json: &str) -> String {
    let mut out = String::new();
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = "canary-SEKRIT \"q\" /+&=?\\ 123";

    fn scrubber() -> Scrubber {
        let mut s = Scrubber::default();
        s.add("token", &SecretString::new(CANARY));
        s
    }

    #[test]
    fn base64_matches_the_reference_encoding() {
        assert_eq!(base64(b"", STANDARD), "");
        assert_eq!(base64(b"f", STANDARD), "Zg==");
        assert_eq!(base64(b"fo", STANDARD), "Zm8=");
        assert_eq!(base64(b"foo", STANDARD), "Zm9v");
        assert_eq!(base64(b"foobar", STANDARD), "Zm9vYmFy");
        assert_eq!(base64(&[0xfb, 0xff], STANDARD), "+/8=");
        assert_eq!(base64(&[0xfb, 0xff], URL_SAFE), "-_8=");
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
        for alphabet in [STANDARD, URL_SAFE] {
            let alone = base64(CANARY.as_bytes(), alphabet);
            assert_eq!(s.scrub(&format!("b64 {alone}")), "b64 <secret:token>");
            for prefix in ["", "u:", "us:", "user:", "x"] {
                for suffix in ["", "!", "!!", "?!?"] {
                    let embedded = base64(format!("{prefix}{CANARY}{suffix}").as_bytes(), alphabet);
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

    #[test]
    fn a_marker_is_not_scrubbed_again() {
        let mut s = Scrubber::default();
        s.add("secret", &SecretString::new("secret"));
        assert_eq!(s.scrub("a secret"), "a <secret:secret>");
    }
}
