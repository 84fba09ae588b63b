//! What an interpreter on the command line runs: the script path of
//! `node FILE`, `python FILE`, `deno run FILE`, `bun FILE`, `uv run FILE`,
//! the module of `python -m MODULE`, and the project of `uv run
//! --directory DIR`. The interpreter itself is found like any command;
//! what it runs is an argument, and without it the script's tree would
//! be missing in the sandbox (`Cannot find module ...`).
//!
//! Read from the words alone, as the interpreter reads its own options:
//! an option that takes a value takes the next word (unless written
//! `--opt=value`), `--` ends the options, and the first other word is
//! what runs. An inline program (`-e`, `-c`, `-p`, `-`) runs no file.

use std::ffi::OsString;
use std::path::Path;

/// One argument that is part of the runtime, not of the server's job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// `argv[i]` is the script file the interpreter runs.
    File(usize),
    /// `argv[i]` is the module `python -m` runs (found on `sys.path`).
    Module(usize),
    /// `argv[i]` is a project directory (`uv run --directory DIR`).
    Project(usize),
}

impl Ran {
    /// The index in argv of the word.
    pub fn index(&self) -> usize {
        match self {
            Ran::File(i) | Ran::Module(i) | Ran::Project(i) => *i,
        }
    }
}

/// Node's options that take the next word as their value.
const NODE_VALUE: &[&str] = &[
    "-r",
    "--require",
    "--import",
    "--loader",
    "--experimental-loader",
    "-C",
    "--conditions",
    "--env-file",
    "--title",
    "--input-type",
    "--stack-size",
];
/// Node's options whose program is inline: no file runs.
const NODE_INLINE: &[&str] = &["-e", "--eval", "-p", "--print", "-", "-i", "--interactive"];
/// Python's options that take the next word (`-X dev`, `-W error`).
const PYTHON_VALUE: &[&str] = &["-X", "-W", "--check-hash-based-pycs"];
/// Deno's and bun's options that take the next word.
const DENO_VALUE: &[&str] = &[
    "-c",
    "--config",
    "--import-map",
    "--lock",
    "--cert",
    "--location",
    "--seed",
    "-L",
    "--log-level",
    "--env-file",
];
const BUN_VALUE: &[&str] = &["-r", "--preload", "--cwd", "-c", "--config", "--env-file"];
/// `uv run`'s options that take the next word.
const UV_VALUE: &[&str] = &[
    "--directory",
    "--project",
    "--with",
    "--with-editable",
    "--with-requirements",
    "-p",
    "--python",
    "--env-file",
    "--index",
    "--index-url",
    "--default-index",
    "--extra-index-url",
    "--group",
    "--extra",
    "--package",
    "--cache-dir",
    "--config-file",
];

/// The interpreter a program name is, by its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Node,
    Python,
    Deno,
    Bun,
    Uv,
}

fn kind(program: &OsString) -> Option<Kind> {
    let name = Path::new(program).file_name()?.to_str()?;
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit() || c == '.');
    match name {
        "node" | "nodejs" => Some(Kind::Node),
        n if n.strip_prefix("node").is_some_and(digits) => Some(Kind::Node),
        "deno" => Some(Kind::Deno),
        "bun" => Some(Kind::Bun),
        "uv" => Some(Kind::Uv),
        n if ["python", "pypy"]
            .iter()
            .any(|p| n.strip_prefix(p).is_some_and(digits)) =>
        {
            Some(Kind::Python)
        }
        _ => None,
    }
}

/// The first word from `start` that is not an option: options of
/// `with_value` take the next word, `inline` ones mean no file runs.
fn first_operand(
    argv: &[OsString],
    start: usize,
    with_value: &[&str],
    inline: &[&str],
) -> Option<usize> {
    let mut i = start;
    while let Some(a) = argv.get(i) {
        let s = a.to_str()?;
        if s == "--" {
            return (i + 1 < argv.len()).then_some(i + 1);
        }
        if inline.contains(&s) || inline.iter().any(|o| s.starts_with(&format!("{o}="))) {
            return None;
        }
        if !s.starts_with('-') || s == "-" {
            return (s != "-").then_some(i);
        }
        i += if with_value.contains(&s) { 2 } else { 1 };
    }
    None
}

/// What `argv`'s interpreter runs, if argv[0] is one (`node`, `python3`,
/// `deno`, `bun`, `uv`, under any directory).
pub fn ran(argv: &[OsString]) -> Vec<Ran> {
    let Some(first) = argv.first() else {
        return Vec::new();
    };
    match kind(first) {
        Some(k) => ran_by(k, argv, 1),
        None => Vec::new(),
    }
}

fn ran_by(k: Kind, argv: &[OsString], start: usize) -> Vec<Ran> {
    let word = |i: usize| argv.get(i).and_then(|a| a.to_str());
    match k {
        Kind::Node => first_operand(argv, start, NODE_VALUE, NODE_INLINE)
            .map(Ran::File)
            .into_iter()
            .collect(),
        Kind::Python => {
            // `-m MOD` (also `-mMOD`, `-um MOD`): a module; `-c`: inline
            let mut i = start;
            while let Some(s) = word(i) {
                if s == "--" {
                    return (i + 1 < argv.len())
                        .then_some(Ran::File(i + 1))
                        .into_iter()
                        .collect();
                }
                if !s.starts_with('-') {
                    return vec![Ran::File(i)];
                }
                if s == "-" {
                    // the program comes on stdin
                    return Vec::new();
                }
                if PYTHON_VALUE.contains(&s) {
                    i += 2;
                    continue;
                }
                if s.starts_with("--") {
                    i += 1;
                    continue;
                }
                // a cluster of one-letter flags: `c` or `m` ends it
                let letters = &s[1..];
                if let Some(at) = letters.find(['c', 'm']) {
                    if letters.as_bytes()[at] == b'c' {
                        return Vec::new();
                    }
                    return if at + 1 < letters.len() {
                        // `-mMOD`: the module is in this word
                        vec![Ran::Module(i)]
                    } else {
                        word(i + 1)
                            .map(|_| Ran::Module(i + 1))
                            .into_iter()
                            .collect()
                    };
                }
                i += 1;
            }
            Vec::new()
        }
        Kind::Deno => {
            // `deno run [opts] FILE`, or `deno FILE`
            let mut at = start;
            if matches!(word(at), Some("run" | "serve")) {
                at += 1;
            } else if word(at).is_some_and(|w| !w.starts_with('-') && !w.contains(['.', '/'])) {
                // another subcommand (`deno task`, `deno fmt`): no file
                return Vec::new();
            }
            first_operand(argv, at, DENO_VALUE, &["-e", "--eval"])
                .filter(|i| !word(*i).is_some_and(is_url))
                .map(Ran::File)
                .into_iter()
                .collect()
        }
        Kind::Bun => {
            let mut at = start;
            if word(at) == Some("run") {
                at += 1;
            }
            first_operand(argv, at, BUN_VALUE, &["-e", "--eval", "-p", "--print"])
                .filter(|i| word(*i).is_some_and(|w| w.contains(['.', '/'])))
                .map(Ran::File)
                .into_iter()
                .collect()
        }
        Kind::Uv => {
            if word(start) != Some("run") {
                return Vec::new();
            }
            let mut out = Vec::new();
            let mut i = start + 1;
            while let Some(s) = word(i) {
                if s == "--" {
                    i += 1;
                    break;
                }
                if !s.starts_with('-') {
                    break;
                }
                if matches!(s, "--directory" | "--project") && word(i + 1).is_some() {
                    out.push(Ran::Project(i + 1));
                }
                i += if UV_VALUE.contains(&s) { 2 } else { 1 };
            }
            let Some(target) = argv.get(i) else {
                return out;
            };
            // `uv run python server.py`: what that python runs
            match kind(target) {
                Some(Kind::Uv) | None => {
                    if target.to_str().is_some_and(|t| t.contains(['.', '/'])) {
                        out.push(Ran::File(i));
                    }
                }
                Some(k) => out.extend(ran_by(k, argv, i + 1)),
            }
            out
        }
    }
}

fn is_url(w: &str) -> bool {
    ["http://", "https://", "npm:", "jsr:", "data:"]
        .iter()
        .any(|p| w.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(words: &[&str]) -> Vec<Ran> {
        let argv: Vec<OsString> = words.iter().map(OsString::from).collect();
        ran(&argv)
    }

    #[test]
    fn the_script_of_each_interpreter_is_found_past_its_options() {
        assert_eq!(of(&["node", "/p/server.js", "/data"]), vec![Ran::File(1)]);
        assert_eq!(
            of(&[
                "/usr/bin/node",
                "-r",
                "dotenv/config",
                "--no-warnings",
                "s.js"
            ]),
            vec![Ran::File(4)]
        );
        assert_eq!(of(&["node22", "--import=tsx", "s.ts"]), vec![Ran::File(2)]);
        assert_eq!(of(&["node", "-e", "x"]), vec![]);
        assert_eq!(of(&["python3", "-u", "/p/s.py"]), vec![Ran::File(2)]);
        assert_eq!(of(&["python", "-X", "dev", "s.py"]), vec![Ran::File(3)]);
        assert_eq!(
            of(&["python3.11", "-m", "pkg.server"]),
            vec![Ran::Module(2)]
        );
        assert_eq!(of(&["python", "-um", "pkg"]), vec![Ran::Module(2)]);
        assert_eq!(of(&["python", "-mpkg"]), vec![Ran::Module(1)]);
        assert_eq!(of(&["python", "-c", "print()"]), vec![]);
        assert_eq!(
            of(&["deno", "run", "--allow-read", "/p/m.ts"]),
            vec![Ran::File(3)]
        );
        assert_eq!(of(&["deno", "run", "https://x.test/m.ts"]), vec![]);
        assert_eq!(of(&["deno", "task", "start"]), vec![]);
        assert_eq!(of(&["bun", "run", "/p/index.ts"]), vec![Ran::File(2)]);
        assert_eq!(of(&["bun", "run", "start"]), vec![]);
        assert_eq!(
            of(&["uv", "run", "--directory", "/p", "python", "-m", "srv"]),
            vec![Ran::Project(3), Ran::Module(6)]
        );
        assert_eq!(of(&["uv", "run", "/p/s.py"]), vec![Ran::File(2)]);
        assert_eq!(of(&["uv", "tool", "run", "x"]), vec![]);
        assert_eq!(of(&["mcp-server-time"]), vec![]);
        assert_eq!(of(&["pythonista", "x.py"]), vec![]);
    }
}
