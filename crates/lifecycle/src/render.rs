//! The CLI's human output for the control socket's results.
//!
//! Each function returns the text (newline-terminated); the binary prints
//! it (libraries never print). With `--json` the binary prints the serde
//! JSON of the same types instead: `mcpbox sandboxes list --json` is an
//! array of [`SandboxInfo`], `show`/`pause`/`resume` one `SandboxInfo`,
//! `artifacts` an array of [`Artifact`], `export` an array of
//! [`Exported`], `destroy` a [`Teardown`], `snapshot` a [`SnapshotInfo`]:
//! the `result` of the control response as it came.
//!
//! Names, task names and paths come from clients and from files a sandboxed
//! server wrote: every one goes through [`escape`] so that an ANSI escape
//! or a carriage return in them never reaches the operator's terminal raw.

use std::fmt::Write as _;
use std::path::Path;

use crate::{Artifact, Exported, SandboxInfo, SnapshotInfo, Teardown};

/// `s` with every control, invisible and bidi character written as an
/// escape: the one terminal-safe escape, [`mcpbox_policy::terminal::escape`].
pub use mcpbox_policy::terminal::escape;

/// A path, escaped (lossy for bytes that are not UTF-8, which show as
/// U+FFFD).
pub fn escape_path(p: &Path) -> String {
    escape(&p.to_string_lossy()).into_owned()
}

/// Seconds as the largest whole unit: `5s`, `3m`, `2h`, `4d`.
pub fn duration(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Bytes with a binary unit: `512 B`, `1.5 KiB`, `3.0 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Rows aligned in columns two spaces apart; the last column is not padded.
/// Cells are already escaped.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                // `{:<w$}` pads by chars, as the widths count.
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `mcpbox sandboxes list`.
pub fn sandboxes_table(list: &[SandboxInfo]) -> String {
    if list.is_empty() {
        return "no sandboxes; they appear when a client of `mcpbox serve` opens a session\n"
            .to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                escape(&s.id).into_owned(),
                escape(&s.agent).into_owned(),
                escape(&s.server).into_owned(),
                s.task
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), |t| escape(t).into_owned()),
                s.state.as_str().to_owned(),
                duration(s.idle_seconds),
                s.sessions.to_string(),
                escape_path(&s.workspace),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "AGENT",
            "SERVER",
            "TASK",
            "STATE",
            "IDLE",
            "SESSIONS",
            "WORKSPACE",
        ],
        &rows,
    )
}

/// `mcpbox sandboxes show`: one `key: value` line per field.
pub fn sandbox_detail(s: &SandboxInfo) -> String {
    let mut lines: Vec<(&str, String)> = vec![
        ("id", escape(&s.id).into_owned()),
        ("agent", escape(&s.agent).into_owned()),
        ("server", escape(&s.server).into_owned()),
        (
            "task",
            s.task
                .as_deref()
                .map_or_else(|| "-".to_owned(), |t| escape(t).into_owned()),
        ),
    ];
    if let Some(t) = &s.template {
        lines.push(("template", escape(t).into_owned()));
    }
    lines.extend([
        ("state", s.state.as_str().to_owned()),
        ("workspace", escape_path(&s.workspace)),
        ("idle", duration(s.idle_seconds)),
        ("created", escape(&s.created).into_owned()),
        ("sessions", s.sessions.to_string()),
        ("processes", s.processes.to_string()),
    ]);
    if let Some(us) = s.cpu_usec {
        lines.push((
            "cpu",
            format!("{}.{:03}s", us / 1_000_000, us % 1_000_000 / 1000),
        ));
    }
    if let Some(b) = s.memory_bytes {
        lines.push(("memory", format!("{:.1} MiB", b as f64 / 1048576.0)));
    }
    if let Some(f) = &s.freezer {
        lines.push(("freezer", escape(f).into_owned()));
    }
    if let Some(n) = &s.note {
        lines.push(("note", escape(n).into_owned()));
    }
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (k, v) in lines {
        let _ = writeln!(out, "{:<width$} {v}", format!("{k}:"));
    }
    out
}

/// `mcpbox sandboxes artifacts`: PATH, SIZE, STATUS (`ok` or the refusal).
pub fn artifacts_table(list: &[Artifact]) -> String {
    if list.is_empty() {
        return "no artifacts: no file of output matches the policy's artifact patterns\n"
            .to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|a| {
            vec![
                escape(&a.path).into_owned(),
                bytes(a.size),
                a.refused
                    .as_deref()
                    .map_or_else(|| "ok".to_owned(), |r| escape(r).into_owned()),
            ]
        })
        .collect();
    let mut out = table(&["PATH", "SIZE", "STATUS"], &rows);
    let large: Vec<String> = list
        .iter()
        .filter(|a| {
            a.refused
                .as_deref()
                .is_some_and(|r| r.ends_with("needs approval"))
        })
        .map(|a| escape(&crate::artifacts::approval_arg(&a.path, a.size)).into_owned())
        .collect();
    if !large.is_empty() {
        // the approval names the size shown: a file that grows after
        // this listing is not exported under it
        let _ = writeln!(
            out,
            "to export one over the limit at the size shown: --approve-large {}",
            large.join(" --approve-large ")
        );
    }
    out
}

/// `mcpbox sandboxes export`: what was copied, with digests.
pub fn exported(list: &[Exported]) -> String {
    if list.is_empty() {
        return "nothing exported: no artifact could be copied out\n".to_owned();
    }
    let total: u64 = list.iter().map(|e| e.size).sum();
    let mut out = format!(
        "exported {} file{} ({})\n",
        list.len(),
        if list.len() == 1 { "" } else { "s" },
        bytes(total)
    );
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| {
            vec![
                escape(&e.path).into_owned(),
                bytes(e.size),
                escape(&e.sha256).into_owned(),
            ]
        })
        .collect();
    out.push_str(&table(&["PATH", "SIZE", "SHA256"], &rows));
    out
}

/// `mcpbox sandboxes destroy`: clean, or what was left.
pub fn teardown(t: &Teardown) -> String {
    let id = escape(&t.id);
    let mut out = if t.clean() {
        format!("destroyed {id}: clean, nothing left behind\n")
    } else {
        let mut s = format!("destroyed {id}, but {} thing", t.left.len());
        s.push_str(if t.left.len() == 1 { " was" } else { "s were" });
        s.push_str(" left behind:\n");
        for l in &t.left {
            let _ = writeln!(s, "  - {}", escape(l));
        }
        s
    };
    for e in &t.exported {
        let _ = writeln!(
            out,
            "exported {} ({}, sha256 {})",
            escape(&e.path),
            bytes(e.size),
            escape(&e.sha256)
        );
    }
    for (secret, how) in &t.revoked {
        let _ = writeln!(out, "revoked {}: {}", escape(secret), escape(how));
    }
    out
}

/// `mcpbox sandboxes snapshot`.
pub fn snapshot(s: &SnapshotInfo) -> String {
    let mut out = format!(
        "wrote {}: {} entr{}, {}, manifest sha256 {}\n",
        escape_path(&s.archive),
        s.entries,
        if s.entries == 1 { "y" } else { "ies" },
        bytes(s.bytes),
        escape(&s.manifest_sha256)
    );
    // what a server left that no snapshot carries: worth a look
    for k in &s.skipped {
        out.push_str(&format!(
            "skipped {} ({}): {}\n",
            escape(&k.path),
            escape(&k.kind),
            escape(&k.reason)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::State;

    fn info(task: Option<&str>, workspace: &str) -> SandboxInfo {
        SandboxInfo {
            id: "sb-0123456789abcdef".into(),
            agent: "alice".into(),
            server: "fs".into(),
            task: task.map(String::from),
            template: None,
            state: State::Running,
            workspace: PathBuf::from(workspace),
            idle_seconds: 185,
            created: "2025-01-02T03:04:05Z".into(),
            sessions: 2,
            processes: 3,
            cpu_usec: Some(1_234_567),
            memory_bytes: Some(50 << 20),
            freezer: Some("v2".into()),
            note: None,
        }
    }

    #[test]
    fn escape_writes_ansi_and_control_characters_in_a_task_name_as_escapes() {
        let hostile = "t1\x1b[2J\x1b]0;pwned\x07\r\n\u{9b}31m";
        let e = escape(hostile);
        assert_eq!(e, "t1\\x1b[2J\\x1b]0;pwned\\x07\\r\\n\\x9b31m");
        assert!(!e.chars().any(|c| c.is_control()));
    }

    #[test]
    fn escape_writes_bidi_overrides_and_backslashes_in_a_path_as_escapes() {
        let p = Path::new("/out/invoice\u{202e}fdp.exe\\x\x7f");
        assert_eq!(escape_path(p), "/out/invoice\\u{202e}fdp.exe\\\\x\\x7f");
    }

    #[test]
    fn escape_leaves_ordinary_text_alone() {
        assert!(matches!(
            escape("issue-42 é ✓"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn units_are_humanised() {
        assert_eq!(duration(5), "5s");
        assert_eq!(duration(185), "3m");
        assert_eq!(duration(7300), "2h");
        assert_eq!(duration(3 * 86_400), "3d");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
    }

    #[test]
    fn sandboxes_table_is_aligned_and_escapes_a_hostile_task() {
        let mut b = info(
            Some("evil\x1b[31m"),
            "/var/lib/mcpbox/sb/sb-fedcba9876543210",
        );
        b.id = "sb-fedcba9876543210".into();
        b.agent = "bob".into();
        b.server = "git".into();
        b.state = State::Paused;
        b.idle_seconds = 4;
        b.sessions = 0;
        let t = sandboxes_table(&[info(None, "/var/lib/mcpbox/sb/sb-0123456789abcdef"), b]);
        assert_eq!(
            t,
            "\
ID                   AGENT  SERVER  TASK          STATE    IDLE  SESSIONS  WORKSPACE
sb-0123456789abcdef  alice  fs      -             running  3m    2         /var/lib/mcpbox/sb/sb-0123456789abcdef
sb-fedcba9876543210  bob    git     evil\\x1b[31m  paused   4s    0         /var/lib/mcpbox/sb/sb-fedcba9876543210
"
        );
        assert!(!t.contains('\x1b'));
    }

    #[test]
    fn an_empty_list_prints_a_hint() {
        assert_eq!(
            sandboxes_table(&[]),
            "no sandboxes; they appear when a client of `mcpbox serve` opens a session\n"
        );
    }

    #[test]
    fn sandbox_detail_is_key_value_lines() {
        assert_eq!(
            sandbox_detail(&info(Some("t1"), "/w")),
            "\
id:        sb-0123456789abcdef
agent:     alice
server:    fs
task:      t1
state:     running
workspace: /w
idle:      3m
created:   2025-01-02T03:04:05Z
sessions:  2
processes: 3
cpu:       1.234s
memory:    50.0 MiB
freezer:   v2
"
        );
    }

    #[test]
    fn artifacts_table_says_ok_or_why_not() {
        let list = [
            Artifact {
                path: "report.pdf".into(),
                size: 2048,
                refused: None,
            },
            Artifact {
                path: "link\x1b[0m".into(),
                size: 10,
                refused: Some("a symlink".into()),
            },
        ];
        assert_eq!(
            artifacts_table(&list),
            "\
PATH         SIZE     STATUS
report.pdf   2.0 KiB  ok
link\\x1b[0m  10 B     a symlink
"
        );
    }

    #[test]
    fn artifacts_table_names_the_approval_of_a_large_file_at_its_size() {
        let list = [Artifact {
            path: "big.bin".into(),
            size: 4096,
            refused: Some("4096 bytes, over the limit of 1024: needs approval".into()),
        }];
        let out = artifacts_table(&list);
        assert!(
            out.ends_with("at the size shown: --approve-large big.bin=4096\n"),
            "{out}"
        );
    }

    #[test]
    fn teardown_says_clean_or_lists_what_was_left() {
        let mut t = Teardown {
            id: "sb-0123456789abcdef".into(),
            ..Teardown::default()
        };
        assert_eq!(
            teardown(&t),
            "destroyed sb-0123456789abcdef: clean, nothing left behind\n"
        );
        t.left = vec!["cgroup /sys/fs/cgroup/mcpbox/sb-0123456789abcdef".into()];
        t.revoked = vec![("GITHUB_TOKEN".into(), "exit 0".into())];
        assert_eq!(
            teardown(&t),
            "\
destroyed sb-0123456789abcdef, but 1 thing was left behind:
  - cgroup /sys/fs/cgroup/mcpbox/sb-0123456789abcdef
revoked GITHUB_TOKEN: exit 0
"
        );
    }

    #[test]
    fn snapshot_and_export_summaries() {
        let s = SnapshotInfo {
            archive: "/backups/a\nb.tar".into(),
            entries: 1,
            bytes: 100,
            manifest_sha256: "ab".repeat(32),
            skipped: vec![],
        };
        assert_eq!(
            snapshot(&s),
            format!(
                "wrote /backups/a\\nb.tar: 1 entry, 100 B, manifest sha256 {}\n",
                "ab".repeat(32)
            )
        );
        let e = [Exported {
            path: "r.txt".into(),
            size: 3,
            sha256: "cd".repeat(32),
        }];
        assert_eq!(
            exported(&e),
            format!(
                "exported 1 file (3 B)\nPATH   SIZE  SHA256\nr.txt  3 B   {}\n",
                "cd".repeat(32)
            )
        );
        assert_eq!(
            exported(&[]),
            "nothing exported: no artifact could be copied out\n"
        );
    }
}
