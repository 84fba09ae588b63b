//! Command lines classified in a child process (`mcpbox __classify`).
//!
//! `[commands]` parses the command lines the agent sends with a real shell
//! parser (brush-parser), whose input is hostile. Fuzzing it
//! (fuzz/fuzz_targets/command_line.rs) found a panic on an integer parse,
//! an allocation without end and exponential backtracking; each is checked
//! for before the parser runs, but a parser of that size will have more.
//! With `panic = "abort"`, and the relay of every session of a `serve` in
//! one process, any of them in-process would end every session. So a line
//! that is not plain words is parsed in a child process of its own, limited
//! to [`CPU_SECONDS`] of CPU and [`MEMORY`] of address space (setrlimit(2),
//! set by the child on itself before it reads its input) and [`WALL`] of
//! wall time (the parent kills it then). Whatever goes wrong there makes
//! the line `unparsed`, which is never allowed silently.
//!
//! The child is this binary (`/proc/self/exe`), started as a host command
//! (`mcpbox_gateway::host_command`: `std::process::Command`, which uses
//! posix_spawn(3) here, with no `pre_exec` and no working directory, so
//! a multi-threaded mcpbox never forks; its own process group; the
//! minimal environment).

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use mcpbox_policy::{Classifier, Input, Parsed};

/// The argument mcpbox runs itself with to classify one input.
pub const ARG: &str = "__classify";
/// CPU the child may use (RLIMIT_CPU: SIGXCPU, then SIGKILL).
const CPU_SECONDS: u64 = 2;
/// Address space the child may map (RLIMIT_AS).
const MEMORY: u64 = 512 << 20;
/// How long the parent waits for the answer.
const WALL: Duration = Duration::from_secs(3);
/// The most the parent reads of the answer.
const MAX_ANSWER: usize = 1 << 20;

/// Classifies in a child process, but plain words (the common case,
/// `ls -la src`) in this one: they hold nothing the parser could stumble on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Child;

impl Classifier for Child {
    fn classify(&self, input: &Input) -> Parsed {
        if is_plain(input) {
            return mcpbox_policy::classify(input);
        }
        match in_child(Path::new("/proc/self/exe"), input) {
            Ok(p) => p,
            Err(why) => Parsed::Unparsed(why),
        }
    }
}

/// Words of letters, digits and `-_./=:,@%+`, spaces between them, and no
/// run of ten digits: no quote, expansion, substitution, redirection,
/// glob, brace, tilde or operator.
fn is_plain(input: &Input) -> bool {
    let plain = |s: &str| {
        let chars_ok = s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == ' ' || "-_./=:,@%+".contains(c));
        let mut run = 0;
        let digits_ok = s.chars().all(|c| {
            run = if c.is_ascii_digit() { run + 1 } else { 0 };
            run < 10
        });
        chars_ok && digits_ok && s.len() <= 4096
    };
    match input {
        Input::Line(l) => plain(l),
        Input::Argv(a) => a.len() <= 256 && a.iter().all(|s| plain(s)),
    }
}

/// Classifies `input` in `program ARG` (this binary; another in tests),
/// run as a host command (host_command.rs: the minimal environment, its
/// own process group, killed whole at [`WALL`]).
fn in_child(program: &Path, input: &Input) -> Result<Parsed, String> {
    use mcpbox_gateway::host_command::{Ended, HostCommand};
    let request = serde_json::to_vec(input).map_err(|e| format!("checker: {e}"))?;
    let argv = [program.to_string_lossy().into_owned(), ARG.to_string()];
    let Some(cmd) = HostCommand::new(&argv, WALL) else {
        return Err("the command checker has no program".into());
    };
    // mcpbox's own child, which starts nothing: no supervisor
    let out = cmd
        .unsupervised()
        .stdin(request)
        .capture(MAX_ANSWER)
        .run()
        .map_err(|e| format!("the command checker did not start: {e}"))?;
    if let Ended::TimedOut(_) = out.ended {
        return Err("the command line took too long to check".into());
    }
    if out.stdout_over {
        return Err("the command checker answered too much".into());
    }
    serde_json::from_slice(&out.stdout).map_err(|_| {
        format!(
            "the command checker failed on this command line ({})",
            out.ended.describe()
        )
    })
}

/// The child: limits itself, reads one request, writes one answer.
pub fn child_main() -> u8 {
    use rustix::process::{setrlimit, Resource, Rlimit};
    for (res, v) in [(Resource::Cpu, CPU_SECONDS), (Resource::As, MEMORY)] {
        let limit = Rlimit {
            current: Some(v),
            maximum: Some(v),
        };
        if setrlimit(res, limit).is_err() {
            return 2;
        }
    }
    let mut request = Vec::new();
    if std::io::stdin()
        .take(mcpbox_policy::MAX_COMMAND_INPUT as u64 * 8)
        .read_to_end(&mut request)
        .is_err()
    {
        return 2;
    }
    let Ok(input) = serde_json::from_slice::<Input>(&request) else {
        return 2;
    };
    let parsed = mcpbox_policy::classify(&input);
    match serde_json::to_vec(&parsed) {
        Ok(out) => {
            if std::io::stdout().write_all(&out).is_err() {
                return 2;
            }
            0
        }
        Err(_) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checker that dies, answers garbage or floods never decides a
    /// line: each is an error (the line is then unparsed).
    #[test]
    fn a_checker_that_fails_or_floods_leaves_the_line_unchecked() {
        let input = Input::Line("echo $(id)".into());
        // it may be gone before the request is written (a broken pipe)
        let died = in_child(Path::new("/bin/false"), &input).unwrap_err();
        assert!(died.contains("command checker"), "{died}");
        let flood = in_child(Path::new("/usr/bin/yes"), &input).unwrap_err();
        assert!(flood.contains("answered too much"), "{flood}");
        let missing = in_child(Path::new("/nonexistent/checker"), &input).unwrap_err();
        assert!(missing.contains("did not start"), "{missing}");
    }

    #[test]
    fn plain_words_are_plain_and_anything_shell_is_not() {
        assert!(is_plain(&Input::Line("ls -la src/main.rs".into())));
        assert!(is_plain(&Input::Argv(vec!["git".into(), "status".into()])));
        for l in [
            "ls | wc",
            "echo $(id)",
            "a > b",
            "echo ~",
            "echo {1..3}",
            "a; b",
            "'q'",
            "echo 12345678901",
        ] {
            assert!(!is_plain(&Input::Line(l.into())), "{l}");
        }
    }
}
