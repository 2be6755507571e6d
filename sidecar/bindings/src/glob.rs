//! Tool-name globs: `*` matches any run of characters, everything else
//! matches itself (agents-exe's rule, so existing files mean the same).

pub fn glob_matches(glob: &str, name: &str) -> bool {
    let (g, n) = (glob.as_bytes(), name.as_bytes());
    // Iterative match with single-star backtracking: linear in practice.
    let (mut gi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if gi < g.len() && g[gi] == b'*' {
            star = Some((gi, ni));
            gi += 1;
        } else if gi < g.len() && g[gi] == n[ni] {
            gi += 1;
            ni += 1;
        } else if let Some((sg, sn)) = star {
            gi = sg + 1;
            ni = sn + 1;
            star = Some((sg, sn + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs() {
        for (g, n, want) in [
            ("query-*", "query-invoices", true),
            ("query-*", "query-", true),
            ("query-*", "export-query", false),
            ("*", "anything", true),
            ("*-invoices", "query-invoices", true),
            ("bash_*-*s", "bash_query-invoices", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("", "", true),
            ("", "x", false),
            ("?", "x", false),
        ] {
            assert_eq!(glob_matches(g, n), want, "{g} ~ {n}");
        }
    }
}
