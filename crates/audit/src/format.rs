//! Output for `mcpbox audit`: the library builds the strings, the binary prints.

use crate::time::format_time;
use crate::Event;

/// Longest cell in the table; longer values are cut with `…`.
const MAX_CELL: usize = 60;

/// One event as a single line of JSON (no trailing newline): the form of
/// `mcpbox audit --json` and of [`crate::JsonlStore`] files. Control
/// characters are escaped by the JSON encoder, so the line is safe to print.
pub fn to_json_line(event: &Event) -> String {
    // Serializing plain data with string keys cannot fail; never panic anyway.
    serde_json::to_string(event).unwrap_or_else(|e| {
        tracing::error!(error = %e, "audit event could not be serialized");
        String::from("{}")
    })
}

/// Replaces what a terminal would interpret (control characters, escape
/// sequences, bidirectional overrides, zero-width marks) with `?`, and cuts
/// long values. Server and tool names come from untrusted servers.
fn cell(s: &str) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == MAX_CELL {
            out.push('…');
            break;
        }
        out.push(if mcpbox_policy::terminal::is_unsafe(c) {
            '?'
        } else {
            c
        });
    }
    out
}

/// An aligned text table, one event per line, with a header: time (UTC ISO
/// 8601), kind, server, tool, decision, reason, duration, and what the event
/// touched: the host and port of a network event, the command categories of
/// a checked call, the files it wrote (the first, and how many more).
/// Missing values show as `-`. Ends with a newline.
pub fn format_table(events: &[Event]) -> String {
    const HEADER: [&str; 10] = [
        "TIME", "KIND", "SERVER", "TOOL", "DECISION", "REASON", "DURATION", "HOST", "CATEGORY",
        "FILES",
    ];
    let dash = || "-".to_owned();
    let rows: Vec<[String; 10]> = events
        .iter()
        .map(|e| {
            [
                format_time(e.time_ms),
                e.kind.map_or_else(dash, |k| k.as_str().to_owned()),
                if e.server.is_empty() {
                    dash()
                } else {
                    cell(&e.server)
                },
                e.tool.as_deref().map_or_else(dash, cell),
                e.decision.map_or_else(dash, |d| d.as_str().to_owned()),
                e.reason.as_deref().map_or_else(dash, cell),
                e.duration_ms.map_or_else(dash, |d| format!("{d}ms")),
                host(e).map_or_else(dash, |h| cell(&h)),
                categories(e).map_or_else(dash, |c| cell(&c)),
                files(e).map_or_else(dash, |f| cell(&f)),
            ]
        })
        .collect();
    let mut widths = HEADER.map(|h| h.chars().count());
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut push_row = |cells: &[&str]| {
        let last = cells.len() - 1;
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            out.push_str(c);
            if i < last {
                let pad = w.saturating_sub(c.chars().count()) + 2;
                out.push_str(&" ".repeat(pad));
            }
        }
        out.push('\n');
    };
    push_row(&HEADER);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        push_row(&cells);
    }
    out
}

/// `host:port` of a network event (`detail.host`, `detail.port`).
fn host(e: &Event) -> Option<String> {
    let h = e.detail.get("host")?.as_str()?;
    Some(
        match e.detail.get("port").and_then(serde_json::Value::as_u64) {
            Some(p) => format!("{h}:{p}"),
            None => h.to_owned(),
        },
    )
}

/// The command categories a checked call was found to have
/// (`detail.categories`, from `[commands]`), comma-separated.
fn categories(e: &Event) -> Option<String> {
    let list = e.detail.get("categories")?.as_array()?;
    let names: Vec<&str> = list.iter().filter_map(serde_json::Value::as_str).collect();
    (!names.is_empty()).then(|| names.join(","))
}

/// The first file written, and how many more.
fn files(e: &Event) -> Option<String> {
    let first = e.files_written.first()?;
    Some(match e.files_written.len() {
        1 => first.clone(),
        n => format!("{first} (+{})", n - 1),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{Kind, Verdict};

    fn ev(server: &str, tool: &str) -> Event {
        Event {
            time_ms: 1_795_946_400_123,
            kind: Some(Kind::ToolCall),
            server: server.into(),
            tool: Some(tool.into()),
            decision: Some(Verdict::Deny),
            reason: Some("tool.deny_rule".into()),
            duration_ms: Some(12),
            ..Event::default()
        }
    }

    #[test]
    fn table_columns_line_up() {
        let t = format_table(&[ev("fs", "write_file"), ev("everything-server", "x")]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("TIME"));
        assert!(lines[1].starts_with("2026-11-29T10:00:00.123Z  tool_call  fs "));
        let col = |l: &str, word: &str| l.find(word).unwrap();
        assert_eq!(col(lines[0], "TOOL"), col(lines[1], "write_file"));
        assert_eq!(col(lines[0], "TOOL"), col(lines[2], " x ") + 1);
        assert_eq!(col(lines[0], "DECISION"), col(lines[2], "deny"));
        assert!(lines[1].contains("12ms"));
    }

    #[test]
    fn terminal_escapes_in_untrusted_names_are_neutralised() {
        let t = format_table(&[ev("evil\u{1b}]0;pwned\u{7}", "rm\u{202e}fdp.exe\r\n")]);
        assert!(!t.contains('\u{1b}'));
        assert!(!t.contains('\u{7}'));
        assert!(!t.contains('\u{202e}'));
        assert!(!t.contains('\r'));
        assert_eq!(t.lines().count(), 2);
    }

    #[test]
    fn long_values_are_cut() {
        let long = "a".repeat(500);
        let t = format_table(&[ev(&long, "t")]);
        assert!(t.lines().all(|l| l.chars().count() < 250));
        assert!(t.contains('…'));
    }

    #[test]
    fn empty_and_missing_fields_show_dashes() {
        let t = format_table(&[Event::default()]);
        let row = t.lines().nth(1).unwrap();
        assert!(row.starts_with("1970-01-01T00:00:00.000Z  -"));
        assert_eq!(row.split_whitespace().filter(|c| *c == "-").count(), 9);
    }

    #[test]
    fn host_categories_and_files_have_columns() {
        let mut net = ev("fs", "x");
        net.kind = Some(Kind::Network);
        net.tool = None;
        net.detail = serde_json::json!({"host": "pypi.org", "port": 443});
        let mut call = ev("sh", "exec");
        call.detail = serde_json::json!({"categories": ["delete", "network"]});
        call.files_written = vec!["a.txt".into(), "b.txt".into(), "c.txt".into()];
        let t = format_table(&[net, call]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].contains("HOST")
                && lines[0].contains("CATEGORY")
                && lines[0].ends_with("FILES")
        );
        assert!(lines[1].contains("pypi.org:443"), "{t}");
        assert!(lines[2].contains("delete,network"), "{t}");
        assert!(lines[2].ends_with("a.txt (+2)"), "{t}");
        // a hostile host name is neutralised like any cell
        let mut evil = ev("fs", "x");
        evil.detail = serde_json::json!({"host": "a\u{1b}[2Jb"});
        assert!(!format_table(&[evil]).contains('\u{1b}'));
    }

    #[test]
    fn json_line_is_one_line_and_round_trips() {
        let mut e = ev("s\nx", "t");
        e.detail = serde_json::json!({"host": "a\u{1b}b"});
        let line = to_json_line(&e);
        assert!(!line.contains('\n'));
        assert!(!line.contains('\u{1b}'));
        let back: Event = serde_json::from_str(&line).unwrap();
        assert_eq!(back, e);
    }
}
