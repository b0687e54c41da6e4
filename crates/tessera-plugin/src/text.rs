//! Text helpers of the plugin's views: ages as kubectl prints them, one-line
//! messages, and tables whose last column is cut to the terminal width.

/// An age or a wait as kubectl prints it: `42s`, `5m12s`, `3h4m`, `2d5h`; `0s` for
/// anything not positive.
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    let (d, h, m, sec) = (s / 86_400, (s / 3600) % 24, (s / 60) % 60, s % 60);
    if d > 0 {
        if h > 0 {
            format!("{d}d{h}h")
        } else {
            format!("{d}d")
        }
    } else if h > 0 {
        if m > 0 {
            format!("{h}h{m}m")
        } else {
            format!("{h}h")
        }
    } else if m > 0 {
        if sec > 0 {
            format!("{m}m{sec}s")
        } else {
            format!("{m}m")
        }
    } else {
        format!("{sec}s")
    }
}

/// `s` on one line: line breaks (daemon log tails in `lastError`) become ` ⏎ `.
pub fn one_line(s: &str) -> String {
    s.trim_end()
        .split('\n')
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join(" ⏎ ")
}

/// `s` cut to at most `max` characters, the last one `…` when something was cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// A table with a header row, columns separated by three spaces (as kubectl). With
/// `width`, the last column is cut so that no line is longer (it keeps at least 10
/// characters, so a very narrow terminal wraps rather than losing the message).
pub fn table(headers: &[&str], rows: &[Vec<String>], width: Option<usize>) -> String {
    let n = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(n) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let prefix: usize = widths[..n.saturating_sub(1)].iter().map(|w| w + 3).sum();
    let last_max = width.map(|w| w.saturating_sub(prefix).max(10));
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate().take(n) {
            if i + 1 == n {
                match last_max {
                    Some(max) => line.push_str(&truncate(cell, max)),
                    None => line.push_str(cell),
                }
            } else {
                line.push_str(cell);
                let pad = widths[i] - cell.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        for (secs, want) in [
            (-5, "0s"),
            (0, "0s"),
            (42, "42s"),
            (60, "1m"),
            (312, "5m12s"),
            (3600, "1h"),
            (3600 + 4 * 60 + 9, "1h4m"),
            (86_400, "1d"),
            (2 * 86_400 + 5 * 3600 + 7, "2d5h"),
        ] {
            assert_eq!(age(secs), want, "{secs}");
        }
    }

    #[test]
    fn truncation() {
        for (s, max, want) in [
            ("hello", 10, "hello"),
            ("hello", 5, "hello"),
            ("hello world", 6, "hello…"),
            ("héllo wörld", 4, "hél…"),
            ("", 0, ""),
            ("xy", 0, ""),
        ] {
            assert_eq!(truncate(s, max), want, "{s:?} {max}");
        }
        assert_eq!(one_line("a\nb\n"), "a ⏎ b");
    }

    #[test]
    fn tables_align_and_cut_the_last_column() {
        let rows = vec![
            vec!["a".to_string(), "long message here".to_string()],
            vec!["bbbb".to_string(), "short".to_string()],
        ];
        assert_eq!(
            table(&["ID", "MESSAGE"], &rows, None),
            "ID     MESSAGE\na      long message here\nbbbb   short\n"
        );
        // 7 columns of prefix, 10 at least for the message.
        assert_eq!(
            table(&["ID", "MESSAGE"], &rows, Some(17)),
            "ID     MESSAGE\na      long mess…\nbbbb   short\n"
        );
        assert_eq!(
            table(&["ID", "MESSAGE"], &rows, Some(3)).lines().nth(1),
            Some("a      long mess…"),
            "the message keeps 10 characters however narrow"
        );
    }
}
