//! `mcpbox exec`'s command line read without clap, for its common shapes.
//!
//! clap builds the whole command tree (every subcommand and argument of
//! mcpbox) before it reads a word, about 0.15 ms of a 5 ms sandbox start
//! (`bench/run`'s start-up row, measured against bwrap). `exec` is the one
//! command whose start-up is a product figure, so its usual shapes are read
//! here:
//!
//! ```text
//! mcpbox exec [-p FILE | --policy FILE | --policy=FILE] [--] CMD [ARGS...]
//! ```
//!
//! Anything else (help, another flag, a missing value, a value that starts
//! with `-`) returns `None` and goes to clap, which then parses or explains
//! the error as always. Where this reads a line, clap reads it the same way:
//! the unit tests check every shape against clap itself.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// What `mcpbox exec` was given: the policy file and the command.
#[derive(Debug, PartialEq, Eq)]
pub struct ExecArgs {
    pub policy: Option<PathBuf>,
    pub command: Vec<OsString>,
}

/// `args` is the whole argv, program name first.
pub fn parse(args: &[OsString]) -> Option<ExecArgs> {
    let mut rest = args.get(1..)?;
    if rest.first().map(OsString::as_os_str) != Some(OsStr::new("exec")) {
        return None;
    }
    rest = &rest[1..];
    let mut policy = None;
    let first = rest.first()?.as_encoded_bytes();
    if first == b"-p" || first == b"--policy" {
        let value = rest.get(1)?;
        // An empty value, or one clap could take for a flag: clap decides.
        if value.is_empty() || value.as_encoded_bytes().starts_with(b"-") {
            return None;
        }
        policy = Some(PathBuf::from(value));
        rest = &rest[2..];
    } else if let Some(value) = first.strip_prefix(b"--policy=") {
        if value.is_empty() {
            return None;
        }
        policy = Some(PathBuf::from(rest[0].to_str()?.strip_prefix("--policy=")?));
        rest = &rest[1..];
    }
    match rest.first()?.as_encoded_bytes() {
        b"--" => rest = &rest[1..],
        // The command starts here; a dash means a flag, which clap reads.
        word if word.starts_with(b"-") => return None,
        _ => {}
    }
    if rest.is_empty() {
        return None;
    }
    Some(ExecArgs {
        policy,
        command: rest.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn argv(words: &[&str]) -> Vec<OsString> {
        std::iter::once("mcpbox")
            .chain(words.iter().copied())
            .map(OsString::from)
            .collect()
    }

    /// What clap makes of the same line, as an `ExecArgs`, if it is `exec`.
    fn by_clap(args: &[OsString]) -> Option<ExecArgs> {
        match crate::Cli::try_parse_from(args).ok()?.command {
            crate::Command::Exec { policy, command } => Some(ExecArgs { policy, command }),
            _ => None,
        }
    }

    #[test]
    fn every_shape_read_here_is_read_the_same_by_clap() {
        let taken: &[&[&str]] = &[
            &["exec", "--", "/bin/true"],
            &["exec", "/bin/true"],
            &["exec", "true", "--policy", "x", "-la"],
            &["exec", "--", "sh", "-c", "exit 7"],
            &["exec", "--", "--policy", "p.toml"],
            &["exec", "--", "--"],
            &["exec", "-p", "p.toml", "--", "ls", "-la"],
            &["exec", "--policy", "p.toml", "ls", "-la"],
            &["exec", "--policy=p.toml", "--", "ls"],
            &["exec", "--policy=a=b.toml", "ls"],
            &["exec", "-p", "exec", "--", "exec"],
        ];
        for words in taken {
            let args = argv(words);
            let ours = parse(&args);
            assert!(ours.is_some(), "{words:?} should be read here");
            assert_eq!(ours, by_clap(&args), "{words:?}");
        }
    }

    #[test]
    fn other_shapes_are_left_to_clap() {
        let left: &[&[&str]] = &[
            &[],
            &["exec"],
            &["exec", "--"],
            &["exec", "--help"],
            &["exec", "-h"],
            &["exec", "-p"],
            &["exec", "-p", "--", "true"],
            &["exec", "--policy", ""],
            &["exec", "--policy=", "true"],
            &["exec", "-p", "p.toml"],
            &["exec", "-p", "p.toml", "--"],
            &["exec", "-pp.toml", "true"],
            &["exec", "--unknown", "true"],
            &["exec", "-p", "a", "-p", "b", "true"],
            &["run", "--", "true"],
            &["--version"],
        ];
        for words in left {
            assert_eq!(parse(&argv(words)), None, "{words:?}");
        }
    }
}
