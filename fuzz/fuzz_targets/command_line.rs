//! The command classifier and the path check, on arbitrary input: the
//! command line of an `exec` call comes from the agent, and the relay
//! classifies it before anything runs. With `panic = "abort"` a panic or a
//! stack overflow there would end every session of a `mcpbox serve`, so:
//!
//! - our classifier (`classify_line`, `classify_argv`, `decide_line`)
//!   never panics; a panic inside brush-parser itself is tolerated, as is
//!   a parse slower than a few seconds: the binary parses a line that is
//!   not plain words in a child process with CPU, memory and wall-time
//!   limits (crates/mcpbox/src/classify.rs), where either makes the line
//!   `unparsed`. Inputs this target found inside brush-parser (an integer
//!   overflow, an allocation without end, exponential backtracking) are
//!   refused before the parser runs, and are seeds here;
//! - a decision always names its source, and an unparsed line is never
//!   allowed (the default rules say "approve");
//! - `confine_path` returns either an error or a normalised path at or
//!   under the root, with no `.` or `..` segment and no NUL.
//!
//! Input layout: the command line, optionally followed by a NUL and an
//! argument vector separated by NULs (also used as paths).
#![no_main]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use mcpbox_policy::{classify_argv, classify_line, confine_path, CommandRules, Parsed, Verdict};

const ROOT: &str = "/workspace";

fn check_path(p: &str) {
    if let Ok(abs) = confine_path(p, ROOT) {
        assert!(
            abs == ROOT || abs.starts_with("/workspace/"),
            "{p:?} confined to {abs:?}, outside the root"
        );
        assert!(!abs.contains('\0'), "{abs:?} holds a NUL");
        for seg in abs.split('/').skip(1) {
            assert!(
                !seg.is_empty() && seg != "." && seg != "..",
                "{p:?} confined to {abs:?}, with segment {seg:?}"
            );
        }
    }
}

fn classify(line: String, argv: Vec<String>) {
    let rules = CommandRules::default();
    let d = rules.decide_line(&line);
    assert!(!d.decision.source.is_empty(), "no source: {d:?}");
    if d.unparsed.is_some() {
        assert!(
            d.decision.verdict >= Verdict::Approve,
            "unparsed but allowed: {d:?}"
        );
    }
    if let Parsed::Commands(cmds) = classify_line(&line) {
        for c in cmds {
            assert!(!c.program.is_empty(), "a command without a program: {c:?}");
        }
    }
    if !argv.is_empty() {
        let _ = classify_argv(&argv);
        let d = rules.decide_argv(&argv);
        assert!(!d.decision.source.is_empty(), "no source: {d:?}");
    }
}

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let (line, rest) = text.split_once('\0').unwrap_or((text, ""));
    let argv: Vec<String> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split('\0').map(str::to_string).collect()
    };
    check_path(line);
    for a in &argv {
        check_path(a);
    }
    let line = line.to_string();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_parser = info
                .location()
                .is_some_and(|l| l.file().contains("brush-parser"));
            if in_parser {
                PANIC_IN_PARSER.store(true, Ordering::SeqCst);
            } else {
                default(info);
            }
        }));
    });
    PANIC_IN_PARSER.store(false, Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    // the child process's main thread has 8 MiB of stack
    std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || {
            let r = std::panic::catch_unwind(|| classify(line, argv));
            let _ = tx.send(r);
        })
        .expect("a classifier thread");
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(())) => {}
        // brush-parser's own panic: the child dies, the line is unparsed
        Ok(Err(_)) if PANIC_IN_PARSER.load(Ordering::SeqCst) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // slow: the child's limits end it in the binary; left to finish here
        Err(_) => {}
    }
});

static HOOK: Once = Once::new();
static PANIC_IN_PARSER: AtomicBool = AtomicBool::new(false);
