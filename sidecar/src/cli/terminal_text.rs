//! Text someone else wrote (a session file's author, a model, an MCP
//! server) made safe to show on a terminal: no control sequence (ESC, OSC,
//! CSI, C1) reaches the terminal to move its cursor, retitle it or hide
//! what follows, and no bidi mark reorders what is shown around it. The
//! logs ([`super::telemetry::escape_controls`]) and the CLI's human output
//! share this one definition.

use std::borrow::Cow;

/// Whether `c` is shown as it is: not a control (but a tab), not a line
/// or paragraph separator, not a bidi mark or isolate.
pub fn shown_as_is(c: char) -> bool {
    c == '\t'
        || !(c.is_control()
            || matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
            )
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c))
}

/// `c` (one not [`shown_as_is`]) written as visible text: `\r`, or
/// `\u{1b}` and the like.
pub fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        c => out.extend(c.escape_unicode()),
    }
}

/// `text` for a terminal: its lines kept (`\n`), every other character
/// not [`shown_as_is`] escaped.
pub fn for_terminal(text: &str) -> Cow<'_, str> {
    if text.chars().all(|c| c == '\n' || shown_as_is(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c == '\n' || shown_as_is(c) {
            out.push(c);
        } else {
            push_escaped(&mut out, c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_marks_are_shown_escaped_lines_and_tabs_kept() {
        let hostile =
            "a\u{1b}]0;title\u{7}b\u{1b}[2Jc\u{9b}1A\r\u{7f}\u{202e}d\u{2066}e\u{2069}\n\tf";
        assert_eq!(
            for_terminal(hostile),
            "a\\u{1b}]0;title\\u{7}b\\u{1b}[2Jc\\u{9b}1A\\r\\u{7f}\\u{202e}d\\u{2066}e\\u{2069}\n\tf"
        );
        assert!(matches!(
            for_terminal("plain\n\ttext é 😀"),
            Cow::Borrowed(_)
        ));
    }
}
