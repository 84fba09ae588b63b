//! Sandbox identity: one sandbox per (agent, server) or, for servers with
//! `placement = "shared"`, per (agent, group); a task name splits either
//! into one sandbox per task.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The HTTP header a client of `serve` names its task with, on the
/// `initialize` request (or `params._meta["io.mcpbox/task"]`).
pub const TASK_HEADER: &str = "mcpbox-task";
/// The `_meta` key of `initialize` that names the task.
pub const TASK_META: &str = "io.mcpbox/task";
/// The longest task name.
pub const TASK_MAX: usize = 64;

/// Who a sandbox belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Key {
    pub agent: String,
    /// A server's name, or a shared group's.
    pub server: String,
    pub task: Option<String>,
}

impl Key {
    /// The sandbox id: `sb-` and 16 hex digits of a digest of the three
    /// parts and `salt`, the state directory's own random value. Fixed
    /// length, safe in paths and cgroup names whatever the task says, the
    /// same across restarts of `serve` on one state directory, and
    /// different for two gateways on one machine (whose cgroups share one
    /// namespace) even when their agents and servers have the same names.
    pub fn id(&self, salt: &str) -> String {
        let mut h = Sha256::new();
        h.update(salt.as_bytes());
        h.update([0]);
        h.update(self.agent.as_bytes());
        h.update([0]);
        h.update(self.server.as_bytes());
        h.update([0]);
        if let Some(t) = &self.task {
            h.update([1]);
            h.update(t.as_bytes());
        }
        let d = h.finalize();
        let mut s = String::from("sb-");
        s.push_str(&mcpbox_policy::hex::encode(&d[..8]));
        s
    }
}

/// Checks a task name a client sent: 1 to [`TASK_MAX`] characters of
/// `[A-Za-z0-9._-]`, not starting with a dot.
pub fn check_task(task: &str) -> Result<(), String> {
    if task.is_empty() || task.len() > TASK_MAX {
        return Err(format!("a task name has 1 to {TASK_MAX} characters"));
    }
    if task.starts_with('.') {
        return Err("a task name does not start with a dot".into());
    }
    if let Some(c) = task
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "a task name is letters, digits, '.', '_' and '-'; {c:?} is not allowed"
        ));
    }
    Ok(())
}

/// Whether `id` has the shape [`Key::id`] gives (checked before an id from
/// the control socket becomes part of a path).
pub fn is_id(id: &str) -> bool {
    id.len() == 19
        && id.starts_with("sb-")
        && id[3..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(agent: &str, server: &str, task: Option<&str>) -> Key {
        Key {
            agent: agent.into(),
            server: server.into(),
            task: task.map(String::from),
        }
    }

    #[test]
    fn ids_differ_by_every_part_and_are_stable() {
        let a = key("alice", "fs", None);
        assert_eq!(a.id("s"), key("alice", "fs", None).id("s"));
        assert!(is_id(&a.id("s")));
        assert_ne!(a.id("s"), key("bob", "fs", None).id("s"));
        assert_ne!(a.id("s"), key("alice", "git", None).id("s"));
        assert_ne!(a.id("s"), key("alice", "fs", Some("t1")).id("s"));
        // the separator keeps "a"+"bc" apart from "ab"+"c"
        assert_ne!(key("a", "bc", None).id("s"), key("ab", "c", None).id("s"));
        // another state directory, another id
        assert_ne!(a.id("s"), a.id("t"));
        // an empty task is not no task
        assert_ne!(key("a", "b", Some("")).id("s"), key("a", "b", None).id("s"));
    }

    #[test]
    fn task_names_that_would_escape_a_path_are_refused() {
        for bad in ["", "../x", "a/b", ".hidden", "a b", "é", &"x".repeat(65)] {
            assert!(check_task(bad).is_err(), "{bad:?}");
        }
        for good in ["t1", "issue-42", "build_7.3", &"x".repeat(64)] {
            assert!(check_task(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn ids_from_outside_are_checked_for_shape() {
        assert!(!is_id("sb-../../etc"));
        assert!(!is_id("sb-0123456789ABCDEF"));
        assert!(!is_id("xx-0123456789abcdef"));
        assert!(is_id("sb-0123456789abcdef"));
    }
}
