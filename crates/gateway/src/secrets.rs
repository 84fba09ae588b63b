//! Secrets injected into the server's environment, and where they come
//! from. Values never appear in errors, logs or audit records: only names.

use std::path::PathBuf;
use std::time::Duration;

use crate::host_command::HostCommand;

/// Errors while resolving a secret. They name the secret, never its value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The source gave an empty value: nothing to inject, nothing to redact,
    /// most likely a mistake (an exported but unset variable).
    #[error("secret {name}: its source gave an empty value")]
    Empty {
        /// Secret name.
        name: String,
    },
    /// The named environment variable of the gateway is not set or not UTF-8.
    #[error("secret {name}: environment variable {var} is not set")]
    EnvMissing {
        /// Secret name.
        name: String,
        /// Variable that was read.
        var: String,
    },
    /// The file could not be read.
    #[error("secret {name}: cannot read {path}: {source}")]
    File {
        /// Secret name.
        name: String,
        /// File that was read.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The command could not be started.
    #[error("secret {name}: cannot run {program}: {source}")]
    CommandStart {
        /// Secret name.
        name: String,
        /// Program that was started.
        program: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The command failed: how it ended (an exit code, a signal, its
    /// timeout), never what it printed.
    #[error("secret {name}: command {program} failed: {status}")]
    CommandFailed {
        /// Secret name.
        name: String,
        /// Program that was started.
        program: String,
        /// Its exit status.
        status: String,
    },
    /// The command line was empty.
    #[error("secret {name}: empty command")]
    EmptyCommand {
        /// Secret name.
        name: String,
    },
    /// The value is not UTF-8 (environment values must be).
    #[error("secret {name}: value is not valid utf-8")]
    NotUtf8 {
        /// Secret name.
        name: String,
    },
}

/// Where a secret's value comes from: the policy's own type. Chosen by the
/// policy file, never by the agent or an MCP message. A file loses one
/// trailing newline; a command runs without a shell (argv) and its stdout,
/// one trailing newline trimmed, is the value.
pub use mcpbox_policy::SecretSource;

/// How long a `from_command` may run (a password manager may wait for
/// its user to unlock it); then its process group is killed.
pub const FROM_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// The most a `from_command` may print.
pub const MAX_COMMAND_OUTPUT: usize = 1 << 20;

fn cmd_program(argv: &[String]) -> String {
    argv.first().cloned().unwrap_or_default()
}

/// Resolves a secret. `name` is only used in error messages. A command
/// runs as a [`HostCommand`]: `PATH`, `HOME` and `LANG` only, in its own
/// process group, at most [`FROM_COMMAND_TIMEOUT`].
pub fn load_secret(name: &str, source: &SecretSource) -> Result<String, SecretError> {
    let value = match source {
        SecretSource::Env(var) => std::env::var(var).map_err(|_| SecretError::EnvMissing {
            name: name.to_string(),
            var: var.clone(),
        })?,
        SecretSource::File(path) => {
            let bytes = std::fs::read(path).map_err(|source| SecretError::File {
                name: name.to_string(),
                path: path.clone(),
                source,
            })?;
            String::from_utf8(bytes).map_err(|_| SecretError::NotUtf8 {
                name: name.to_string(),
            })?
        }
        SecretSource::Command(argv) => {
            let Some(cmd) = HostCommand::new(argv, FROM_COMMAND_TIMEOUT) else {
                return Err(SecretError::EmptyCommand {
                    name: name.to_string(),
                });
            };
            // the host command's minimal environment, its own process
            // group, killed at the timeout (host_command.rs)
            let out = cmd.capture(MAX_COMMAND_OUTPUT).run().map_err(|source| {
                SecretError::CommandStart {
                    name: name.to_string(),
                    program: cmd_program(argv),
                    source,
                }
            })?;
            if !out.ended.success() {
                return Err(SecretError::CommandFailed {
                    name: name.to_string(),
                    program: cmd_program(argv),
                    status: out.ended.describe(),
                });
            }
            if out.stdout_over {
                return Err(SecretError::CommandFailed {
                    name: name.to_string(),
                    program: cmd_program(argv),
                    status: format!("its output is over {MAX_COMMAND_OUTPUT} bytes"),
                });
            }
            String::from_utf8(out.stdout).map_err(|_| SecretError::NotUtf8 {
                name: name.to_string(),
            })?
        }
    };
    let value = trim_one_newline(value);
    if value.is_empty() {
        return Err(SecretError::Empty {
            name: name.to_string(),
        });
    }
    Ok(value)
}

fn trim_one_newline(mut s: String) -> String {
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    s
}

/// One resolved secret.
#[derive(Clone)]
pub struct Secret {
    /// Environment variable name inside the server, also the redaction label.
    pub name: String,
    /// The value.
    pub value: String,
    /// Restart the server with a fresh value after this long.
    pub ttl: Option<Duration>,
    /// Where to load a fresh value from when the TTL expires.
    pub source: Option<SecretSource>,
    /// What the server gets instead of the value, when the value stays
    /// outside the sandbox (the policy names the secret's `hosts`; the
    /// egress proxy puts the value in requests to them).
    pub placeholder: Option<String>,
}

impl Secret {
    /// What the server's environment gets: the placeholder when the value
    /// stays outside, else the value.
    pub fn inside(&self) -> &str {
        self.placeholder.as_deref().unwrap_or(&self.value)
    }

    /// Every string redacted under this secret's name: the value, and the
    /// placeholder when there is one (a placeholder is a capability too:
    /// through this sandbox's proxy it stands for the value).
    pub fn redacted(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((self.name.as_str(), self.value.as_str()))
            .chain(self.placeholder.as_deref().map(|p| (self.name.as_str(), p)))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"[REDACTED]")
            .field("ttl", &self.ttl)
            .field("source", &self.source)
            .field(
                "placeholder",
                &self.placeholder.as_ref().map(|_| "[REDACTED]"),
            )
            .finish()
    }
}

/// The secrets of one server.
#[derive(Debug, Clone, Default)]
pub struct Secrets(pub Vec<Secret>);

/// Values shorter than this draw a warning at load: they are redacted, but
/// short values also match unrelated text.
pub const SHORT_SECRET_WARN: usize = 8;

impl Secrets {
    /// Secrets with no TTL from `(name, value)` pairs.
    pub fn from_pairs<N: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (N, V)>,
    ) -> Secrets {
        Secrets(
            pairs
                .into_iter()
                .map(|(n, v)| Secret {
                    name: n.into(),
                    value: v.into(),
                    ttl: None,
                    source: None,
                    placeholder: None,
                })
                .collect(),
        )
    }

    /// Environment pairs for the launcher: each secret's [`Secret::inside`].
    pub fn env(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .map(|s| (s.name.clone(), s.inside().to_string()))
            .collect()
    }

    /// The shortest TTL of a secret whose value is in the server (a fresh
    /// value means a restart); one kept outside rotates in the egress
    /// proxy alone, the server keeping its placeholder.
    pub fn min_ttl(&self) -> Option<Duration> {
        self.0
            .iter()
            .filter(|s| s.placeholder.is_none())
            .filter_map(|s| s.ttl)
            .min()
    }

    /// Loads fresh values for every secret that has a source and whose
    /// value is in the server. Failed loads keep the old value and are
    /// returned as errors.
    pub fn refresh(&mut self) -> Vec<SecretError> {
        let mut errors = Vec::new();
        for s in &mut self.0 {
            if s.placeholder.is_some() {
                continue;
            }
            if let Some(source) = &s.source {
                match load_secret(&s.name, source) {
                    Ok(v) => s.value = v,
                    Err(e) => errors.push(e),
                }
            }
        }
        errors
    }

    /// Warns (through `tracing`) about values too short to redact safely.
    pub fn warn_short(&self) {
        for s in &self.0 {
            if s.value.len() < SHORT_SECRET_WARN {
                tracing::warn!(secret = %s.name, "secret value is shorter than {SHORT_SECRET_WARN} bytes: redaction may hit unrelated text");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_source_runs_without_shell_and_trims_one_newline() {
        let v = load_secret(
            "T",
            &SecretSource::Command(vec!["printf".into(), "a b\n\n".into()]),
        )
        .unwrap();
        assert_eq!(v, "a b\n");
        let v = load_secret(
            "T",
            &SecretSource::Command(vec!["echo".into(), "$HOME".into()]),
        )
        .unwrap();
        assert_eq!(v, "$HOME");
    }

    #[test]
    fn errors_name_the_secret_not_the_value() {
        let e = load_secret(
            "MY_TOKEN",
            &SecretSource::Env("MCPBOX_TEST_SURELY_UNSET_VAR".into()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("MY_TOKEN"));
        let e = load_secret("MY_TOKEN", &SecretSource::Command(vec!["false".into()])).unwrap_err();
        assert!(e.to_string().starts_with("secret MY_TOKEN"));
    }

    #[test]
    fn debug_hides_value() {
        let s = Secrets::from_pairs([("A", "topsecretvalue")]);
        assert!(!format!("{s:?}").contains("topsecretvalue"));
    }

    /// A secret kept outside the sandbox: the server gets its placeholder,
    /// both are redacted, and its ttl rotates the proxy's copy alone (no
    /// restart of the server: min_ttl and refresh leave it out).
    #[test]
    fn a_secret_kept_outside_gives_the_server_its_placeholder_and_never_restarts_it() {
        let mut s = Secrets(vec![
            Secret {
                name: "OUT".into(),
                value: "real-value".into(),
                ttl: Some(Duration::from_secs(1)),
                source: Some(SecretSource::Env("MCPBOX_TEST_SURELY_UNSET_VAR".into())),
                placeholder: Some("fake-value".into()),
            },
            Secret {
                name: "IN".into(),
                value: "inside-value".into(),
                ttl: Some(Duration::from_secs(60)),
                source: None,
                placeholder: None,
            },
        ]);
        assert_eq!(
            s.env(),
            vec![
                ("OUT".to_string(), "fake-value".to_string()),
                ("IN".to_string(), "inside-value".to_string())
            ]
        );
        assert_eq!(s.min_ttl(), Some(Duration::from_secs(60)));
        // its source is unset: a refresh that tried it would fail
        assert!(s.refresh().is_empty());
        let redacted: Vec<_> = s.0[0].redacted().collect();
        assert_eq!(redacted, vec![("OUT", "real-value"), ("OUT", "fake-value")]);
        assert!(!format!("{s:?}").contains("fake-value"));
    }
}
