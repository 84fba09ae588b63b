//! How `exec` and `run` fail: the step that failed and the exit code it
//! maps to, the same for both (main.rs prints it and exits with it).
//!
//! Exit codes, as documented in `mcpbox exec --help` and env(1)/timeout(1):
//! 125 mcpbox itself failed (the step is named), 126 the command cannot be
//! run, 127 it is not found, 124 the policy's timeout, 128+N signal N; any
//! other is the command's own.

use std::fmt;

/// An error of `exec` or `run` as the user sees it.
#[derive(Debug)]
pub struct Failure {
    /// The step that failed ("policy", "egress", or a sandbox step).
    pub step: String,
    /// The exit code it maps to.
    pub code: i32,
    error: anyhow::Error,
    /// Whether the message needs the step in front (a sandbox error names
    /// its step itself).
    prefix: bool,
}

impl Failure {
    /// A failure of mcpbox's own (125) at `step`.
    pub fn at(step: &str, error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            step: step.to_string(),
            code: 125,
            error: error.into(),
            prefix: true,
        }
    }

    /// A failure of `run`: a sandbox error anywhere in its chain (the
    /// relay's launch error wraps the launcher's io::Error, which wraps
    /// it) keeps its step and exit code; anything else is 125.
    pub fn from_run(error: anyhow::Error) -> Failure {
        let found = sandbox_error(&error).map(|e| (e.step(), e.exit_code()));
        match found {
            Some((step, code)) => Failure {
                step,
                code,
                error,
                prefix: false,
            },
            None => Failure::at("run", error),
        }
    }
}

/// The sandbox error in `error`'s chain, if there is one. io::Error hides
/// its payload from `source()`, so each io::Error is opened too.
fn sandbox_error(error: &anyhow::Error) -> Option<&mcpbox_sandbox::Error> {
    error.chain().find_map(|cause| {
        cause.downcast_ref::<mcpbox_sandbox::Error>().or_else(|| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<mcpbox_sandbox::Error>())
        })
    })
}

impl From<mcpbox_sandbox::Error> for Failure {
    fn from(e: mcpbox_sandbox::Error) -> Failure {
        Failure {
            step: e.step(),
            code: e.exit_code(),
            error: e.into(),
            prefix: false,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix {
            write!(f, "{}: {}", self.step, chain_text(&self.error))
        } else {
            f.write_str(&chain_text(&self.error))
        }
    }
}

/// The error and its causes, `outer: inner: ...`, each cause once: many
/// errors (thiserror's with a `{source}` in their message, rusqlite's)
/// already say their cause, which anyhow's `{:#}` would print again.
fn chain_text(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_error_inside_the_relays_io_error_keeps_its_exit_code() {
        let inner = mcpbox_sandbox::Error::Exec {
            command: "nope".into(),
            detail: "command not found in the sandbox".into(),
            code: 127,
        };
        let io = std::io::Error::other(inner);
        let err = anyhow::Error::new(io).context("relay");
        let f = Failure::from_run(err);
        assert_eq!((f.step.as_str(), f.code), ("execve", 127));
        assert!(f.to_string().contains("command not found"), "{f}");
    }

    #[test]
    fn a_cause_that_its_error_already_says_is_printed_once() {
        #[derive(Debug)]
        struct Says(std::io::Error);
        impl fmt::Display for Says {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "cannot start mcp server p: {}", self.0)
            }
        }
        impl std::error::Error for Says {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let err = anyhow::Error::new(Says(std::io::Error::other("no such file"))).context("relay");
        let f = Failure::at("run", err);
        assert_eq!(
            f.to_string(),
            "run: relay: cannot start mcp server p: no such file"
        );
    }

    #[test]
    fn other_failures_are_mcpboxs_own_and_name_their_step() {
        let f = Failure::at("egress", anyhow::anyhow!("no socket"));
        assert_eq!(f.code, 125);
        assert_eq!(f.to_string(), "egress: no socket");
    }
}
