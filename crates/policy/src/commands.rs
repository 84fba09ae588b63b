//! `[commands]`: what the commands in a shell-like tool argument do, by category,
//! and the verdict each category (or program) gets.
//!
//! A tool argument declared in `commands.tools` holds a shell command line; one in
//! `commands.argv_tools` holds an argument vector. The line is parsed with a real
//! POSIX/bash parser (`brush-parser`) and the whole syntax tree is walked: every
//! pipeline, list, subshell, group, loop and branch body, every command and process
//! substitution inside a word, `sh -c STRING` (parsed again), and the wrappers that
//! run another program (`env`, `nohup`, `sudo`, `xargs`, ...). Each command found is
//! [`Classified`] by its program's basename (and, for `git`, `cargo`, `npm` and the
//! like, its subcommand) into zero or more [`Category`]s.
//!
//! Anything that cannot be classified honestly is [`Parsed::Unparsed`]: a syntax
//! error, a program name computed at run time (`$CMD x`, `$(which rm)`), `eval`,
//! `source`, a function or alias definition, nesting deeper than [`MAX_DEPTH`].
//! An unparsed line gets `commands.unparsed`, which may not be "allow".
//!
//! Categories are coordination, not the boundary: a program can always do more
//! than its name says (`python3 -c` can open sockets, `awk` can call `system()`,
//! a `Makefile` can run anything). The sandbox is the boundary; `[network]`
//! decides every connection whatever the command's category.

// Without the shell parser the helpers of the syntax-tree walk go unused.
#![cfg_attr(not(feature = "shell-parser"), allow(dead_code))]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

#[cfg(feature = "shell-parser")]
use brush_parser::ast;
#[cfg(feature = "shell-parser")]
use brush_parser::word::{WordPiece, WordPieceWithSource};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::Deserializer;
use serde::{Deserialize, Serialize, Serializer};

use crate::decision::{Decision, Reason, Source, Verdict};
use crate::HINT_MARK;

/// What a command does, as far as its program and arguments say.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Reads and reports: `ls`, `cat`, `grep`, `git status`.
    Inspect,
    /// Builds, tests or runs code: `make`, `cargo test`, `python3 x.py`.
    Build,
    /// Installs or removes packages: `pip install`, `npm ci`, `apt-get install`.
    Install,
    /// Talks to the network: `curl`, `ssh`, `git fetch`, `> /dev/tcp/...`.
    Network,
    /// Changes a version-control repository: `git commit`, `git push`.
    VcsWrite,
    /// Deletes files: `rm`, `find -delete`, `git clean`.
    Delete,
    /// Changes privileges, owners, modes or namespaces: `sudo`, `chmod`, `mount`.
    Privilege,
    /// Keeps running after the call returns: `cmd &`, `nohup`, `setsid`.
    Background,
    /// Listens for connections: `nc -l`, `python3 -m http.server`.
    Listener,
}

impl Category {
    /// Every category, in order.
    pub const ALL: [Category; 9] = [
        Category::Inspect,
        Category::Build,
        Category::Install,
        Category::Network,
        Category::VcsWrite,
        Category::Delete,
        Category::Privilege,
        Category::Background,
        Category::Listener,
    ];

    /// The name used in policy files and audit records.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Inspect => "inspect",
            Category::Build => "build",
            Category::Install => "install",
            Category::Network => "network",
            Category::VcsWrite => "vcs_write",
            Category::Delete => "delete",
            Category::Privilege => "privilege",
            Category::Background => "background",
            Category::Listener => "listener",
        }
    }

    /// The category named `s`.
    pub fn from_name(s: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The verdict a category gets when the policy does not say: privilege is
    /// denied (the sandbox has nothing to gain from it), a listener asks a human
    /// (it waits for connections the sandbox's network may not even carry), the
    /// rest is allowed (the sandbox is the boundary).
    pub fn default_verdict(self) -> Verdict {
        match self {
            Category::Privilege => Verdict::Deny,
            Category::Listener => Verdict::Approve,
            _ => Verdict::Allow,
        }
    }
}

impl<'de> Deserialize<'de> for Category {
    /// A category name; an unknown one is refused with the list of valid ones.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Category::from_name(&s).ok_or_else(|| {
            let valid: Vec<&str> = Category::ALL.iter().map(|c| c.as_str()).collect();
            serde::de::Error::custom(format!(
                "unknown category \"{}\"{HINT_MARK}valid categories: {}",
                s.escape_debug(),
                valid.join(", ")
            ))
        })
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One command found in a line or an argument vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classified {
    /// The basename of the program as written (`/usr/bin/rm` is `rm`).
    pub program: String,
    /// Its categories, sorted, without duplicates; empty when the program is in none.
    pub categories: Vec<Category>,
}

/// What classification found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Parsed {
    /// Every command of the input, in order (may be empty: a comment, `X=1`).
    Commands(Vec<Classified>),
    /// The input cannot be classified; why, short, echoing at most 80 characters of it.
    Unparsed(String),
}

/// How deep `sh -c`, `$(...)` and `find -exec` may nest inside each other.
pub const MAX_DEPTH: usize = 8;
/// Longest input classified: 64 KiB. Longer is unparsed.
pub const MAX_INPUT: usize = 64 << 10;
/// Most opening constructs (`(`, `{`, `` ` ``, `if`, `while`, ...) in one input.
/// The parser recurses on nesting (a few hundred levels overflow a 2 MiB
/// thread stack) and backtracks on unbalanced nesting in time exponential
/// in its depth (found by the `command_line` fuzz target: 40 unclosed `(`
/// took minutes; 24 took 0.7 s, 13 `case` 19 ms, in a release build).
/// Nesting cannot exceed the number of openers, so this bounds both, at a
/// few milliseconds; a real command line rarely has more than six.
const MAX_OPENERS: usize = 12;
/// Longest piece of input echoed in an unparsed reason.
const ECHO: usize = 80;

/// Classifies a shell command line.
pub fn classify_line(line: &str) -> Parsed {
    if line.trim().is_empty() {
        return Parsed::Unparsed("empty command line".into());
    }
    let mut out = Vec::new();
    match line_into(line, &Ctx::top(), &mut out) {
        Ok(()) => Parsed::Commands(out),
        Err(why) => Parsed::Unparsed(why),
    }
}

/// Classifies an argument vector run without a shell (`sh -c STRING` in it is
/// parsed as a line).
pub fn classify_argv(argv: &[String]) -> Parsed {
    if argv.is_empty() {
        return Parsed::Unparsed("empty argument vector".into());
    }
    if argv.iter().map(String::len).sum::<usize>() > MAX_INPUT {
        return Parsed::Unparsed("argument vector longer than 64KiB".into());
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Parsed::Unparsed("argument contains a NUL byte".into());
    }
    let args: Vec<Arg> = argv.iter().map(|a| Arg::Lit(a.clone())).collect();
    let mut out = Vec::new();
    match argv_into(&args, &Ctx::top(), &[], &mut out) {
        Ok(()) => Parsed::Commands(out),
        Err(why) => Parsed::Unparsed(why),
    }
}

// ---- the walk over the syntax tree

/// Why a walk stopped: the unparsed reason.
type Step = Result<(), String>;

/// Where the walk is: how deep in re-parsed strings, and the categories that
/// everything here inherits (`&`, `nohup`, `sudo`).
#[derive(Debug, Clone)]
struct Ctx {
    depth: usize,
    inherit: Vec<Category>,
}

impl Ctx {
    fn top() -> Ctx {
        Ctx {
            depth: 0,
            inherit: Vec::new(),
        }
    }

    fn with(&self, c: Category) -> Ctx {
        let mut next = self.clone();
        if !next.inherit.contains(&c) {
            next.inherit.push(c);
        }
        next
    }

    /// One level deeper (a re-parsed string, a substitution, `find -exec`).
    fn deeper(&self) -> Result<Ctx, String> {
        if self.depth >= MAX_DEPTH {
            return Err(format!("commands nested deeper than {MAX_DEPTH} levels"));
        }
        let mut next = self.clone();
        next.depth += 1;
        Ok(next)
    }
}

/// At most [`ECHO`] characters of `s`, for an unparsed reason.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(ECHO).collect();
    if out.len() < s.len() {
        out.push_str("...");
    }
    out.escape_debug().to_string()
}

/// Appends a classified command with the inherited categories.
fn emit(
    out: &mut Vec<Classified>,
    program: &str,
    cats: &[Category],
    ctx: &Ctx,
    extra: &[Category],
) {
    let mut categories: Vec<Category> = cats
        .iter()
        .chain(&ctx.inherit)
        .chain(extra)
        .copied()
        .collect();
    categories.sort();
    categories.dedup();
    out.push(Classified {
        program: program.to_string(),
        categories,
    });
}

#[cfg(feature = "shell-parser")]
/// Parser options: bash syntax (a superset of POSIX sh for what matters here).
fn parser_options() -> brush_parser::ParserOptions {
    brush_parser::ParserOptions::default()
}

/// brush-parser 0.4 unwraps its integer parses: a file descriptor before
/// `<` or `>` (`99999999999>f`, an `i32`), a brace sequence's bound
/// (`{1..99999999999999999999}`, an `i64`) or a tilde's directory-stack
/// index (`~99999999999999999999`, a `usize`) that overflows panics, and
/// with `panic = "abort"` a panic would end every session of the process
/// (found by the `command_line` fuzz target). Such input is unparsed
/// instead, before the parser sees it: any run of 19 or more digits, and a
/// run of 10 or more right before a `<` or `>`.
fn numbers_the_parser_cannot_hold(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let run = i - start;
        let redirect = matches!(b.get(i), Some(b'<') | Some(b'>'));
        if run >= 19 || (run >= 10 && redirect) {
            return Some(format!(
                "a number of {run} digits{} (too large to check)",
                if redirect {
                    " before a redirection"
                } else {
                    ""
                }
            ));
        }
    }
    None
}

/// brush-parser 0.4's tokenizer loops, allocating without end, on some
/// here-documents inside a command substitution (`$( << # id)`: 66 bytes
/// took more than 2 GiB, found by the `command_line` fuzz target). A line
/// where a `<<` comes after the start of a substitution (`$(`, a backtick,
/// `<(`, `>(`), and so may be inside it, is unparsed before the parser
/// sees it; a here-document whose body holds a substitution (`cat <<EOF`,
/// then `$(date)`) is parsed as usual.
fn heredoc_in_a_substitution(line: &str) -> Option<String> {
    let last_heredoc = line.rfind("<<")?;
    let first_substitution = ["$(", "`", "<(", ">("]
        .iter()
        .filter_map(|o| line.find(o))
        .min()?;
    (first_substitution < last_heredoc).then(|| {
        "a here-document that may be inside a command substitution (not checked)".to_string()
    })
}

/// Counts the constructs that make the parser recurse (see [`MAX_OPENERS`]).
/// Quotes are ignored on purpose: overcounting only makes a line unparsed.
/// A `${` counts when it is inside another one: `${HOME}` is parsed without
/// recursion, but nested expansions (`${a:-${b:-${c}}}`) backtrack (found
/// by the `command_line` fuzz target: 103 bytes took 1.5 s); so does a `[`
/// inside one (a subscript, parsed as arithmetic: `${a[[[[+@}`).
fn openers(line: &str) -> usize {
    let mut n = 0;
    let mut prev = ' ';
    let mut expansions = 0usize;
    for c in line.chars() {
        if c == '{' && prev == '$' {
            if expansions > 0 {
                n += 1;
            }
            expansions += 1;
        } else if c == '}' && expansions > 0 {
            expansions -= 1;
        } else if c == '(' || c == '`' || c == '{' || (c == '[' && expansions > 0) {
            // `[` inside `${...}` opens a subscript, parsed as arithmetic
            n += 1;
        }
        prev = c;
    }
    n + line
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| {
            matches!(
                *w,
                "if" | "while" | "until" | "for" | "case" | "select" | "coproc" | "function"
            )
        })
        .count()
}

/// Without the `shell-parser` feature (a library's own build and tests;
/// the binary has it) no line is parsed: each is unparsed, which no rule
/// allows silently.
#[cfg(not(feature = "shell-parser"))]
fn line_into(_line: &str, _ctx: &Ctx, _out: &mut Vec<Classified>) -> Step {
    Err("no shell parser in this build (mcpbox-policy's shell-parser feature)".into())
}

#[cfg(feature = "shell-parser")]
/// Parses `line` and classifies every command in it.
fn line_into(line: &str, ctx: &Ctx, out: &mut Vec<Classified>) -> Step {
    if line.len() > MAX_INPUT {
        return Err("command line longer than 64KiB".into());
    }
    if line.contains('\0') {
        return Err("command line contains a NUL byte".into());
    }
    if let Some(why) = numbers_the_parser_cannot_hold(line) {
        return Err(why);
    }
    if let Some(why) = heredoc_in_a_substitution(line) {
        return Err(why);
    }
    if openers(line) > MAX_OPENERS {
        return Err(format!(
            "more than {MAX_OPENERS} nested constructs (parentheses, braces, if, while, ...)"
        ));
    }
    let opts = parser_options();
    let mut parser = brush_parser::Parser::new(line.as_bytes(), &opts);
    let program = parser
        .parse_program()
        .map_err(|e| format!("shell syntax: {}", clip(&e.to_string())))?;
    for list in &program.complete_commands {
        list_into(list, ctx, out)?;
    }
    Ok(())
}

#[cfg(feature = "shell-parser")]
fn list_into(list: &ast::CompoundList, ctx: &Ctx, out: &mut Vec<Classified>) -> Step {
    for ast::CompoundListItem(and_or, sep) in &list.0 {
        // `a && b &` puts the whole and-or list in the background
        let here = match sep {
            ast::SeparatorOperator::Async => ctx.with(Category::Background),
            ast::SeparatorOperator::Sequence => ctx.clone(),
        };
        pipeline_into(&and_or.first, &here, out)?;
        for next in &and_or.additional {
            match next {
                ast::AndOr::And(p) | ast::AndOr::Or(p) => pipeline_into(p, &here, out)?,
            }
        }
    }
    Ok(())
}

#[cfg(feature = "shell-parser")]
fn pipeline_into(p: &ast::Pipeline, ctx: &Ctx, out: &mut Vec<Classified>) -> Step {
    for cmd in &p.seq {
        command_into(cmd, ctx, out)?;
    }
    Ok(())
}

#[cfg(feature = "shell-parser")]
fn command_into(cmd: &ast::Command, ctx: &Ctx, out: &mut Vec<Classified>) -> Step {
    match cmd {
        ast::Command::Simple(sc) => simple_into(sc, ctx, out),
        ast::Command::Compound(cc, redirects) => {
            redirects_into(redirects.as_ref(), ctx, out)?;
            compound_into(cc, ctx, out)
        }
        // a function makes a name mean other commands, later: `ls() { rm -rf /; }`
        ast::Command::Function(_) => Err("a function definition cannot be classified".into()),
        ast::Command::ExtendedTest(test, redirects) => {
            redirects_into(redirects.as_ref(), ctx, out)?;
            test_into(&test.expr, ctx, out)
        }
    }
}

#[cfg(feature = "shell-parser")]
/// The redirections of a compound command or `[[ ]]`: a network redirection shows
/// as a command of its own, `(redirect)`.
fn redirects_into(
    redirects: Option<&ast::RedirectList>,
    ctx: &Ctx,
    out: &mut Vec<Classified>,
) -> Step {
    let mut extra = Vec::new();
    for io in redirects.map(|r| r.0.as_slice()).unwrap_or_default() {
        redirect_into(io, ctx, &mut extra, out)?;
    }
    if !extra.is_empty() {
        emit(out, REDIRECT, &[], ctx, &extra);
    }
    Ok(())
}

/// The program name shown for a redirection without a command (`> /dev/tcp/h/80`).
const REDIRECT: &str = "(redirect)";

#[cfg(feature = "shell-parser")]
fn test_into(e: &ast::ExtendedTestExpr, ctx: &Ctx, out: &mut Vec<Classified>) -> Step {
    match e {
        ast::ExtendedTestExpr::And(a, b) | ast::ExtendedTestExpr::Or(a, b) => {
            test_into(a, ctx, out)?;
            test_into(b, ctx, out)
        }
        ast::ExtendedTestExpr::Not(a) | ast::ExtendedTestExpr::Parenthesized(a) => {
            test_into(a, ctx, out)
        }
        ast::ExtendedTestExpr::UnaryTest(_, w) => word_scan(&w.value, ctx, out),
        ast::ExtendedTestExpr::BinaryTest(_, a, b) => {
            word_scan(&a.value, ctx, out)?;
            word_scan(&b.value, ctx, out)
        }
    }
}

#[cfg(feature = "shell-parser")]
fn compound_into(cc: &ast::CompoundCommand, ctx: &Ctx, out: &mut Vec<Classified>) -> Step {
    use ast::CompoundCommand as C;
    match cc {
        C::Arithmetic(a) => arith_check(&a.expr.value),
        C::ArithmeticForClause(f) => {
            for e in [&f.initializer, &f.condition, &f.updater]
                .into_iter()
                .flatten()
            {
                arith_check(&e.value)?;
            }
            list_into(&f.body.list, ctx, out)
        }
        C::BraceGroup(b) => list_into(&b.list, ctx, out),
        C::Subshell(s) => list_into(&s.list, ctx, out),
        C::ForClause(f) => {
            for w in f.values.iter().flatten() {
                word_scan(&w.value, ctx, out)?;
            }
            list_into(&f.body.list, ctx, out)
        }
        C::CaseClause(c) => {
            word_scan(&c.value.value, ctx, out)?;
            for item in &c.cases {
                for p in &item.patterns {
                    word_scan(&p.value, ctx, out)?;
                }
                if let Some(body) = &item.cmd {
                    list_into(body, ctx, out)?;
                }
            }
            Ok(())
        }
        C::IfClause(i) => {
            list_into(&i.condition, ctx, out)?;
            list_into(&i.then, ctx, out)?;
            for e in i.elses.iter().flatten() {
                if let Some(cond) = &e.condition {
                    list_into(cond, ctx, out)?;
                }
                list_into(&e.body, ctx, out)?;
            }
            Ok(())
        }
        C::WhileClause(w) | C::UntilClause(w) => {
            list_into(&w.0, ctx, out)?;
            list_into(&w.1.list, ctx, out)
        }
        // a coprocess runs alongside the shell, like `&`
        C::Coprocess(c) => command_into(&c.body, &ctx.with(Category::Background), out),
    }
}

/// Arithmetic is evaluated, and `$((...))` may hold a command substitution.
fn arith_check(expr: &str) -> Step {
    if expr.contains("$(") || expr.contains('`') {
        return Err("a command substitution inside arithmetic cannot be classified".into());
    }
    Ok(())
}

#[cfg(feature = "shell-parser")]
fn simple_into(sc: &ast::SimpleCommand, ctx: &Ctx, out: &mut Vec<Classified>) -> Step {
    let mut extra = Vec::new();
    let mut argv = Vec::new();
    // `X=1 cmd`: assignments only set the environment; their values are scanned
    for item in sc.prefix.iter().flat_map(|p| &p.0) {
        item_into(item, ctx, &mut extra, None, out)?;
    }
    if let Some(w) = &sc.word_or_name {
        word_scan(&w.value, ctx, out)?;
        argv.push(literal(&w.value));
    }
    for item in sc.suffix.iter().flat_map(|s| &s.0) {
        item_into(item, ctx, &mut extra, Some(&mut argv), out)?;
    }
    if argv.is_empty() {
        // only assignments and redirections
        if !extra.is_empty() {
            emit(out, REDIRECT, &[], ctx, &extra);
        }
        return Ok(());
    }
    argv_into(&argv, ctx, &extra, out)
}

#[cfg(feature = "shell-parser")]
fn item_into(
    item: &ast::CommandPrefixOrSuffixItem,
    ctx: &Ctx,
    extra: &mut Vec<Category>,
    argv: Option<&mut Vec<Arg>>,
    out: &mut Vec<Classified>,
) -> Step {
    use ast::CommandPrefixOrSuffixItem as I;
    match item {
        I::IoRedirect(r) => redirect_into(r, ctx, extra, out),
        I::Word(w) | I::AssignmentWord(_, w) => {
            word_scan(&w.value, ctx, out)?;
            if let Some(argv) = argv {
                argv.push(literal(&w.value));
            }
            Ok(())
        }
        I::ProcessSubstitution(_, sub) => {
            list_into(&sub.list, ctx, out)?;
            if let Some(argv) = argv {
                // the command sees a path like /dev/fd/63
                argv.push(Arg::Computed);
            }
            Ok(())
        }
    }
}

#[cfg(feature = "shell-parser")]
fn redirect_into(
    io: &ast::IoRedirect,
    ctx: &Ctx,
    extra: &mut Vec<Category>,
    out: &mut Vec<Classified>,
) -> Step {
    use ast::IoFileRedirectTarget as T;
    match io {
        ast::IoRedirect::File(_, _, target) => match target {
            T::Filename(w) => {
                word_scan(&w.value, ctx, out)?;
                if is_network_path(&w.value) {
                    extra.push(Category::Network);
                }
                Ok(())
            }
            T::Fd(_) => Ok(()),
            T::ProcessSubstitution(_, sub) => list_into(&sub.list, ctx, out),
            T::Duplicate(w) => word_scan(&w.value, ctx, out),
        },
        ast::IoRedirect::HereDocument(_, doc) => {
            // an unquoted delimiter makes the body expand, `$(...)` included
            if doc.requires_expansion {
                let pieces = brush_parser::word::parse_heredoc(&doc.doc.value, &parser_options())
                    .map_err(|_| "a here-document could not be parsed".to_string())?;
                pieces_scan(&doc.doc.value, &pieces, ctx, out)?;
            }
            Ok(())
        }
        ast::IoRedirect::HereString(_, w) => word_scan(&w.value, ctx, out),
        ast::IoRedirect::OutputAndError(w, _) => {
            word_scan(&w.value, ctx, out)?;
            if is_network_path(&w.value) {
                extra.push(Category::Network);
            }
            Ok(())
        }
    }
}

#[cfg(feature = "shell-parser")]
/// bash opens a socket for a redirection to `/dev/tcp/HOST/PORT` or
/// `/dev/udp/HOST/PORT` (bash(1), REDIRECTION). A target whose literal start
/// could still become one (`/dev/$P/h/80`) counts too.
fn is_network_path(word: &str) -> bool {
    let (prefix, complete) = literal_prefix(word);
    let network = |p: &str| p.starts_with("/dev/tcp/") || p.starts_with("/dev/udp/");
    if network(&prefix) {
        return true;
    }
    !complete
        && prefix.starts_with("/dev/")
        && ("/dev/tcp/".starts_with(&prefix) || "/dev/udp/".starts_with(&prefix))
}

#[cfg(feature = "shell-parser")]
/// Classifies the command and process substitutions inside a word.
fn word_scan(word: &str, ctx: &Ctx, out: &mut Vec<Classified>) -> Step {
    // a plain word (the common case) holds nothing to run
    if !word.contains(['$', '`']) {
        return Ok(());
    }
    if let Some(why) = numbers_the_parser_cannot_hold(word) {
        return Err(why);
    }
    let pieces = brush_parser::word::parse(word, &parser_options())
        .map_err(|_| format!("a word could not be parsed: {}", clip(word)))?;
    pieces_scan(word, &pieces, ctx, out)
}

#[cfg(feature = "shell-parser")]
fn pieces_scan(
    source: &str,
    pieces: &[WordPieceWithSource],
    ctx: &Ctx,
    out: &mut Vec<Classified>,
) -> Step {
    for p in pieces {
        match &p.piece {
            WordPiece::CommandSubstitution(inner) => line_into(inner, &ctx.deeper()?, out)?,
            WordPiece::BackquotedCommandSubstitution(inner) => {
                line_into(&unescape_backquoted(inner), &ctx.deeper()?, out)?;
            }
            WordPiece::DoubleQuotedSequence(inner)
            | WordPiece::GettextDoubleQuotedSequence(inner) => {
                pieces_scan(source, inner, ctx, out)?;
            }
            WordPiece::ParameterExpansion(_) => {
                // `${X:-$(cmd)}` runs cmd; its text is kept unparsed inside the expression
                let text = source.get(p.start_index..p.end_index).unwrap_or(source);
                if ["$(", "`", "<(", ">("].iter().any(|s| text.contains(s)) {
                    return Err(
                        "a command substitution inside a parameter expansion cannot be classified"
                            .into(),
                    );
                }
            }
            WordPiece::ArithmeticExpression(e) => arith_check(&e.value)?,
            WordPiece::Text(_)
            | WordPiece::SingleQuotedText(_)
            | WordPiece::AnsiCQuotedText(_)
            | WordPiece::TildeExpansion(_)
            | WordPiece::EscapeSequence(_) => {}
        }
    }
    Ok(())
}

/// Inside backquotes, `\\`, `` \` `` and `\$` stand for the character (bash(1),
/// Command Substitution).
fn unescape_backquoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(&n) = chars.peek() {
                if matches!(n, '\\' | '`' | '$') {
                    out.push(n);
                    chars.next();
                    continue;
                }
            }
        }
        out.push(c);
    }
    out
}

/// One word of a command as the program will see it, when that is known.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Arg {
    /// Known text: quotes and escapes removed.
    Lit(String),
    /// Known only at run time: an expansion, a substitution, a glob, a brace expansion.
    Computed,
}

impl Arg {
    fn lit(&self) -> Option<&str> {
        match self {
            Arg::Lit(s) => Some(s),
            Arg::Computed => None,
        }
    }
}

#[cfg(feature = "shell-parser")]
/// The word as the program sees it, if it is known before running.
fn literal(word: &str) -> Arg {
    match literal_prefix(word) {
        (text, true) => Arg::Lit(text),
        (_, false) => Arg::Computed,
    }
}

#[cfg(feature = "shell-parser")]
/// The known text at the start of a word and whether that is the whole word.
fn literal_prefix(word: &str) -> (String, bool) {
    let Ok(pieces) = brush_parser::word::parse(word, &parser_options()) else {
        return (String::new(), false);
    };
    let mut out = String::new();
    let complete = pieces_literal(&pieces, false, &mut out);
    (out, complete)
}

#[cfg(feature = "shell-parser")]
/// Appends the known text of `pieces`; false at the first piece that is not known.
fn pieces_literal(pieces: &[WordPieceWithSource], quoted: bool, out: &mut String) -> bool {
    for p in pieces {
        match &p.piece {
            WordPiece::Text(t) => {
                if !quoted && has_pattern(t) {
                    // a glob or brace expansion: `r?`, `{rm,-rf,/}`
                    return false;
                }
                out.push_str(t);
            }
            WordPiece::SingleQuotedText(t) => out.push_str(t),
            // `$'...'` escapes are decoded by the shell; only plain text is known here
            WordPiece::AnsiCQuotedText(t) if !t.contains('\\') => out.push_str(t),
            WordPiece::EscapeSequence(e) => {
                let rest = e.strip_prefix('\\').unwrap_or(e);
                if quoted && !rest.starts_with(['$', '`', '"', '\\', '\n']) {
                    // inside double quotes other backslashes stay
                    out.push('\\');
                }
                if rest != "\n" {
                    out.push_str(rest);
                }
            }
            WordPiece::DoubleQuotedSequence(inner)
            | WordPiece::GettextDoubleQuotedSequence(inner) => {
                if !pieces_literal(inner, true, out) {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

/// Unquoted text the shell would expand: globs, extended globs, brace expansion.
fn has_pattern(t: &str) -> bool {
    let later = |open: char, close: char| {
        t.find(open)
            .is_some_and(|at| t.get(at + 1..).is_some_and(|rest| rest.contains(close)))
    };
    t.contains(['*', '?', '(']) || later('[', ']') || later('{', '}')
}

// ---- an argument vector: wrappers, then the program's own table

/// Builtins and programs that run code given as data, or make a name mean other
/// code later: what they run cannot be known from the line.
const UNCLASSIFIABLE: &[&str] = &[
    ".",         // source
    "alias",     // a name that runs other commands
    "bind",      // `bind -x` runs a command on a key
    "compgen",   // `compgen -C` runs a command
    "complete",  // `complete -C` runs a command
    "enable",    // `enable -f` loads a builtin from a shared object
    "eval",      // runs its arguments as a line
    "fc",        // re-runs history
    "hash",      // `hash -p /bin/rm ls` makes ls run rm
    "mapfile",   // `mapfile -C` runs a callback
    "readarray", // the same as mapfile
    "source",    // runs a file
    "trap",      // runs a string on a signal
];

/// A program that runs another program given in its arguments.
struct Wrapper {
    name: &'static str,
    /// Categories of the wrapper itself; when not empty it is shown as a command of
    /// its own (so a `[commands.programs]` entry for the wrapped program cannot drop
    /// them) and everything it runs inherits them.
    adds: &'static [Category],
    /// Options that take a value in the next argument (or attached: `-uroot`).
    value_opts: &'static [&'static str],
    /// Positional arguments before the program (`timeout DURATION`, `chroot DIR`).
    positionals: usize,
    /// `VAR=value` arguments before the program are settings (`env`, `sudo`).
    assignments: bool,
    /// Categories when there is no program to run (`env` alone prints the environment).
    alone: &'static [Category],
}

const P: &[Category] = &[Category::Privilege];
const BG: &[Category] = &[Category::Background];
const NONE: &[Category] = &[];
const I: &[Category] = &[Category::Inspect];

/// Wrappers, sorted by name. `su`, `runuser`, `capsh`, `command`, `busybox` and the
/// shells are handled in [`argv_into`] because their arguments say more.
#[rustfmt::skip]
const WRAPPERS: &[Wrapper] = &[
    Wrapper { name: "builtin", adds: NONE, value_opts: &[], positionals: 0, assignments: false, alone: NONE },
    Wrapper { name: "chroot", adds: P, value_opts: &["--groups", "--userspec"], positionals: 1, assignments: false, alone: P },
    Wrapper { name: "doas", adds: P, value_opts: &["-C", "-u"], positionals: 0, assignments: false, alone: P },
    Wrapper { name: "env", adds: NONE, value_opts: &["--chdir", "--unset", "-C", "-P", "-u"], positionals: 0, assignments: true, alone: I },
    Wrapper { name: "exec", adds: NONE, value_opts: &["-a"], positionals: 0, assignments: false, alone: NONE },
    Wrapper { name: "ionice", adds: NONE, value_opts: &["--class", "--classdata", "--pgid", "--pid", "--uid", "-P", "-c", "-n", "-p", "-u"], positionals: 0, assignments: false, alone: NONE },
    Wrapper { name: "nice", adds: NONE, value_opts: &["--adjustment", "-n"], positionals: 0, assignments: false, alone: I },
    Wrapper { name: "nohup", adds: BG, value_opts: &[], positionals: 0, assignments: false, alone: BG },
    Wrapper { name: "nsenter", adds: P, value_opts: &["--setgid", "--setuid", "--target", "-G", "-S", "-t"], positionals: 0, assignments: false, alone: P },
    Wrapper { name: "pkexec", adds: P, value_opts: &["--user"], positionals: 0, assignments: false, alone: P },
    Wrapper { name: "setpriv", adds: P, value_opts: &["--ambient-caps", "--apparmor-profile", "--bounding-set", "--egid", "--euid", "--groups", "--inh-caps", "--landlock-access", "--landlock-rule", "--pdeathsig", "--regid", "--reuid", "--rgid", "--ruid", "--securebits", "--selinux-label"], positionals: 0, assignments: false, alone: P },
    Wrapper { name: "setsid", adds: BG, value_opts: &[], positionals: 0, assignments: false, alone: BG },
    Wrapper { name: "stdbuf", adds: NONE, value_opts: &["--error", "--input", "--output", "-e", "-i", "-o"], positionals: 0, assignments: false, alone: NONE },
    Wrapper { name: "sudo", adds: P, value_opts: &["--chdir", "--chroot", "--close-from", "--command-timeout", "--group", "--host", "--other-user", "--prompt", "--role", "--type", "--user", "-C", "-D", "-R", "-T", "-U", "-g", "-h", "-p", "-r", "-t", "-u"], positionals: 0, assignments: true, alone: P },
    Wrapper { name: "time", adds: NONE, value_opts: &["--format", "--output", "-f", "-o"], positionals: 0, assignments: false, alone: NONE },
    Wrapper { name: "timeout", adds: NONE, value_opts: &["--kill-after", "--signal", "-k", "-s"], positionals: 1, assignments: false, alone: NONE },
    Wrapper { name: "unshare", adds: P, value_opts: &["--map-group", "--map-groups", "--map-user", "--map-users", "--propagation", "--root", "--setgid", "--setgroups", "--setuid", "--wd", "-G", "-R", "-S", "-w"], positionals: 0, assignments: false, alone: P },
    // xargs runs echo when given no program
    Wrapper { name: "xargs", adds: NONE, value_opts: &["--arg-file", "--delimiter", "--max-args", "--max-chars", "--max-procs", "--process-slot-var", "-E", "-I", "-L", "-P", "-a", "-d", "-n", "-s"], positionals: 0, assignments: false, alone: I },
];

/// Shells: `-c STRING` is a line to parse; otherwise they run a script (code).
const SHELLS: &[&str] = &["ash", "bash", "dash", "ksh", "mksh", "sh", "zsh"];

/// The basename of a program path: `/usr/bin/rm` is `rm`.
fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Where the options of a wrapper end.
enum OptEnd {
    /// The index of the first argument after the options.
    At(usize),
    /// An argument that could be an option or the program is computed.
    Computed,
}

/// Skips options (`-x`, `-x VALUE`, `-xVALUE`, `--long=V`, `--long V`, `--`), and
/// `VAR=value` when `assignments`; stops at the first other argument.
fn skip_options(args: &[Arg], value_opts: &[&str], assignments: bool) -> OptEnd {
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        let Some(a) = arg.lit() else {
            return OptEnd::Computed;
        };
        if a == "--" {
            return OptEnd::At(i + 1);
        }
        if assignments && is_assignment(a) {
            i += 1;
            continue;
        }
        if a.len() < 2 || !a.starts_with('-') {
            return OptEnd::At(i);
        }
        i += 1;
        if a.starts_with("--") {
            if !a.contains('=') && value_opts.contains(&a) {
                i += 1;
            }
            continue;
        }
        // a short cluster: the first option that takes a value takes the rest, or the next
        for (at, c) in a.char_indices().skip(1) {
            let mut buf = [0u8; 4];
            let opt = format!("-{}", c.encode_utf8(&mut buf));
            if value_opts.contains(&opt.as_str()) {
                if at + c.len_utf8() == a.len() {
                    i += 1;
                }
                break;
            }
        }
    }
    OptEnd::At(i)
}

/// `NAME=value` with a valid shell name.
fn is_assignment(a: &str) -> bool {
    match a.split_once('=') {
        Some((name, _)) => {
            let mut chars = name.chars();
            matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// A short-option cluster (`-lvp`) that holds `c`.
fn short_has(a: &str, c: char) -> bool {
    a.starts_with('-') && !a.starts_with("--") && a.len() > 1 && a.contains(c)
}

/// Classifies one command given as words, peeling wrappers one by one (a loop,
/// so `nice nice nice ...` cannot exhaust the stack).
fn argv_into(argv: &[Arg], ctx: &Ctx, extra: &[Category], out: &mut Vec<Classified>) -> Step {
    let mut argv = argv;
    let mut ctx = ctx.clone();
    loop {
        let Some(first) = argv.first() else {
            return Ok(());
        };
        let Some(name) = first.lit() else {
            return Err("the program name is computed (an expansion, a substitution or a glob): it cannot be classified".into());
        };
        let program = basename(name);
        if program.is_empty() {
            return Err("an empty program name".into());
        }
        let args = &argv[1..];
        if UNCLASSIFIABLE.contains(&program) {
            return Err(format!(
                "`{}` runs code that cannot be classified",
                clip(program)
            ));
        }
        if let Ok(at) = WRAPPERS.binary_search_by_key(&program, |w| w.name) {
            let w = &WRAPPERS[at];
            let start = match skip_options(args, w.value_opts, w.assignments) {
                OptEnd::At(i) => i + w.positionals,
                OptEnd::Computed => {
                    return Err(format!(
                    "an argument of `{program}` is computed: the program it runs cannot be known"
                ))
                }
            };
            // only the wrapper's own options: `env sort -S 1G` is sort's -S
            let options = args.get(..start).unwrap_or(args);
            if program == "env" && options.iter().any(|a| a.lit().is_some_and(env_splits)) {
                return Err(
                    "`env -S` splits a string into a command: it cannot be classified".into(),
                );
            }
            if !w.adds.is_empty() {
                emit(out, program, w.adds, &ctx, &[]);
                for c in w.adds {
                    ctx = ctx.with(*c);
                }
            }
            match args.get(start..) {
                Some(rest) if !rest.is_empty() => {
                    argv = rest;
                    continue;
                }
                _ => {
                    if w.adds.is_empty() {
                        emit(out, program, w.alone, &ctx, extra);
                    }
                    return Ok(());
                }
            }
        }
        match program {
            // `command -v x` looks a name up; `command x` runs x
            "command" => {
                let lookup = args
                    .iter()
                    .take_while(|a| a.lit().is_some_and(|s| s.starts_with('-')))
                    .any(|a| {
                        a.lit()
                            .is_some_and(|s| short_has(s, 'v') || short_has(s, 'V'))
                    });
                match skip_options(args, &[], false) {
                    _ if lookup => {
                        emit(out, program, I, &ctx, extra);
                        return Ok(());
                    }
                    OptEnd::At(i) if i < args.len() => {
                        argv = &args[i..];
                        continue;
                    }
                    OptEnd::At(_) => {
                        emit(out, program, NONE, &ctx, extra);
                        return Ok(());
                    }
                    OptEnd::Computed => return Err(
                        "an argument of `command` is computed: the program it runs cannot be known"
                            .into(),
                    ),
                }
            }
            // `busybox APPLET ARGS` is APPLET
            "busybox" => match args.first() {
                Some(Arg::Lit(a)) if !a.starts_with('-') => {
                    argv = args;
                    continue;
                }
                Some(Arg::Computed) => {
                    return Err("the busybox applet is computed: it cannot be classified".into())
                }
                _ => {
                    emit(out, program, NONE, &ctx, extra);
                    return Ok(());
                }
            },
            "su" | "runuser" => return su_into(program, args, &ctx, extra, out),
            // `capsh ... -- ARGS` runs bash with ARGS
            "capsh" => {
                emit(out, program, P, &ctx, &[]);
                let inner = ctx.with(Category::Privilege);
                return match args.iter().position(|a| a.lit() == Some("--")) {
                    Some(at) => shell_into("bash", &args[at + 1..], &inner, extra, out),
                    None => Ok(()),
                };
            }
            _ => {}
        }
        if SHELLS.contains(&program) {
            return shell_into(program, args, &ctx, extra, out);
        }
        let cats = program_categories(program, args, &ctx, out)?;
        emit(out, program, &cats, &ctx, extra);
        return Ok(());
    }
}

/// `env -S STRING` / `--split-string`: the string becomes a command.
fn env_splits(a: &str) -> bool {
    a.starts_with("--split-string") || a.starts_with("--sp") || short_has(a, 'S')
}

/// `sh [options] -c STRING [name [args]]` parses STRING; `sh script`, `sh` alone
/// (reading stdin: `curl x | sh`) runs code that is not in the line: Build.
fn shell_into(
    program: &str,
    args: &[Arg],
    ctx: &Ctx,
    extra: &[Category],
    out: &mut Vec<Classified>,
) -> Step {
    let mut has_c = false;
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        let Some(a) = arg.lit() else {
            return Err(format!(
                "an argument of `{program}` is computed: what it runs cannot be known"
            ));
        };
        if a == "--" || a == "-" {
            i += 1;
            break;
        }
        if !(a.starts_with('-') || a.starts_with('+')) || a.len() < 2 {
            break;
        }
        i += 1;
        if a.starts_with("--") {
            // bash's long options that take a file
            if matches!(a, "--rcfile" | "--init-file") {
                i += 1;
            }
            continue;
        }
        if a.starts_with('-') && a.contains('c') {
            has_c = true;
        }
        // `-o option` / `-O shopt` take the next argument
        if a.contains(['o', 'O']) {
            i += 1;
        }
    }
    if !has_c {
        emit(out, program, &[Category::Build], ctx, extra);
        return Ok(());
    }
    match args.get(i) {
        Some(Arg::Lit(script)) => {
            let inner = ctx.deeper()?;
            line_into(script, &inner, out)?;
            if !extra.is_empty() {
                emit(out, REDIRECT, &[], ctx, extra);
            }
            Ok(())
        }
        Some(Arg::Computed) => Err(format!(
            "the script of `{program} -c` is computed: it cannot be classified"
        )),
        None => Err(format!("`{program} -c` without a command string")),
    }
}

/// `su [options] [-c COMMAND] [user]`, `runuser -u USER [--] COMMAND` or
/// `runuser [options] -c COMMAND user`: Privilege, and the command if any.
fn su_into(
    program: &str,
    args: &[Arg],
    ctx: &Ctx,
    extra: &[Category],
    out: &mut Vec<Classified>,
) -> Step {
    emit(out, program, P, ctx, &[]);
    let inner = ctx.with(Category::Privilege);
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        let Some(a) = arg.lit() else {
            return Err(format!(
                "an argument of `{program}` is computed: what it runs cannot be known"
            ));
        };
        i += 1;
        let command = if a == "-c" || a == "--command" {
            i += 1;
            Some(args.get(i - 1))
        } else if let Some(v) = a.strip_prefix("--command=") {
            return line_into(v, &inner.deeper()?, out);
        } else {
            None
        };
        match command {
            Some(Some(Arg::Lit(line))) => return line_into(line, &inner.deeper()?, out),
            Some(Some(Arg::Computed)) => {
                return Err(format!(
                    "the command of `{program} -c` is computed: it cannot be classified"
                ))
            }
            Some(None) => return Err(format!("`{program} -c` without a command")),
            None => {}
        }
        // runuser -u USER [--] COMMAND
        if program == "runuser" && (a == "-u" || a == "--user") {
            let rest = args.get(i + 1..).unwrap_or_default();
            let rest = match rest.first().and_then(Arg::lit) {
                Some("--") => &rest[1..],
                _ => rest,
            };
            return argv_into(rest, &inner, extra, out);
        }
        if matches!(
            a,
            "-s" | "--shell"
                | "-g"
                | "--group"
                | "-G"
                | "--supp-group"
                | "-w"
                | "--whitelist-environment"
        ) {
            i += 1;
        }
    }
    Ok(())
}

/// The program's categories from the tables; `find -exec` classifies its command too.
fn program_categories(
    program: &str,
    args: &[Arg],
    ctx: &Ctx,
    out: &mut Vec<Classified>,
) -> Result<Vec<Category>, String> {
    use Category::*;
    let program = if is_versioned_python(program) {
        "python3"
    } else {
        program
    };
    match program {
        "find" => return find_categories(args, ctx, out),
        "git" => return git_categories(args),
        "python" | "python2" | "python3" | "pypy" | "pypy3" => return Ok(python_categories(args)),
        "sed" => {
            let in_place = args.iter().filter_map(Arg::lit).any(sed_in_place);
            // `sed -i` writes files: no category, so `commands.default` decides
            return Ok(if in_place { vec![] } else { vec![Inspect] });
        }
        "nc" | "ncat" | "netcat" => {
            let listen = args
                .iter()
                .filter_map(Arg::lit)
                .any(|a| short_has(a, 'l') || a == "--listen");
            return Ok(if listen {
                vec![Network, Listener]
            } else {
                vec![Network]
            });
        }
        "socat" => {
            let listen = args
                .iter()
                .filter_map(Arg::lit)
                .any(|a| a.to_ascii_uppercase().contains("LISTEN"));
            return Ok(if listen {
                vec![Network, Listener]
            } else {
                vec![Network]
            });
        }
        "php" => {
            let serve = args.iter().filter_map(Arg::lit).any(|a| a == "-S");
            return Ok(if serve { vec![Listener] } else { vec![Build] });
        }
        _ => {}
    }
    if let Some(cats) = subcommand_categories(program, args)? {
        return Ok(cats);
    }
    Ok(PROGRAMS
        .binary_search_by_key(&program, |(name, _)| name)
        .map(|at| PROGRAMS[at].1.to_vec())
        .unwrap_or_default())
}

/// `python3.12`, `python3.9`: a versioned interpreter.
fn is_versioned_python(p: &str) -> bool {
    p.strip_prefix("python").is_some_and(|v| {
        !v.is_empty() && v.contains('.') && v.chars().all(|c| c.is_ascii_digit() || c == '.')
    })
}

/// `sed -i`, `-i.bak`, `-ni`, `--in-place`: the cluster holds `i` before a
/// value-taking option (`-e`, `-f`, `-l`).
fn sed_in_place(a: &str) -> bool {
    if a.starts_with("--in-place") {
        return true;
    }
    if !a.starts_with('-') || a.starts_with("--") {
        return false;
    }
    for c in a.chars().skip(1) {
        match c {
            'i' => return true,
            'e' | 'f' | 'l' => return false,
            _ => {}
        }
    }
    false
}

/// `find`: Inspect, Delete with `-delete`; the command of each `-exec`, `-execdir`,
/// `-ok`, `-okdir` (up to `;` or `+`) is classified as a command of its own.
fn find_categories(
    args: &[Arg],
    ctx: &Ctx,
    out: &mut Vec<Classified>,
) -> Result<Vec<Category>, String> {
    let mut cats = vec![Category::Inspect];
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        i += 1;
        match arg.lit() {
            Some("-delete") => cats = vec![Category::Delete],
            Some("-exec" | "-execdir" | "-ok" | "-okdir") => {
                let rest = args.get(i..).unwrap_or_default();
                let end = rest
                    .iter()
                    .position(|a| matches!(a.lit(), Some(";" | "+")))
                    .unwrap_or(rest.len());
                argv_into(&rest[..end], &ctx.deeper()?, &[], out)?;
                i += end + 1;
            }
            _ => {}
        }
    }
    Ok(cats)
}

/// `git -c NAME=VALUE` settings that cannot make git run another program (aliases,
/// `core.sshCommand`, `core.pager`, `core.fsmonitor`, hooks can).
const GIT_SAFE_CONFIG: &[&str] = &[
    "advice.",
    "color.",
    "commit.gpgsign",
    "core.quotepath",
    "init.defaultbranch",
    "user.email",
    "user.name",
];

/// `git`: global options, then the subcommand; `branch` and a `-c` setting look
/// at their arguments.
fn git_categories(args: &[Arg]) -> Result<Vec<Category>, String> {
    use Category::*;
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        let Some(a) = arg.lit() else {
            return Err("a git option or subcommand is computed: it cannot be classified".into());
        };
        if !a.starts_with('-') {
            break;
        }
        i += 1;
        if a == "-c" {
            match args.get(i).and_then(Arg::lit) {
                Some(setting)
                    if GIT_SAFE_CONFIG
                        .iter()
                        .any(|s| setting.to_ascii_lowercase().starts_with(s)) => {}
                _ => {
                    return Err(
                        "`git -c` with this setting can make git run another program".into(),
                    )
                }
            }
            i += 1;
        } else if matches!(
            a,
            "-C" | "--git-dir" | "--work-tree" | "--namespace" | "--super-prefix" | "--exec-path"
        ) {
            i += 1;
        }
    }
    let Some(sub) = args.get(i).and_then(Arg::lit) else {
        // `git`, `git --version`: help and version
        return Ok(vec![Inspect]);
    };
    let rest = args.get(i + 1..).unwrap_or_default();
    if sub == "branch" {
        return Ok(git_branch(rest));
    }
    Ok(SUBCOMMANDS
        .binary_search_by_key(&("git", sub), |(p, s, _)| (p, s))
        .map(|at| SUBCOMMANDS[at].2.to_vec())
        .unwrap_or_default())
}

/// `git branch` lists (Inspect) unless it deletes, renames, copies, sets an
/// upstream or creates a branch (VcsWrite).
fn git_branch(args: &[Arg]) -> Vec<Category> {
    const WRITES: &[&str] = &[
        "-C",
        "-D",
        "-M",
        "-c",
        "-d",
        "-f",
        "-m",
        "-u",
        "--copy",
        "--delete",
        "--edit-description",
        "--force",
        "--move",
        "--set-upstream-to",
        "--unset-upstream",
    ];
    const LISTS: &[&str] = &[
        "-a",
        "-l",
        "-r",
        "--all",
        "--contains",
        "--list",
        "--merged",
        "--no-contains",
        "--no-merged",
        "--points-at",
        "--remotes",
        "--show-current",
    ];
    let lits: Vec<&str> = args.iter().filter_map(Arg::lit).collect();
    let writes = lits.iter().any(|a| {
        WRITES.contains(a)
            || a.starts_with("--set-upstream-to=")
            || (a.starts_with('-')
                && !a.starts_with("--")
                && a.contains(['d', 'D', 'm', 'M', 'c', 'C']))
    });
    let lists = lits
        .iter()
        .any(|a| LISTS.contains(a) || a.starts_with("--format") || a.starts_with("--sort"));
    let positional = args
        .iter()
        .any(|a| !a.lit().is_some_and(|s| s.starts_with('-')));
    if writes || (positional && !lists) {
        vec![Category::VcsWrite]
    } else {
        vec![Category::Inspect]
    }
}

/// `python [options] (-c CODE | -m MODULE | script | nothing)`.
fn python_categories(args: &[Arg]) -> Vec<Category> {
    use Category::*;
    let mut i = 0;
    while let Some(Arg::Lit(a)) = args.get(i) {
        if !a.starts_with('-') || a == "-" || a == "--" {
            break;
        }
        i += 1;
        // a cluster: `-c` and `-m` end the options, `-W` and `-X` take a value
        for (at, c) in a.char_indices().skip(1) {
            let attached = a.get(at + 1..).filter(|s| !s.is_empty());
            match c {
                'c' => return vec![Build],
                'm' => {
                    let module = match attached {
                        Some(m) => Some(m),
                        None => args.get(i).and_then(Arg::lit),
                    };
                    let rest_at = if attached.is_some() { i } else { i + 1 };
                    let rest = args.get(rest_at..).unwrap_or_default();
                    return match module {
                        Some("pip") => subcommand_categories("pip", rest)
                            .ok()
                            .flatten()
                            .unwrap_or_default(),
                        Some("ensurepip") => vec![Install],
                        Some("http.server") => vec![Listener],
                        // an unknown or computed module: code runs
                        _ => vec![Build],
                    };
                }
                'W' | 'X' => {
                    if attached.is_none() {
                        i += 1;
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    vec![Build]
}

/// Options of subcommand-driven programs that take a value before the subcommand.
const GLOBAL_VALUE_OPTS: &[(&str, &[&str])] = &[
    ("apt", &["-c", "-o", "-t"]),
    ("apt-get", &["-c", "-o", "-t"]),
    ("cargo", &["--color", "--config", "-C", "-Z"]),
    ("dnf", &["--setopt", "-c", "-d", "-e"]),
    ("npm", &["--prefix", "-C"]),
    ("pnpm", &["--dir", "--filter", "-C", "-F"]),
    (
        "uv",
        &[
            "--cache-dir",
            "--color",
            "--config-file",
            "--directory",
            "--project",
        ],
    ),
    ("yarn", &["--cwd"]),
    ("yum", &["--setopt", "-c", "-d", "-e"]),
];

/// The categories from [`SUBCOMMANDS`] for a program that has entries there:
/// `Ok(None)` when it has none; an unknown subcommand is in no category.
fn subcommand_categories(program: &str, args: &[Arg]) -> Result<Option<Vec<Category>>, String> {
    let first = SUBCOMMANDS.partition_point(|(p, _, _)| *p < program);
    let entries: &[(&str, &str, &[Category])] = match SUBCOMMANDS.get(first..) {
        Some(rest) => {
            let n = rest.iter().take_while(|(p, _, _)| *p == program).count();
            &rest[..n]
        }
        None => &[],
    };
    if entries.is_empty() {
        return Ok(None);
    }
    let value_opts = GLOBAL_VALUE_OPTS
        .iter()
        .find(|(p, _)| *p == program)
        .map(|(_, o)| *o)
        .unwrap_or_default();
    // `cargo +nightly build`: a toolchain before the subcommand
    let args = match args.first().and_then(Arg::lit) {
        Some(t) if program == "cargo" && t.starts_with('+') => &args[1..],
        _ => args,
    };
    let (sub, rest) = match skip_options(args, value_opts, false) {
        OptEnd::At(i) => (args.get(i), args.get(i + 1..).unwrap_or_default()),
        OptEnd::Computed => {
            return Err(format!(
                "an option of `{program}` is computed: its subcommand cannot be known"
            ))
        }
    };
    let sub = match sub {
        // `yarn` alone installs
        None => "",
        Some(Arg::Lit(s)) => s.as_str(),
        Some(Arg::Computed) => {
            return Err(format!(
                "the subcommand of `{program}` is computed: it cannot be classified"
            ))
        }
    };
    let find = |key: &str| {
        entries
            .iter()
            .find(|(_, s, _)| *s == key)
            .map(|(_, _, c)| c.to_vec())
    };
    // two levels (`uv pip install`) before one
    let nested = entries
        .iter()
        .any(|(_, s, _)| s.split_once(' ').is_some_and(|(a, _)| a == sub));
    if nested {
        match skip_options(rest, &[], false) {
            OptEnd::At(i) => {
                if let Some(Arg::Lit(second)) = rest.get(i) {
                    if let Some(c) = find(&format!("{sub} {second}")) {
                        return Ok(Some(c));
                    }
                } else if rest.get(i).is_some() {
                    return Err(format!(
                        "the subcommand of `{program} {}` is computed: it cannot be classified",
                        clip(sub)
                    ));
                }
            }
            OptEnd::Computed => {
                return Err(format!(
                    "the subcommand of `{program} {}` is computed: it cannot be classified",
                    clip(sub)
                ))
            }
        }
    }
    Ok(Some(find(sub).unwrap_or_default()))
}

const INSPECT: &[Category] = &[Category::Inspect];
const BUILD: &[Category] = &[Category::Build];
const INSTALL: &[Category] = &[Category::Install];
const NETWORK: &[Category] = &[Category::Network];
const VCS_WRITE: &[Category] = &[Category::VcsWrite];
const DELETE: &[Category] = &[Category::Delete];
const PRIVILEGE: &[Category] = &[Category::Privilege];
const LISTENER: &[Category] = &[Category::Listener];
const BUILD_INSTALL: &[Category] = &[Category::Build, Category::Install];
const PUSH: &[Category] = &[Category::Network, Category::VcsWrite];
const CLEAN: &[Category] = &[Category::VcsWrite, Category::Delete];

/// (program, subcommand, categories), sorted by program then subcommand. An empty
/// subcommand is the program alone; "a b" is two levels. A subcommand not listed
/// is in no category.
#[rustfmt::skip]
const SUBCOMMANDS: &[(&str, &str, &[Category])] = &[
    ("apk", "add", INSTALL),
    ("apk", "del", INSTALL),
    ("apk", "fix", INSTALL),
    ("apk", "info", INSPECT),
    ("apk", "search", INSPECT),
    ("apk", "update", INSTALL),
    ("apk", "upgrade", INSTALL),
    ("apt", "autoremove", INSTALL),
    ("apt", "dist-upgrade", INSTALL),
    ("apt", "full-upgrade", INSTALL),
    ("apt", "install", INSTALL),
    ("apt", "list", INSPECT),
    ("apt", "purge", INSTALL),
    ("apt", "reinstall", INSTALL),
    ("apt", "remove", INSTALL),
    ("apt", "search", INSPECT),
    ("apt", "show", INSPECT),
    ("apt", "update", INSTALL),
    ("apt", "upgrade", INSTALL),
    ("apt-get", "autoremove", INSTALL),
    ("apt-get", "dist-upgrade", INSTALL),
    ("apt-get", "install", INSTALL),
    ("apt-get", "purge", INSTALL),
    ("apt-get", "remove", INSTALL),
    ("apt-get", "update", INSTALL),
    ("apt-get", "upgrade", INSTALL),
    ("cargo", "add", INSTALL),
    ("cargo", "b", BUILD),
    ("cargo", "bench", BUILD),
    ("cargo", "build", BUILD),
    ("cargo", "c", BUILD),
    ("cargo", "check", BUILD),
    ("cargo", "clippy", BUILD),
    ("cargo", "doc", BUILD),
    ("cargo", "fmt", BUILD),
    ("cargo", "install", INSTALL),
    ("cargo", "r", BUILD),
    ("cargo", "remove", INSTALL),
    ("cargo", "run", BUILD),
    ("cargo", "t", BUILD),
    ("cargo", "test", BUILD),
    ("cargo", "uninstall", INSTALL),
    ("dnf", "downgrade", INSTALL),
    ("dnf", "erase", INSTALL),
    ("dnf", "install", INSTALL),
    ("dnf", "reinstall", INSTALL),
    ("dnf", "remove", INSTALL),
    ("dnf", "update", INSTALL),
    ("dnf", "upgrade", INSTALL),
    ("gem", "install", INSTALL),
    ("gem", "uninstall", INSTALL),
    ("gem", "update", INSTALL),
    ("git", "add", VCS_WRITE),
    ("git", "am", VCS_WRITE),
    ("git", "apply", VCS_WRITE),
    ("git", "blame", INSPECT),
    ("git", "cat-file", INSPECT),
    ("git", "checkout", VCS_WRITE),
    ("git", "cherry-pick", VCS_WRITE),
    ("git", "clean", CLEAN),
    ("git", "clone", NETWORK),
    ("git", "commit", VCS_WRITE),
    ("git", "describe", INSPECT),
    ("git", "diff", INSPECT),
    ("git", "fetch", NETWORK),
    ("git", "grep", INSPECT),
    ("git", "help", INSPECT),
    ("git", "init", VCS_WRITE),
    ("git", "log", INSPECT),
    ("git", "ls-files", INSPECT),
    ("git", "ls-remote", NETWORK),
    ("git", "ls-tree", INSPECT),
    ("git", "merge", VCS_WRITE),
    ("git", "mv", VCS_WRITE),
    // pull is fetch and merge
    ("git", "pull", PUSH),
    ("git", "push", PUSH),
    ("git", "rebase", VCS_WRITE),
    ("git", "reset", VCS_WRITE),
    ("git", "restore", VCS_WRITE),
    ("git", "rev-list", INSPECT),
    ("git", "rev-parse", INSPECT),
    ("git", "rm", VCS_WRITE),
    ("git", "show", INSPECT),
    ("git", "show-ref", INSPECT),
    ("git", "stash", VCS_WRITE),
    ("git", "status", INSPECT),
    ("git", "switch", VCS_WRITE),
    ("git", "tag", VCS_WRITE),
    ("git", "version", INSPECT),
    ("go", "build", BUILD),
    // go generate runs the commands written in the sources
    ("go", "generate", BUILD),
    ("go", "get", INSTALL),
    ("go", "install", INSTALL),
    ("go", "mod download", INSTALL),
    ("go", "run", BUILD),
    ("go", "test", BUILD),
    ("go", "vet", BUILD),
    ("npm", "add", INSTALL),
    ("npm", "ci", INSTALL),
    ("npm", "exec", BUILD_INSTALL),
    ("npm", "i", INSTALL),
    ("npm", "install", INSTALL),
    ("npm", "ls", INSPECT),
    ("npm", "run", BUILD),
    ("npm", "run-script", BUILD),
    ("npm", "start", BUILD),
    ("npm", "t", BUILD),
    ("npm", "test", BUILD),
    ("npm", "uninstall", INSTALL),
    ("npm", "update", INSTALL),
    ("pip", "download", INSTALL),
    ("pip", "freeze", INSPECT),
    ("pip", "install", INSTALL),
    ("pip", "list", INSPECT),
    ("pip", "show", INSPECT),
    ("pip", "uninstall", INSTALL),
    ("pip3", "download", INSTALL),
    ("pip3", "freeze", INSPECT),
    ("pip3", "install", INSTALL),
    ("pip3", "list", INSPECT),
    ("pip3", "show", INSPECT),
    ("pip3", "uninstall", INSTALL),
    ("pipx", "install", INSTALL),
    // pipx run installs into a temporary environment and runs it
    ("pipx", "run", BUILD_INSTALL),
    ("pipx", "uninstall", INSTALL),
    ("pipx", "upgrade", INSTALL),
    ("pnpm", "add", INSTALL),
    ("pnpm", "ci", INSTALL),
    ("pnpm", "dlx", BUILD_INSTALL),
    ("pnpm", "exec", BUILD),
    ("pnpm", "i", INSTALL),
    ("pnpm", "install", INSTALL),
    ("pnpm", "remove", INSTALL),
    ("pnpm", "run", BUILD),
    ("pnpm", "test", BUILD),
    ("pnpm", "update", INSTALL),
    ("uv", "add", INSTALL),
    ("uv", "pip install", INSTALL),
    ("uv", "pip uninstall", INSTALL),
    ("uv", "remove", INSTALL),
    ("uv", "run", BUILD),
    ("uv", "sync", INSTALL),
    ("uv", "tool install", INSTALL),
    ("uv", "tool run", BUILD_INSTALL),
    ("yarn", "", INSTALL),
    ("yarn", "add", INSTALL),
    ("yarn", "dlx", BUILD_INSTALL),
    ("yarn", "install", INSTALL),
    ("yarn", "remove", INSTALL),
    ("yarn", "run", BUILD),
    ("yarn", "test", BUILD),
    ("yum", "downgrade", INSTALL),
    ("yum", "erase", INSTALL),
    ("yum", "install", INSTALL),
    ("yum", "reinstall", INSTALL),
    ("yum", "remove", INSTALL),
    ("yum", "update", INSTALL),
    ("yum", "upgrade", INSTALL),
];

/// Programs whose name is enough, sorted. Wrappers (`sudo`, `env`, ...), shells,
/// `find`, `git`, `python`, `sed`, `nc`, `socat`, `php` and the programs of
/// [`SUBCOMMANDS`] are decided by their arguments instead.
#[rustfmt::skip]
const PROGRAMS: &[(&str, &[Category])] = &[
    (":", INSPECT),
    ("[", INSPECT),
    ("awk", INSPECT),
    ("b2sum", INSPECT),
    ("basename", INSPECT),
    ("break", INSPECT),
    ("bun", BUILD),
    ("c++", BUILD),
    ("cat", INSPECT),
    ("cc", BUILD),
    ("cd", INSPECT),
    ("chgrp", PRIVILEGE),
    ("chmod", PRIVILEGE),
    ("chown", PRIVILEGE),
    ("clang", BUILD),
    ("clang++", BUILD),
    ("cmake", BUILD),
    ("cmp", INSPECT),
    ("column", INSPECT),
    ("comm", INSPECT),
    ("continue", INSPECT),
    ("curl", NETWORK),
    ("cut", INSPECT),
    ("date", INSPECT),
    ("declare", INSPECT),
    ("deno", BUILD),
    ("df", INSPECT),
    ("diff", INSPECT),
    ("dig", NETWORK),
    ("dirname", INSPECT),
    ("du", INSPECT),
    ("echo", INSPECT),
    ("exit", INSPECT),
    ("export", INSPECT),
    ("false", INSPECT),
    ("file", INSPECT),
    ("ftp", NETWORK),
    ("g++", BUILD),
    ("gawk", INSPECT),
    ("gcc", BUILD),
    ("gradle", BUILD),
    ("grep", INSPECT),
    ("head", INSPECT),
    ("host", NETWORK),
    ("http-server", LISTENER),
    ("id", INSPECT),
    ("java", BUILD),
    ("javac", BUILD),
    ("jq", INSPECT),
    ("less", INSPECT),
    ("local", INSPECT),
    ("ls", INSPECT),
    ("make", BUILD),
    ("md5sum", INSPECT),
    ("mount", PRIVILEGE),
    ("mvn", BUILD),
    ("ninja", BUILD),
    ("node", BUILD),
    ("npx", BUILD_INSTALL),
    ("nslookup", NETWORK),
    ("od", INSPECT),
    ("perl", BUILD),
    ("ping", NETWORK),
    ("popd", INSPECT),
    ("printenv", INSPECT),
    ("printf", INSPECT),
    ("ps", INSPECT),
    ("pushd", INSPECT),
    ("pwd", INSPECT),
    ("pytest", BUILD),
    ("read", INSPECT),
    ("readlink", INSPECT),
    ("realpath", INSPECT),
    ("return", INSPECT),
    ("rg", INSPECT),
    ("rm", DELETE),
    ("rmdir", DELETE),
    ("rsync", NETWORK),
    ("ruby", BUILD),
    ("rustc", BUILD),
    ("scp", NETWORK),
    ("seq", INSPECT),
    ("set", INSPECT),
    ("setcap", PRIVILEGE),
    ("sftp", NETWORK),
    ("sha1sum", INSPECT),
    ("sha256sum", INSPECT),
    ("sha512sum", INSPECT),
    ("shift", INSPECT),
    ("shred", DELETE),
    ("sleep", INSPECT),
    ("sort", INSPECT),
    ("ssh", NETWORK),
    ("stat", INSPECT),
    ("tac", INSPECT),
    ("tail", INSPECT),
    ("telnet", NETWORK),
    ("test", INSPECT),
    ("tox", BUILD),
    ("tr", INSPECT),
    ("tree", INSPECT),
    ("true", INSPECT),
    ("truncate", DELETE),
    ("tsc", BUILD),
    ("type", INSPECT),
    ("umount", PRIVILEGE),
    ("uname", INSPECT),
    ("uniq", INSPECT),
    ("unlink", DELETE),
    ("unset", INSPECT),
    ("uvx", BUILD_INSTALL),
    ("wait", INSPECT),
    ("wc", INSPECT),
    ("wget", NETWORK),
    ("which", INSPECT),
    ("whoami", INSPECT),
    ("xxd", INSPECT),
];

// ---- the policy section and its decisions

/// A tool argument: `"tool.argument"` in the policy file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ToolArg {
    /// The tool's name, as in `tools/call`.
    pub tool: String,
    /// The name of the argument (a key of the call's `arguments` object).
    pub argument: String,
}

impl fmt::Display for ToolArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.tool, self.argument)
    }
}

impl Serialize for ToolArg {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ToolArg {
    /// Splits at the first '.'; the checks (exactly one '.', both sides non-empty)
    /// are in validation, which can point at the entry's line.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let (tool, argument) = s.split_once('.').unwrap_or((&s, ""));
        Ok(ToolArg {
            tool: tool.to_string(),
            argument: argument.to_string(),
        })
    }
}

impl JsonSchema for ToolArg {
    fn schema_name() -> Cow<'static, str> {
        "ToolArgument".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "a tool argument, written \"tool.argument\": the tool's name, one '.', the argument's name",
            "pattern": "^[^.\\s]+\\.[^.\\s]+$"
        })
    }
}

fn default_unparsed() -> Verdict {
    Verdict::Approve
}

fn default_categories() -> BTreeMap<Category, Verdict> {
    Category::ALL
        .into_iter()
        .map(|c| (c, c.default_verdict()))
        .collect()
}

/// The categories written in the file, over the defaults of those left out.
fn categories_with_defaults<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<Category, Verdict>, D::Error> {
    let written = BTreeMap::<Category, Verdict>::deserialize(d)?;
    let mut all = default_categories();
    all.extend(written);
    Ok(all)
}

fn categories_schema(g: &mut SchemaGenerator) -> Schema {
    let verdict = g.subschema_for::<Verdict>();
    let mut props = serde_json::Map::new();
    for c in Category::ALL {
        props.insert(
            c.as_str().into(),
            serde_json::json!({ "allOf": [verdict.clone()], "default": c.default_verdict().as_str() }),
        );
    }
    json_schema!({
        "type": "object",
        "description": "the verdict of each category: inspect, build, install, network, vcs_write, delete, privilege, background, listener; a command gets the strictest of its categories' verdicts. Default: all \"allow\" except privilege = \"deny\" and listener = \"approve\"",
        "properties": props,
        "additionalProperties": false
    })
}

/// The `[commands]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandRules {
    /// Tool arguments that hold a shell command line, as "tool.argument", e.g.
    /// ["run_shell.cmd"]. Default none.
    #[serde(default, rename = "tools")]
    pub line_args: Vec<ToolArg>,
    /// Tool arguments that hold an argument vector (a JSON array of strings, run
    /// without a shell), as "tool.argument", e.g. ["spawn.argv"]. Default none.
    #[serde(default, rename = "argv_tools")]
    pub argv_args: Vec<ToolArg>,
    /// The verdict for a command whose program is in no category and has no
    /// `[commands.programs]` entry. Default "allow".
    #[serde(default)]
    pub default: Verdict,
    /// The verdict for an input that cannot be classified (a syntax error, a computed
    /// program name, `eval`, ...): "approve" (the default) or "deny"; never "allow".
    #[serde(default = "default_unparsed")]
    pub unparsed: Verdict,
    /// The verdict of each category; a command gets the strictest of its categories'.
    #[serde(
        default = "default_categories",
        deserialize_with = "categories_with_defaults"
    )]
    #[schemars(schema_with = "categories_schema")]
    pub categories: BTreeMap<Category, Verdict>,
    /// Verdicts by program basename (e.g. curl = "deny"); an entry overrides the
    /// program's categories. No '/' or whitespace in a name.
    #[serde(default)]
    pub programs: BTreeMap<String, Verdict>,
}

impl Default for CommandRules {
    fn default() -> Self {
        CommandRules {
            line_args: Vec::new(),
            argv_args: Vec::new(),
            default: Verdict::Allow,
            unparsed: default_unparsed(),
            categories: default_categories(),
            programs: BTreeMap::new(),
        }
    }
}

/// The decision on a command input, with what was found in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandDecision {
    /// The strictest decision over the commands (or the unparsed one).
    pub decision: Decision,
    /// The commands found, in order.
    pub commands: Vec<Classified>,
    /// Why the input (or one of a call's arguments) could not be classified.
    pub unparsed: Option<String>,
}

impl CommandDecision {
    /// The record for the audit log: `{"commands": [{"program": "rm", "categories":
    /// ["delete"]}], "categories": ["delete"]}`, plus `"unparsed": why` when so.
    pub fn audit_detail(&self) -> serde_json::Value {
        let mut all: Vec<Category> = self
            .commands
            .iter()
            .flat_map(|c| c.categories.iter().copied())
            .collect();
        all.sort();
        all.dedup();
        let mut v = serde_json::json!({ "commands": self.commands, "categories": all });
        if let (Some(why), Some(obj)) = (&self.unparsed, v.as_object_mut()) {
            obj.insert("unparsed".into(), why.clone().into());
        }
        v
    }

    /// Both decisions' findings; the stricter decision, the first on a tie.
    fn merge(mut self, other: CommandDecision) -> CommandDecision {
        self.decision = self.decision.stricter(other.decision);
        self.commands.extend(other.commands);
        self.unparsed = self.unparsed.or(other.unparsed);
        self
    }
}

/// What to classify: a shell command line or an argument vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// A shell command line.
    Line(String),
    /// An argument vector, run without a shell.
    Argv(Vec<String>),
}

/// Classifies `input` in this process.
pub fn classify(input: &Input) -> Parsed {
    match input {
        Input::Line(l) => classify_line(l),
        Input::Argv(a) => classify_argv(a),
    }
}

/// Something that classifies input: [`InProcess`], or (the binary's) a
/// child process with CPU and memory limits, so that a parser bug on
/// hostile input (a panic, a loop, an allocation without end) ends that
/// child and not the gateway.
pub trait Classifier {
    /// Classifies one input; a classifier that fails says `Unparsed`.
    fn classify(&self, input: &Input) -> Parsed;
}

/// Classification in this process ([`classify`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct InProcess;

impl Classifier for InProcess {
    fn classify(&self, input: &Input) -> Parsed {
        classify(input)
    }
}

/// How a declared argument is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArgKind {
    Line,
    Argv,
}

impl CommandRules {
    /// Whether `tool` has a declared argument.
    pub fn declares(&self, tool: &str) -> bool {
        self.line_args
            .iter()
            .chain(&self.argv_args)
            .any(|a| a.tool == tool)
    }

    /// Whether `tool.argument` is declared (a command line or an argument
    /// vector): its value is a command, which the path rules leave alone.
    pub fn declares_argument(&self, tool: &str, argument: &str) -> bool {
        self.line_args
            .iter()
            .chain(&self.argv_args)
            .any(|a| a.tool == tool && a.argument == argument)
    }

    /// True when no tool argument is declared: the section has no effect.
    pub fn is_empty(&self) -> bool {
        self.line_args.is_empty() && self.argv_args.is_empty()
    }

    /// Decides a shell command line.
    pub fn decide_line(&self, line: &str) -> CommandDecision {
        self.decide(classify_line(line))
    }

    /// Decides an argument vector.
    pub fn decide_argv(&self, argv: &[String]) -> CommandDecision {
        self.decide(classify_argv(argv))
    }

    /// Decides a call's declared arguments: `None` when `tool` has no declared
    /// argument, or none of them is present (a missing argument is not a command).
    /// An argument of the wrong JSON type, or arguments that are not an object, are
    /// denied (`argument.invalid`). Several arguments: the strictest decision.
    pub fn decide_call(
        &self,
        tool: &str,
        arguments: Option<&serde_json::Value>,
    ) -> Option<CommandDecision> {
        self.decide_call_with(tool, arguments, &InProcess)
    }

    /// [`CommandRules::decide_call`], classifying with `classifier`.
    pub fn decide_call_with(
        &self,
        tool: &str,
        arguments: Option<&serde_json::Value>,
        classifier: &dyn Classifier,
    ) -> Option<CommandDecision> {
        let declared: Vec<(&ToolArg, ArgKind)> = self
            .line_args
            .iter()
            .map(|a| (a, ArgKind::Line))
            .chain(self.argv_args.iter().map(|a| (a, ArgKind::Argv)))
            .filter(|(a, _)| a.tool == tool)
            .collect();
        let first = declared.first()?;
        let obj = match arguments {
            None | Some(serde_json::Value::Null) => return None,
            Some(serde_json::Value::Object(obj)) => obj,
            Some(_) => return Some(invalid(first.1, "the call's arguments are not an object")),
        };
        let mut result: Option<CommandDecision> = None;
        for (arg, kind) in declared {
            let Some(value) = obj.get(&arg.argument) else {
                continue;
            };
            let d = match (kind, value) {
                (ArgKind::Line, serde_json::Value::String(line)) => {
                    self.decide(classifier.classify(&Input::Line(line.clone())))
                }
                (ArgKind::Argv, serde_json::Value::Array(items)) => {
                    let argv: Option<Vec<String>> = items
                        .iter()
                        .map(|i| i.as_str().map(str::to_string))
                        .collect();
                    match argv {
                        Some(argv) => self.decide(classifier.classify(&Input::Argv(argv))),
                        None => invalid(
                            kind,
                            &format!(
                                "argument `{}` is not an array of strings",
                                clip(&arg.argument)
                            ),
                        ),
                    }
                }
                (ArgKind::Line, _) => invalid(
                    kind,
                    &format!("argument `{}` is not a string", clip(&arg.argument)),
                ),
                (ArgKind::Argv, _) => invalid(
                    kind,
                    &format!(
                        "argument `{}` is not an array of strings",
                        clip(&arg.argument)
                    ),
                ),
            };
            result = Some(match result {
                None => d,
                Some(prev) => prev.merge(d),
            });
        }
        result
    }

    /// Declares `tool.argument` as a command line unless it is declared already (in
    /// either list: the policy's own declaration wins).
    pub fn declare_line(&mut self, tool: &str, argument: &str) {
        if !self.declared(tool, argument) {
            self.line_args.push(ToolArg {
                tool: tool.into(),
                argument: argument.into(),
            });
        }
    }

    /// Declares `tool.argument` as an argument vector unless it is declared already.
    pub fn declare_argv(&mut self, tool: &str, argument: &str) {
        if !self.declared(tool, argument) {
            self.argv_args.push(ToolArg {
                tool: tool.into(),
                argument: argument.into(),
            });
        }
    }

    fn declared(&self, tool: &str, argument: &str) -> bool {
        self.line_args
            .iter()
            .chain(&self.argv_args)
            .any(|a| a.tool == tool && a.argument == argument)
    }

    /// The verdict of a category (its default when the map lacks it, which only a
    /// hand-built value can do).
    fn category_verdict(&self, c: Category) -> Verdict {
        self.categories
            .get(&c)
            .copied()
            .unwrap_or(c.default_verdict())
    }

    /// One command: its program's entry, else the strictest of its categories,
    /// else the default.
    fn decide_one(&self, c: &Classified) -> Decision {
        if let Some(v) = self.programs.get(&c.program) {
            return Decision::new(
                *v,
                Reason::CommandProgram,
                Source::CommandProgram(c.program.clone()),
            );
        }
        // max_by_key keeps the last of equals; rev() makes the first category win ties
        let strictest = c
            .categories
            .iter()
            .rev()
            .max_by_key(|cat| self.category_verdict(**cat));
        match strictest {
            Some(cat) => Decision::new(
                self.category_verdict(*cat),
                Reason::CommandCategory,
                Source::CommandCategory(*cat),
            ),
            None => Decision::new(self.default, Reason::CommandDefault, Source::CommandDefault),
        }
    }

    /// Decides what a classifier found.
    pub fn decide(&self, parsed: Parsed) -> CommandDecision {
        match parsed {
            Parsed::Unparsed(why) => CommandDecision {
                decision: Decision::new(
                    self.unparsed,
                    Reason::CommandUnparsed,
                    Source::CommandUnparsed,
                ),
                commands: Vec::new(),
                unparsed: Some(why),
            },
            Parsed::Commands(commands) => {
                let decision = commands
                    .iter()
                    .map(|c| self.decide_one(c))
                    .reduce(Decision::stricter)
                    // nothing runs (a comment, `X=1`): the default, as for an unknown program
                    .unwrap_or_else(|| {
                        Decision::new(self.default, Reason::CommandDefault, Source::CommandDefault)
                    });
                CommandDecision {
                    decision,
                    commands,
                    unparsed: None,
                }
            }
        }
    }
}

/// A declared argument of the wrong type: denied.
fn invalid(kind: ArgKind, why: &str) -> CommandDecision {
    let source = match kind {
        ArgKind::Line => Source::CommandLineTools,
        ArgKind::Argv => Source::CommandArgvTools,
    };
    CommandDecision {
        decision: Decision::deny(Reason::ArgumentInvalid, source),
        commands: Vec::new(),
        unparsed: Some(why.to_string()),
    }
}

#[cfg(test)]
mod tests;
