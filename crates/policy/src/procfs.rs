//! The one reader of `/proc/<pid>/stat` fields for the crates above the
//! sandbox (the sandbox crate, which depends on nothing of mcpbox, reads
//! its own thread count the same way in `sys.rs`).

/// Field `n` of a `/proc/<pid>/stat` line, numbered as proc(5) numbers
/// them (1: pid, 2: the command name, 3: state, 4: ppid, 5: pgrp, ...).
/// The command name may hold spaces and parentheses, so the fields after
/// it are read from its last `)`. `None` for the name itself (ask for it
/// elsewhere), a field that is missing or a malformed line.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    if n < 3 {
        return if n == 1 {
            stat.split_whitespace().next()
        } else {
            None
        };
    }
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n - 3)
}

#[cfg(test)]
mod tests {
    use super::stat_field;

    #[test]
    fn fields_after_a_name_with_spaces_and_parentheses_are_found() {
        let line = "4242 (evil) 1 2 (x) S 17 4242 4242 0 -1";
        assert_eq!(stat_field(line, 1), Some("4242"));
        assert_eq!(stat_field(line, 2), None);
        assert_eq!(stat_field(line, 3), Some("S"));
        assert_eq!(stat_field(line, 4), Some("17"));
        assert_eq!(stat_field(line, 5), Some("4242"));
        assert_eq!(stat_field(line, 40), None);
        assert_eq!(stat_field("no parenthesis", 4), None);
    }
}
