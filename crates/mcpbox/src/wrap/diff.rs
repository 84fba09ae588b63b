//! A unified diff of two texts, for `mcpbox wrap --dry-run`: a longest
//! common subsequence of lines (host configs are small; a pair too large
//! for the table shows as one hunk replacing everything).

/// Lines each side beyond which the quadratic table is not built.
const MAX_LINES: usize = 4000;
const CONTEXT: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Same,
    Del,
    Add,
}

/// `--- a/NAME` / `+++ b/NAME` and hunks with three lines of context;
/// empty when the texts are equal.
pub fn unified(old: &str, new: &str, name: &str) -> String {
    if old == new {
        return String::new();
    }
    let a: Vec<&str> = old.split_inclusive('\n').collect();
    let b: Vec<&str> = new.split_inclusive('\n').collect();
    let ops = script(&a, &b);
    // positions (index into a, index into b) before each op
    let mut pos = Vec::with_capacity(ops.len() + 1);
    let (mut i, mut j) = (0, 0);
    for op in &ops {
        pos.push((i, j));
        match op {
            Op::Same => (i, j) = (i + 1, j + 1),
            Op::Del => i += 1,
            Op::Add => j += 1,
        }
    }
    pos.push((i, j));
    let mut out = format!("--- a/{name}\n+++ b/{name}\n");
    let mut k = 0;
    while k < ops.len() {
        if ops[k] == Op::Same {
            k += 1;
            continue;
        }
        // a hunk: from CONTEXT before this change to CONTEXT after the last
        // change that is within 2*CONTEXT of the previous one
        let start = k.saturating_sub(CONTEXT);
        let mut end = k;
        let mut last_change = k;
        while end < ops.len() {
            if ops[end] != Op::Same {
                last_change = end;
            } else if end - last_change > 2 * CONTEXT {
                break;
            }
            end += 1;
        }
        let end = (last_change + 1 + CONTEXT).min(ops.len());
        let (a0, b0) = pos[start];
        let (a1, b1) = pos[end];
        out.push_str(&format!(
            "@@ -{} +{} @@\n",
            range(a0, a1 - a0),
            range(b0, b1 - b0)
        ));
        for (op, &(ai, bj)) in ops[start..end].iter().zip(&pos[start..end]) {
            let (mark, line) = match op {
                Op::Same => (' ', a[ai]),
                Op::Del => ('-', a[ai]),
                Op::Add => ('+', b[bj]),
            };
            out.push(mark);
            out.push_str(line);
            if !line.ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
        k = end;
    }
    out
}

fn range(start: usize, len: usize) -> String {
    match len {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        _ => format!("{},{len}", start + 1),
    }
}

fn script(a: &[&str], b: &[&str]) -> Vec<Op> {
    if a.len() > MAX_LINES || b.len() > MAX_LINES {
        let mut ops = vec![Op::Del; a.len()];
        ops.extend(std::iter::repeat_n(Op::Add, b.len()));
        return ops;
    }
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..]
    let w = b.len() + 1;
    let mut lcs = vec![0u32; (a.len() + 1) * w];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i * w + j] = if a[i] == b[j] {
                lcs[(i + 1) * w + j + 1] + 1
            } else {
                lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push(Op::Same);
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
            // deletions first, as diff(1) shows a changed line
            ops.push(Op::Del);
            i += 1;
        } else {
            ops.push(Op::Add);
            j += 1;
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_line_shows_with_its_context() {
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let new = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
        let d = unified(old, new, "f");
        assert_eq!(
            d,
            "--- a/f\n+++ b/f\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
        );
        assert_eq!(unified(old, old, "f"), "");
    }

    #[test]
    fn far_apart_changes_make_two_hunks() {
        let old: String = (0..30).map(|i| format!("{i}\n")).collect();
        let new = old.replace("\n2\n", "\ntwo\n").replace("\n25\n", "\nx\n");
        let d = unified(&old, &new, "f");
        assert_eq!(d.matches("@@ -").count(), 2, "{d}");
    }
}
