//! Classification and decision tests, named after the command or the attack they try.

use super::*;
use crate::Verdict;

/// The commands of a line, compactly: "cat:inspect curl:network".
fn line(s: &str) -> String {
    show(classify_line(s))
}

fn argv(a: &[&str]) -> String {
    show(classify_argv(
        &a.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    ))
}

fn show(p: Parsed) -> String {
    match p {
        Parsed::Commands(cmds) => cmds
            .iter()
            .map(|c| {
                let cats: Vec<&str> = c.categories.iter().map(|c| c.as_str()).collect();
                format!("{}:{}", c.program, cats.join(","))
            })
            .collect::<Vec<_>>()
            .join(" "),
        Parsed::Unparsed(why) => format!("UNPARSED({why})"),
    }
}

fn unparsed(s: &str) -> bool {
    matches!(classify_line(s), Parsed::Unparsed(_))
}

// ---- each category, with real command lines

#[test]
fn inspect_commands() {
    assert_eq!(line("ls -la /workspace"), "ls:inspect");
    assert_eq!(
        line("grep -rn foo src | head -5"),
        "grep:inspect head:inspect"
    );
    assert_eq!(line("[ -f x ] && cat x"), "[:inspect cat:inspect");
    assert_eq!(line("sed -n 1,10p f"), "sed:inspect");
    assert_eq!(line("env"), "env:inspect");
    assert_eq!(line("git status"), "git:inspect");
    assert_eq!(line("git log --oneline -5"), "git:inspect");
    assert_eq!(line("git branch -a"), "git:inspect");
    assert_eq!(line("find . -name '*.rs'"), "find:inspect");
    assert_eq!(line("command -v rm"), "command:inspect");
}

#[test]
fn build_commands() {
    assert_eq!(line("cargo test -p x"), "cargo:build");
    assert_eq!(line("cargo +nightly build"), "cargo:build");
    assert_eq!(line("make -j4 && pytest -q"), "make:build pytest:build");
    assert_eq!(line("npm run build"), "npm:build");
    assert_eq!(line("go test ./..."), "go:build");
    assert_eq!(line("python3 x.py"), "python3:build");
    assert_eq!(line("python3.12 -c 'print(1)'"), "python3.12:build");
    assert_eq!(line("node -e 1"), "node:build");
    assert_eq!(line("bash script.sh"), "bash:build");
    assert_eq!(line("curl -s x | sh"), "curl:network sh:build");
}

#[test]
fn install_commands() {
    assert_eq!(line("pip install requests"), "pip:install");
    assert_eq!(line("python3 -m pip install -U x"), "python3:install");
    assert_eq!(line("npm ci"), "npm:install");
    assert_eq!(line("yarn"), "yarn:install");
    assert_eq!(line("cargo install ripgrep"), "cargo:install");
    assert_eq!(line("apt-get -y install curl"), "apt-get:install");
    assert_eq!(line("apk add git"), "apk:install");
    assert_eq!(line("uv pip install x"), "uv:install");
    assert_eq!(line("uv add x"), "uv:install");
    assert_eq!(line("go install x@latest"), "go:install");
    assert_eq!(line("gem install rails"), "gem:install");
    assert_eq!(line("pipx run black"), "pipx:build,install");
    assert_eq!(line("pip list"), "pip:inspect");
}

#[test]
fn network_commands() {
    assert_eq!(line("curl -fsSL https://x"), "curl:network");
    assert_eq!(line("wget x && ssh h ls"), "wget:network ssh:network");
    assert_eq!(line("git clone https://x"), "git:network");
    assert_eq!(line("git fetch origin"), "git:network");
    assert_eq!(line("dig example.com"), "dig:network");
    assert_eq!(line("nc host 80"), "nc:network");
}

#[test]
fn vcs_write_commands() {
    assert_eq!(line("git commit -m x"), "git:vcs_write");
    assert_eq!(line("git -C repo add ."), "git:vcs_write");
    assert_eq!(line("git branch -D old"), "git:vcs_write");
    assert_eq!(line("git branch new-feature"), "git:vcs_write");
    assert_eq!(line("git push origin main"), "git:network,vcs_write");
    assert_eq!(line("git clean -fdx"), "git:vcs_write,delete");
}

#[test]
fn git_status_is_inspect_but_git_push_is_vcs_write_and_network() {
    let status = classify_line("git status");
    let push = classify_line("git push");
    assert_eq!(
        status,
        Parsed::Commands(vec![Classified {
            program: "git".into(),
            categories: vec![Category::Inspect]
        }])
    );
    assert_eq!(
        push,
        Parsed::Commands(vec![Classified {
            program: "git".into(),
            categories: vec![Category::Network, Category::VcsWrite]
        }])
    );
}

#[test]
fn delete_commands() {
    assert_eq!(line("rm -rf build"), "rm:delete");
    assert_eq!(
        line("rmdir d; unlink f; shred f"),
        "rmdir:delete unlink:delete shred:delete"
    );
    assert_eq!(line("truncate -s0 log"), "truncate:delete");
}

#[test]
fn privilege_commands() {
    assert_eq!(line("chmod +x a"), "chmod:privilege");
    assert_eq!(
        line("sudo -u root ls"),
        "sudo:privilege ls:inspect,privilege"
    );
    assert_eq!(line("doas rm x"), "doas:privilege rm:delete,privilege");
    assert_eq!(
        line("su -c 'rm x' root"),
        "su:privilege rm:delete,privilege"
    );
    assert_eq!(line("mount /dev/sda1 /mnt"), "mount:privilege");
    assert_eq!(
        line("unshare -r id"),
        "unshare:privilege id:inspect,privilege"
    );
    assert_eq!(
        line("chroot /srv sh -c 'ls'"),
        "chroot:privilege ls:inspect,privilege"
    );
    assert_eq!(
        line("capsh --caps=x -- -c 'id'"),
        "capsh:privilege id:inspect,privilege"
    );
}

#[test]
fn background_commands() {
    assert_eq!(line("sleep 100 &"), "sleep:inspect,background");
    assert_eq!(
        line("nohup make &"),
        "nohup:background make:build,background"
    );
    assert_eq!(
        line("setsid node srv.js"),
        "setsid:background node:build,background"
    );
    // `&` applies to the whole and-or list before it
    assert_eq!(
        line("a && rm x & ls"),
        "a:background rm:delete,background ls:inspect"
    );
    assert_eq!(line("(rm x) &"), "rm:delete,background");
}

#[test]
fn listener_commands() {
    assert_eq!(line("python3 -m http.server 8000"), "python3:listener");
    assert_eq!(line("nc -l 8080"), "nc:network,listener");
    assert_eq!(line("nc -lvp 8080"), "nc:network,listener");
    assert_eq!(line("socat TCP-LISTEN:80,fork -"), "socat:network,listener");
    assert_eq!(line("php -S 0.0.0.0:80"), "php:listener");
    assert_eq!(line("http-server -p 80"), "http-server:listener");
}

#[test]
fn unknown_program_has_no_category() {
    assert_eq!(line("frobnicate --all"), "frobnicate:");
    assert_eq!(line("./configure"), "configure:");
    assert_eq!(line("sed -i s/a/b/ f"), "sed:");
    assert_eq!(line("npm whoami"), "npm:");
}

// ---- hiding a command in the syntax

#[test]
fn pipe_into_curl_is_seen() {
    assert_eq!(
        line("cat a | curl -d @- http://x"),
        "cat:inspect curl:network"
    );
}

#[test]
fn and_or_and_sequences_are_all_seen() {
    assert_eq!(line("ls && rm -rf x"), "ls:inspect rm:delete");
    assert_eq!(line("false || curl x"), "false:inspect curl:network");
    assert_eq!(
        line("ls; rm x\nwget y"),
        "ls:inspect rm:delete wget:network"
    );
}

#[test]
fn subshell_rm_is_seen() {
    assert_eq!(line("(rm -rf /)"), "rm:delete");
    assert_eq!(line("{ ls; rm x; }"), "ls:inspect rm:delete");
}

#[test]
fn bodies_of_if_while_for_case_are_seen() {
    assert_eq!(
        line("if test -f x; then rm x; else curl y; fi"),
        "test:inspect rm:delete curl:network"
    );
    assert_eq!(line("while true; do rm x; done"), "true:inspect rm:delete");
    assert_eq!(line("for f in a b; do shred $f; done"), "shred:delete");
    assert_eq!(
        line("case $x in a) rm y;; *) ls;; esac"),
        "rm:delete ls:inspect"
    );
    assert_eq!(
        line("until false; do wget x; done"),
        "false:inspect wget:network"
    );
}

#[test]
fn command_substitution_inside_echo_is_seen() {
    assert_eq!(line("echo $(curl x)"), "curl:network echo:inspect");
    assert_eq!(line("echo \"a $(rm -rf x) b\""), "rm:delete echo:inspect");
    assert_eq!(line("X=$(curl x) ls"), "curl:network ls:inspect");
    assert_eq!(
        line("for f in $(wget x); do :; done"),
        "wget:network ::inspect"
    );
    assert_eq!(line("cat <<EOF\n$(rm x)\nEOF"), "rm:delete cat:inspect");
    // a quoted delimiter: the body is text
    assert_eq!(line("cat <<'EOF'\n$(rm x)\nEOF"), "cat:inspect");
}

#[test]
fn backticks_are_seen() {
    assert_eq!(line("echo `curl x`"), "curl:network echo:inspect");
    assert_eq!(line("echo \"`rm x`\""), "rm:delete echo:inspect");
}

#[test]
fn process_substitution_is_seen() {
    assert_eq!(line("diff <(curl a) b"), "curl:network diff:inspect");
    assert_eq!(line("ls > >(nc h 1)"), "nc:network ls:inspect");
}

#[test]
fn env_with_assignment_before_rm_is_rm() {
    assert_eq!(line("env X=1 rm a"), "rm:delete");
    assert_eq!(line("env -i -u HOME PATH=/x rm a"), "rm:delete");
    assert!(unparsed("env -S 'rm a'"));
    assert!(unparsed("env --split-string='rm a'"));
    assert_eq!(line("env X=1 sort -S 1G f"), "sort:inspect");
}

#[test]
fn assignment_before_rm_is_rm() {
    assert_eq!(line("X=1 rm a"), "rm:delete");
    assert_eq!(line("X=1 Y=2 rm a"), "rm:delete");
    assert_eq!(line("X=1"), "");
}

#[test]
fn sh_c_git_push_is_parsed() {
    assert_eq!(line("sh -c 'git push'"), "git:network,vcs_write");
    assert_eq!(line("bash -xec 'ls; rm x'"), "ls:inspect rm:delete");
    assert_eq!(
        argv(&["bash", "-c", "curl x | sh"]),
        "curl:network sh:build"
    );
}

#[test]
fn bash_c_sudo_ls_is_privilege() {
    assert_eq!(
        line("bash -c \"sudo ls\""),
        "sudo:privilege ls:inspect,privilege"
    );
}

#[test]
fn wrappers_run_the_wrapped_program() {
    assert_eq!(line("timeout -s KILL 10 rm x"), "rm:delete");
    assert_eq!(line("nice -n 5 make"), "make:build");
    assert_eq!(line("time curl x"), "curl:network");
    assert_eq!(line("stdbuf -oL curl x"), "curl:network");
    assert_eq!(line("ionice -c3 rm x"), "rm:delete");
    assert_eq!(line("xargs -0 -n1 rm"), "rm:delete");
    assert_eq!(line("xargs"), "xargs:inspect");
    assert_eq!(line("command rm x"), "rm:delete");
    assert_eq!(line("exec rm x"), "rm:delete");
    assert_eq!(line("busybox rm x"), "rm:delete");
    assert_eq!(line("builtin echo x"), "echo:inspect");
    // wrappers nest
    assert_eq!(
        line("sudo env X=1 nice nohup rm x"),
        "sudo:privilege nohup:privilege,background rm:delete,privilege,background"
    );
}

#[test]
fn long_chain_of_wrappers_does_not_exhaust_the_stack() {
    let argv: Vec<String> = std::iter::repeat_n("nice".to_string(), 10_000)
        .chain(["rm".to_string()])
        .collect();
    assert_eq!(show(classify_argv(&argv)), "rm:delete");
}

#[test]
fn nohup_make_in_the_background() {
    assert_eq!(
        line("nohup make &"),
        "nohup:background make:build,background"
    );
}

#[test]
fn path_qualified_rm_is_rm() {
    assert_eq!(line("/usr/bin/rm -rf x"), "rm:delete");
    assert_eq!(line("'/bin/rm' x"), "rm:delete");
    assert_eq!(argv(&["/usr/bin/curl", "x"]), "curl:network");
}

#[test]
fn quoting_the_program_name_does_not_hide_it() {
    assert_eq!(line("'r'm x"), "rm:delete");
    assert_eq!(line("r\\m x"), "rm:delete");
    assert_eq!(line("\"rm\" x"), "rm:delete");
}

#[test]
fn find_delete_is_delete() {
    assert_eq!(line("find . -name '*.o' -delete"), "find:delete");
}

#[test]
fn find_exec_rm_classifies_rm() {
    assert_eq!(line("find . -exec rm {} \\;"), "rm:delete find:inspect");
    assert_eq!(
        line("find . -execdir curl x {} +"),
        "curl:network find:inspect"
    );
    assert_eq!(
        line("find . -exec sh -c 'rm \"$1\"' _ {} \\;"),
        "rm:delete find:inspect"
    );
}

#[test]
fn redirection_to_dev_tcp_is_network() {
    assert_eq!(
        line("echo hi > /dev/tcp/1.2.3.4/80"),
        "echo:inspect,network"
    );
    assert_eq!(line("cat < /dev/udp/h/53"), "cat:inspect,network");
    assert_eq!(line("exec 3<>/dev/tcp/h/80"), "exec:network");
    assert_eq!(line("> /dev/tcp/h/80"), "(redirect):network");
    assert_eq!(
        line("{ cat f; } > /dev/tcp/h/80"),
        "(redirect):network cat:inspect"
    );
    assert_eq!(line("cat f > /dev/tcp/$H/80"), "cat:inspect,network");
    assert_eq!(line("cat f > /dev/$P/h/80"), "cat:inspect,network");
    assert_eq!(line("cat f > /dev/null"), "cat:inspect");
}

// ---- what cannot be classified

#[test]
fn computed_program_name_is_unparsed() {
    assert!(unparsed("$CMD x"));
    assert!(unparsed("${CMD} x"));
    assert!(unparsed("$(echo rm) x"));
    assert!(unparsed("`echo rm` x"));
    assert!(unparsed("r? x"));
    assert!(unparsed("{rm,-rf,x}"));
    assert!(unparsed("sudo $CMD"));
    assert!(unparsed("sh -c \"$SCRIPT\""));
    assert!(unparsed("git $SUB"));
    assert!(unparsed("cargo $X"));
    assert!(unparsed("~/bin/rm x"));
}

#[test]
fn eval_source_alias_and_functions_are_unparsed() {
    assert!(unparsed("eval \"rm x\""));
    assert!(unparsed("source ./x.sh"));
    assert!(unparsed(". ./x.sh"));
    assert!(unparsed("alias ls='rm -rf'"));
    assert!(unparsed("ls() { rm -rf /; }; ls"));
    assert!(unparsed("function f { :; }"));
    assert!(unparsed("trap 'rm x' EXIT"));
    assert!(unparsed("command eval x"));
    assert!(unparsed("hash -p /bin/rm ls"));
}

#[test]
fn substitutions_hidden_in_expansions_are_unparsed() {
    assert!(unparsed("echo ${X:-$(rm x)}"));
    assert!(unparsed("echo $(( $(curl x) + 1 ))"));
    assert!(unparsed("(( x = `rm y` ))"));
}

#[test]
fn git_config_that_runs_programs_is_unparsed() {
    assert!(unparsed("git -c alias.st='!rm -rf /' st"));
    assert!(unparsed("git -c core.sshCommand='sh -c x' fetch"));
    assert_eq!(line("git -c user.name=x commit -m y"), "git:vcs_write");
}

#[test]
fn syntax_error_is_unparsed() {
    assert!(unparsed("ls |"));
    assert!(unparsed("if then fi"));
    assert!(unparsed("echo 'unterminated"));
    assert!(unparsed("sh -c 'ls |'"));
}

#[test]
fn empty_line_is_unparsed() {
    assert!(unparsed(""));
    assert!(unparsed("  \n\t "));
    assert_eq!(
        classify_argv(&[]),
        Parsed::Unparsed("empty argument vector".into())
    );
    // a comment runs nothing
    assert_eq!(classify_line("# just a note"), Parsed::Commands(vec![]));
}

#[test]
fn deep_nesting_of_sh_c_is_unparsed() {
    // quoting grows fourfold a level, so a line this deep is already too long...
    let mut s = "rm x".to_string();
    for _ in 0..12 {
        s = format!("sh -c {}", shell_quote(&s));
    }
    assert!(unparsed(&s));
    // ...and an argument vector (one level of quoting less) hits the depth limit
    let mut inner = "rm x".to_string();
    for _ in 0..MAX_DEPTH {
        inner = format!("sh -c {}", shell_quote(&inner));
    }
    match classify_argv(&["sh".into(), "-c".into(), inner]) {
        Parsed::Unparsed(why) => assert!(why.contains("deeper"), "{why}"),
        other => panic!("{other:?}"),
    }
    let mut ok = "rm x".to_string();
    for _ in 0..MAX_DEPTH {
        ok = format!("sh -c {}", shell_quote(&ok));
    }
    assert_eq!(line(&ok), "rm:delete");
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[test]
fn deep_nesting_of_substitutions_is_unparsed() {
    let s = format!("{}ls{}", "echo $(".repeat(12), ")".repeat(12));
    match classify_line(&s) {
        Parsed::Unparsed(why) => assert!(why.contains("deeper"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn hundreds_of_nested_groups_are_refused_before_the_parser_recurses() {
    // each of these overflows a 2MiB stack in the parser at a few hundred levels
    for (open, close) in [
        ("{ ", "; }"),
        ("(", ")"),
        ("if true; then ", "; fi"),
        ("f() { ", "; }"),
        ("echo $(", ")"),
    ] {
        let s = format!("{}ls{}", open.repeat(5000), close.repeat(5000));
        assert!(unparsed(&s), "{open}");
    }
}

#[test]
fn unparsed_reason_does_not_echo_long_input() {
    let s = format!("eval {}", "x".repeat(5000));
    let Parsed::Unparsed(why) = classify_line(&format!("ls | {} |", "y".repeat(5000))) else {
        panic!()
    };
    assert!(why.len() < 200, "{why}");
    let Parsed::Unparsed(why) = classify_line(&s) else {
        panic!()
    };
    assert!(why.len() < 200, "{why}");
    let Parsed::Unparsed(why) = classify_argv(&[format!("{}/eval", "d".repeat(500))]) else {
        panic!()
    };
    assert!(why.len() < 200, "{why}");
}

#[test]
fn over_long_or_nul_input_is_unparsed() {
    assert!(unparsed(&"ls ".repeat(30_000)));
    assert!(unparsed("ls\0rm"));
    assert!(matches!(
        classify_argv(&["rm".into(), "a\0b".into()]),
        Parsed::Unparsed(_)
    ));
}

#[test]
fn argv_is_not_a_shell() {
    // no shell: `;` and `$(...)` are plain arguments
    assert_eq!(argv(&["echo", "$(rm x); curl y"]), "echo:inspect");
    assert_eq!(argv(&["sudo", "ls"]), "sudo:privilege ls:inspect,privilege");
    assert_eq!(argv(&["env", "X=1", "sh", "-c", "rm x"]), "rm:delete");
    assert_eq!(argv(&["r*"]), "r*:");
}

#[test]
fn garbage_lines_never_panic() {
    const PIECES: &[&str] = &[
        "ls",
        " ",
        "|",
        "&",
        ";",
        "(",
        ")",
        "{",
        "}",
        "$(",
        "`",
        "'",
        "\"",
        "\\",
        "<<",
        "EOF",
        "\n",
        "$",
        "{",
        "[[",
        "]]",
        "if",
        "then",
        "fi",
        "for",
        "do",
        "done",
        "case",
        "esac",
        "sh -c ",
        "sudo ",
        "<(",
        ">",
        "/dev/tcp/",
        "=",
        "*",
        "é",
        "$((",
        "))",
        "#",
        "-exec",
        "find",
        ";;",
        "\\;",
        "!",
        "${",
        ":-",
        "}",
        "'$(rm)'",
    ];
    let mut rng = crate::tests::Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        let n = rng.below(24);
        let s: String = (0..n).map(|_| PIECES[rng.below(PIECES.len())]).collect();
        let _ = classify_line(&s);
        let argv: Vec<String> = s.split(' ').map(str::to_string).collect();
        let _ = classify_argv(&argv);
    }
}

// ---- tables

#[test]
fn tables_are_sorted_and_unique() {
    let names: Vec<&str> = PROGRAMS.iter().map(|(n, _)| *n).collect();
    assert!(names.windows(2).all(|w| w[0] < w[1]), "PROGRAMS not sorted");
    let wrappers: Vec<&str> = WRAPPERS.iter().map(|w| w.name).collect();
    assert!(
        wrappers.windows(2).all(|w| w[0] < w[1]),
        "WRAPPERS not sorted"
    );
    let subs: Vec<(&str, &str)> = SUBCOMMANDS.iter().map(|(p, s, _)| (*p, *s)).collect();
    assert!(
        subs.windows(2).all(|w| w[0] < w[1]),
        "SUBCOMMANDS not sorted"
    );
    assert!(UNCLASSIFIABLE.windows(2).all(|w| w[0] < w[1]));
    // a name is decided in one place only
    for w in &wrappers {
        assert!(!names.contains(w), "{w} is a wrapper and a program");
    }
    for (p, _) in &subs {
        assert!(!names.contains(p), "{p} is in PROGRAMS and SUBCOMMANDS");
    }
    for c in Category::ALL {
        assert_eq!(Category::from_name(c.as_str()), Some(c));
        assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
    }
    let mut sorted = Category::ALL;
    sorted.sort();
    assert_eq!(sorted, Category::ALL);
}

// ---- decisions

fn rules() -> CommandRules {
    let mut r = CommandRules::default();
    r.declare_line("run_shell", "cmd");
    r.declare_argv("spawn", "argv");
    r
}

#[test]
fn defaults_allow_but_deny_privilege_and_ask_for_listeners() {
    let r = rules();
    assert_eq!(r.decide_line("ls").decision.verdict, Verdict::Allow);
    let d = r.decide_line("ls && sudo id").decision;
    assert_eq!(
        d,
        Decision::deny(Reason::CommandCategory, "commands.categories.privilege")
    );
    let d = r.decide_line("nc -l 1").decision;
    assert_eq!(
        (d.verdict, &*d.source.to_string()),
        (Verdict::Approve, "commands.categories.listener")
    );
    let d = r.decide_line("frob").decision;
    assert_eq!(
        d,
        Decision::allow(Reason::CommandDefault, "commands.default")
    );
}

#[test]
fn strictest_command_of_the_line_decides_and_the_first_wins_ties() {
    let mut r = rules();
    r.categories.insert(Category::Delete, Verdict::Approve);
    r.categories.insert(Category::Network, Verdict::Approve);
    r.categories.insert(Category::VcsWrite, Verdict::Approve);
    let d = r.decide_line("ls; curl x; rm y");
    assert_eq!(d.decision.source, "commands.categories.network");
    assert_eq!(d.decision.verdict, Verdict::Approve);
    assert_eq!(d.commands.len(), 3);
    // within one command the first category (in order) wins ties
    let d = r.decide_line("git clean -fd").decision;
    assert_eq!(d.source, "commands.categories.vcs_write");
    r.categories.insert(Category::Delete, Verdict::Deny);
    let d = r.decide_line("git clean -fd").decision;
    assert_eq!(d.source, "commands.categories.delete");
}

#[test]
fn program_rule_overrides_its_categories() {
    let mut r = rules();
    r.categories.insert(Category::Network, Verdict::Allow);
    r.programs.insert("curl".into(), Verdict::Deny);
    r.programs.insert("rm".into(), Verdict::Allow);
    r.categories.insert(Category::Delete, Verdict::Deny);
    let d = r.decide_line("curl x").decision;
    assert_eq!(
        d,
        Decision::deny(Reason::CommandProgram, "commands.programs.curl")
    );
    assert_eq!(r.decide_line("rm -rf x").decision.verdict, Verdict::Allow);
    assert_eq!(r.decide_line("wget x").decision.verdict, Verdict::Allow);
}

#[test]
fn program_rule_for_the_wrapped_program_does_not_drop_sudo() {
    let mut r = rules();
    r.programs.insert("rm".into(), Verdict::Allow);
    let d = r.decide_line("sudo rm x").decision;
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.source, "commands.categories.privilege");
}

#[test]
fn unparsed_line_gets_the_unparsed_verdict() {
    let r = rules();
    let d = r.decide_line("eval \"rm x\"");
    assert_eq!(
        d.decision,
        Decision::approve(Reason::CommandUnparsed, "commands.unparsed")
    );
    assert!(d.unparsed.is_some());
    let mut strict = rules();
    strict.unparsed = Verdict::Deny;
    assert_eq!(strict.decide_line("$CMD").decision.verdict, Verdict::Deny);
    assert_eq!(strict.decide_line("").decision.verdict, Verdict::Deny);
}

#[test]
fn decide_call_reads_declared_arguments() {
    let r = rules();
    assert!(r
        .decide_call("other", Some(&serde_json::json!({"cmd": "rm x"})))
        .is_none());
    // declared but missing: not a command
    assert!(r
        .decide_call("run_shell", Some(&serde_json::json!({"x": 1})))
        .is_none());
    assert!(r.decide_call("run_shell", None).is_none());
    let d = r
        .decide_call("run_shell", Some(&serde_json::json!({"cmd": "sudo ls"})))
        .unwrap();
    assert_eq!(d.decision.verdict, Verdict::Deny);
    let d = r
        .decide_call(
            "spawn",
            Some(&serde_json::json!({"argv": ["rm", "-rf", "x"]})),
        )
        .unwrap();
    assert_eq!(d.commands[0].program, "rm");
    assert_eq!(d.decision.verdict, Verdict::Allow);
}

#[test]
fn decide_call_with_a_wrong_typed_argument_is_denied() {
    let r = rules();
    for (tool, args) in [
        ("run_shell", serde_json::json!({"cmd": ["rm", "x"]})),
        ("run_shell", serde_json::json!({"cmd": null})),
        ("run_shell", serde_json::json!({"cmd": 7})),
        ("spawn", serde_json::json!({"argv": "rm x"})),
        ("spawn", serde_json::json!({"argv": ["rm", 1]})),
        ("spawn", serde_json::json!("rm x")),
    ] {
        let d = r.decide_call(tool, Some(&args)).unwrap();
        assert_eq!(d.decision.verdict, Verdict::Deny, "{args}");
        assert_eq!(d.decision.reason, Reason::ArgumentInvalid, "{args}");
        assert!(d.unparsed.is_some());
    }
}

#[test]
fn decide_call_over_several_arguments_takes_the_strictest() {
    let mut r = rules();
    r.declare_line("run_shell", "setup");
    let d = r
        .decide_call(
            "run_shell",
            Some(&serde_json::json!({"cmd": "ls", "setup": "sudo id"})),
        )
        .unwrap();
    assert_eq!(d.decision.verdict, Verdict::Deny);
    assert_eq!(d.commands.len(), 3);
}

#[test]
fn declaring_twice_keeps_one_declaration() {
    let mut r = rules();
    r.declare_line("run_shell", "cmd");
    r.declare_argv("run_shell", "cmd");
    assert_eq!(r.line_args.len(), 1);
    assert!(r.argv_args.iter().all(|a| a.tool != "run_shell"));
    assert!(!r.is_empty());
    assert!(CommandRules::default().is_empty());
}

#[test]
fn audit_detail_lists_commands_and_categories() {
    let r = rules();
    let d = r.decide_line("rm a | curl x");
    assert_eq!(
        d.audit_detail(),
        serde_json::json!({
            "commands": [
                {"program": "rm", "categories": ["delete"]},
                {"program": "curl", "categories": ["network"]}
            ],
            "categories": ["network", "delete"]
        })
    );
    let d = r.decide_line("eval x");
    assert!(d.audit_detail()["unparsed"].is_string());
}

#[test]
fn a_long_line_of_many_commands_is_classified() {
    let s = "ls a; ".repeat(10_000);
    match classify_line(&s) {
        Parsed::Commands(c) => assert_eq!(c.len(), 10_000),
        other => panic!("{other:?}"),
    }
}

#[test]
fn numbers_that_overflow_the_parser_are_unparsed_not_a_crash() {
    // each of these panicked inside brush-parser 0.4 (an unwrap on an
    // integer parse); the first was found by the command_line fuzz target
    for l in [
        "88888888888888>8888888888888888888888888//oww$orr$or$X",
        "echo 99999999999>x",
        "echo {1..99999999999999999999}",
        "echo ~99999999999999999999/x",
        "echo $(echo {1..99999999999999999999})",
        "sh -c 'echo 99999999999<x'",
    ] {
        assert!(unparsed(l), "{l}");
    }
    // ordinary numbers are not
    assert!(!unparsed("date -d @1700000000"));
    assert!(!unparsed("echo 2>/dev/null 1>&2"));
}

#[test]
fn a_heredoc_inside_a_substitution_is_unparsed_not_an_endless_allocation() {
    // brush-parser 0.4 allocated without end on the first (found by the
    // command_line fuzz target); the check runs before the parser
    for l in [
        "~aurl -cho $(                   <<      #      id) `d)80who m=i` b",
        "echo $(cat <<EOF\nx\nEOF\n)",
        "cat <(cat <<EOF\nx\nEOF\n)",
        "cat <<X $( << # id)",
    ] {
        assert!(unparsed(l), "{l}");
    }
    assert!(!unparsed("cat > f <<'EOF'\nhello\nEOF"));
    assert!(!unparsed("cat > f <<'EOF'\necho $(date)\nEOF"));
}

#[test]
fn nested_parameter_expansions_are_bounded_before_the_parser_backtracks() {
    let deep = format!("echo {}x{}", "${a:-".repeat(14), "}".repeat(14));
    assert!(unparsed(&deep), "{deep}");
    // plain expansions, however many, are not nesting
    assert!(!unparsed(&"echo ${HOME} ".repeat(20)));
    // nor is a subscript; many brackets inside one are
    assert!(!unparsed("echo ${a[0]} ${b[1]}"));
    assert!(unparsed("echo ${a[[[[[[[[[[[[[+@}"));
}
