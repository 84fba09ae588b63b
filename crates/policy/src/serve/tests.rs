//! The serve config: every refusal is named after what it refuses.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

const FILE: &str = "/etc/mcpbox/serve.toml";

/// The issue's example, as written.
const ISSUE_EXAMPLE: &str = r#"
[listen]
address = "127.0.0.1:8787"            # loopback by default
# tls = { cert = "cert.pem", key = "key.pem" }   # required for a non-loopback address unless dangerously_allow_plaintext = true

[[clients]]
name  = "alice"
token = { from_env = "ALICE_TOKEN" }  # or from_file; compared in constant time, never logged
# servers = ["fs", "everything"]      # default: every server

[[clients]]
name = "conformance"
dangerously_allow_anonymous = true    # no token; refused unless [listen] is loopback

[[servers]]
name    = "everything"
policy  = "everything.toml"           # the sandbox policy, as for `mcpbox run`
command = ["node", "/workspace/input/server-everything/dist/index.js", "stdio"]

[[servers]]
name   = "tickets"
url    = "https://tickets.internal/mcp"   # a remote Streamable HTTP MCP server: placement "outside"
policy = "tickets.toml"                   # its [tools], [secrets] (the upstream credential) and [network] apply
"#;

/// A minimal valid config; tests append to or replace parts of it.
const SERVER: &str =
    "[[servers]]\nname = \"fs\"\npolicy = \"fs.toml\"\ncommand = [\"fs-server\"]\n";
const CLIENT: &str = "[[clients]]\nname = \"alice\"\ntoken = { from_env = \"ALICE_TOKEN\" }\n";

fn ok(text: &str) -> ServeConfig {
    match ServeConfig::from_str(text, Path::new(FILE)) {
        Ok(c) => c,
        Err(d) => panic!("expected a valid config, got:\n{d}\n---\n{text}"),
    }
}

fn err(text: &str) -> Diagnostic {
    match ServeConfig::from_str(text, Path::new(FILE)) {
        Ok(c) => panic!("expected a refusal, got:\n{}\n---\n{text}", c.to_toml()),
        Err(d) => d,
    }
}

/// Asserts a refusal at `key`, on `line`, whose message or hint contains `needle`.
fn refused(text: &str, key: &str, line: usize, needle: &str) -> Diagnostic {
    let d = err(text);
    assert_eq!(d.key, key, "wrong key in:\n{d}");
    assert_eq!(
        d.location.map(|l| l.line),
        Some(line),
        "wrong line in:\n{d}"
    );
    assert_eq!(d.file, PathBuf::from(FILE));
    let all = format!("{} {}", d.message, d.hint.clone().unwrap_or_default());
    assert!(all.contains(needle), "{needle:?} not in:\n{d}");
    assert!(d.hint.is_some(), "no hint in:\n{d}");
    d
}

// ---- what is accepted ----

#[test]
fn a_builtin_server_parses_and_prints_again() {
    let text = format!(
        "{CLIENT}[[servers]]\nname = \"sandbox\"\npolicy = \"s.toml\"\nbuiltin = \"sandbox\"\n"
    );
    let c = ok(&text);
    assert_eq!(c.servers[0].upstream, Upstream::Builtin("sandbox".into()));
    let again = ok(&c.to_toml());
    assert_eq!(
        again.servers[0].upstream,
        Upstream::Builtin("sandbox".into())
    );
}

#[test]
fn a_builtin_server_with_a_command_too_is_refused() {
    let text = format!("{CLIENT}[[servers]]\nname = \"sandbox\"\npolicy = \"s.toml\"\nbuiltin = \"sandbox\"\ncommand = [\"x\"]\n");
    refused(&text, "servers[0].builtin", 7, "builtin");
}

#[test]
fn an_unknown_builtin_server_is_refused_with_the_names_there_are() {
    let text = format!(
        "{CLIENT}[[servers]]\nname = \"sandbox\"\npolicy = \"s.toml\"\nbuiltin = \"shell\"\n"
    );
    refused(&text, "servers[0].builtin", 7, "sandbox");
}

#[test]
fn issue_example_parses_as_written() {
    let c = ok(ISSUE_EXAMPLE);
    assert_eq!(c.path, PathBuf::from(FILE));
    assert_eq!(c.listen.address, DEFAULT_ADDRESS);
    assert!(c.listen.tls.is_none());
    assert_eq!(c.clients.len(), 2);
    let alice = c.client("alice").unwrap();
    assert_eq!(alice.token, Some(TokenSource::Env("ALICE_TOKEN".into())));
    assert_eq!(alice.servers, None);
    let conf = c.client("conformance").unwrap();
    assert!(conf.dangerously_allow_anonymous);
    assert_eq!(conf.token, None);
    let everything = c.server("everything").unwrap();
    assert_eq!(
        everything.policy,
        PathBuf::from("/etc/mcpbox/everything.toml")
    );
    assert_eq!(
        everything.upstream,
        Upstream::Command(vec![
            "node".into(),
            "/workspace/input/server-everything/dist/index.js".into(),
            "stdio".into()
        ])
    );
    let tickets = c.server("tickets").unwrap();
    assert_eq!(
        tickets.upstream,
        Upstream::Url("https://tickets.internal/mcp".into())
    );
    assert_eq!(tickets.policy, PathBuf::from("/etc/mcpbox/tickets.toml"));
    assert!(c.may_use(alice, "tickets") && c.may_use(conf, "everything"));
}

#[test]
fn issue_example_loads_from_a_file_with_its_policies() {
    let dir = std::env::temp_dir().join(format!("mcpbox-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("serve.toml");
    std::fs::write(&file, ISSUE_EXAMPLE).unwrap();
    for p in ["everything.toml", "tickets.toml"] {
        std::fs::write(dir.join(p), "[tools]\ndefault = \"allow\"\n").unwrap();
    }
    let c = ServeConfig::load(&file).unwrap();
    assert_eq!(c.path, file);
    for s in &c.servers {
        assert!(s.policy.is_absolute() && s.policy.starts_with(&dir));
        let text = std::fs::read_to_string(&s.policy).unwrap();
        crate::parse(&text, &s.policy).unwrap();
    }
    let missing = ServeConfig::load(&dir.join("nope.toml")).unwrap_err();
    assert!(missing.message.contains("cannot read"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn defaults_are_the_safe_ones() {
    let c = ok(&format!("{SERVER}{CLIENT}"));
    assert_eq!(c.listen, Listen::default());
    assert!(c.listen.is_loopback());
    assert!(!c.listen.dangerously_allow_plaintext);
    assert!(c.listen.allowed_hosts.is_empty() && c.listen.allowed_origins.is_empty());
    let l = c.limits;
    assert_eq!(l, Limits::default());
    assert_eq!(l.max_body, 4 << 20);
    assert_eq!(l.max_concurrent, 32);
    assert_eq!(l.rate_per_second, 200);
    assert_eq!(l.burst, 400);
    assert_eq!(l.header_timeout, Duration::from_secs(10));
    assert_eq!(l.body_timeout, Duration::from_secs(30));
    assert_eq!(l.max_sessions_per_client, 64);
    assert_eq!(l.max_streams_per_client, 1024);
    assert_eq!(l.max_sandboxes_per_client, 32);
    assert_eq!(l.max_buffered_per_session, 32 << 20);
    assert_eq!(l.max_buffered_total, 512 << 20);
    assert_eq!(l.shutdown_grace, Duration::from_secs(10));
}

#[test]
fn a_session_budget_above_the_gateways_is_refused() {
    let e = err(&format!(
        "[limits]\nmax_buffered_per_session = \"64MiB\"\nmax_buffered_total = \"32MiB\"\n{SERVER}{CLIENT}"
    ));
    assert_eq!(e.key, "limits.max_buffered_per_session", "{e}");
}

#[test]
fn limits_are_read_with_units() {
    let c = ok(&format!(
        "[limits]\nmax_body = \"1MiB\"\nmax_concurrent = 4\nrate_per_second = 10\nburst = 20\nheader_timeout = \"2s\"\nbody_timeout = \"1m\"\nmax_sessions_per_client = 2\nmax_streams_per_client = 3\nmax_sandboxes_per_client = 5\nmax_buffered_per_session = \"1MiB\"\nmax_buffered_total = \"8MiB\"\nshutdown_grace = \"3s\"\n{SERVER}{CLIENT}"
    ));
    assert_eq!(
        c.limits,
        Limits {
            max_body: 1 << 20,
            max_concurrent: 4,
            rate_per_second: 10,
            burst: 20,
            header_timeout: Duration::from_secs(2),
            body_timeout: Duration::from_secs(60),
            max_sessions_per_client: 2,
            max_streams_per_client: 3,
            max_sandboxes_per_client: 5,
            max_buffered_per_session: 1 << 20,
            max_buffered_total: 8 << 20,
            shutdown_grace: Duration::from_secs(3),
        }
    );
}

#[test]
fn tls_paths_and_token_files_resolve_against_the_config_directory() {
    let c = ok(&format!(
        "[listen]\naddress = \"0.0.0.0:443\"\ntls = {{ cert = \"tls/cert.pem\", key = \"/keys/key.pem\" }}\n{SERVER}[[clients]]\nname = \"bob\"\ntoken = {{ from_file = \"./bob.token\" }}\n"
    ));
    let tls = c.listen.tls.unwrap();
    assert_eq!(tls.cert, PathBuf::from("/etc/mcpbox/tls/cert.pem"));
    assert_eq!(tls.key, PathBuf::from("/keys/key.pem"));
    assert_eq!(
        c.clients[0].token,
        Some(TokenSource::File("/etc/mcpbox/bob.token".into()))
    );
}

#[test]
fn plaintext_on_a_non_loopback_address_is_accepted_when_dangerously_allowed() {
    let c = ok(&format!(
        "[listen]\naddress = \"10.0.0.5:8787\"\ndangerously_allow_plaintext = true\n{SERVER}{CLIENT}"
    ));
    assert!(!c.listen.is_loopback());
    let c = ok(&format!(
        "[listen]\naddress = \"[::1]:9000\"\n{SERVER}{CLIENT}"
    ));
    assert!(c.listen.is_loopback());
}

#[test]
fn plain_http_to_a_loopback_upstream_is_accepted() {
    for url in [
        "http://127.0.0.1:9000/mcp",
        "http://127.1.2.3/mcp",
        "http://localhost:3000/mcp",
        "HTTP://LOCALHOST/mcp",
        "http://[::1]:8080/mcp",
        "https://[2001:db8::1]:8443/mcp?x=1",
    ] {
        let c = ok(&format!(
            "[[servers]]\nname = \"up\"\npolicy = \"up.toml\"\nurl = \"{url}\"\n{CLIENT}"
        ));
        assert_eq!(c.servers[0].upstream, Upstream::Url(url.into()));
    }
}

#[test]
fn allowed_hosts_and_origins_are_read_lowercased() {
    let c = ok(&format!(
        "[listen]\nallowed_hosts = [\"MCP.example.com\", \"mcp.example.com:8443\", \"[::1]:8787\"]\nallowed_origins = [\"https://App.example.com\", \"http://localhost:5173\"]\n{SERVER}{CLIENT}"
    ));
    assert_eq!(
        c.listen.allowed_hosts,
        ["mcp.example.com", "mcp.example.com:8443", "[::1]:8787"]
    );
    assert_eq!(
        c.listen.allowed_origins,
        ["https://app.example.com", "http://localhost:5173"]
    );
}

#[test]
fn client_server_lists_decide_what_a_client_may_use() {
    let c = ok(&format!(
        "{SERVER}[[servers]]\nname = \"db\"\npolicy = \"db.toml\"\ncommand = [\"db\"]\n{CLIENT}[[clients]]\nname = \"bob\"\ntoken = {{ from_env = \"BOB\" }}\nservers = [\"db\"]\n"
    ));
    let alice = c.client("alice").unwrap();
    let bob = c.client("bob").unwrap();
    assert!(c.may_use(alice, "fs") && c.may_use(alice, "db"));
    assert!(c.may_use(bob, "db") && !c.may_use(bob, "fs"));
    assert!(
        !c.may_use(alice, "nope"),
        "an unknown server is never usable"
    );
    let names: Vec<&str> = c.servers_for(bob).map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["db"]);
    assert!(c.client("carol").is_none() && c.server("nope").is_none());
}

#[test]
fn aggregated_tool_names_split_at_the_first_separator() {
    assert_eq!(tool_name("fs", "read_file"), "fs__read_file");
    assert_eq!(split_tool_name("fs__read_file"), Some(("fs", "read_file")));
    // a tool's own "__" stays in the tool part: server names cannot hold '_'
    assert_eq!(split_tool_name("fs__a__b"), Some(("fs", "a__b")));
    assert_eq!(split_tool_name("fs___x"), Some(("fs", "_x")));
    for bad in ["plain", "__x", "fs__", ""] {
        assert_eq!(split_tool_name(bad), None, "{bad:?}");
    }
}

// ---- unknown keys and types ----

#[test]
fn unknown_key_is_refused_with_the_valid_keys() {
    let d = refused(
        &format!("[listen]\naddres = \"127.0.0.1:1\"\n{SERVER}{CLIENT}"),
        "listen.addres",
        2,
        "address",
    );
    assert!(d.message.contains("unknown key"), "{d}");
    refused(
        &format!("{SERVER}{CLIENT}tokn = 1\n"),
        "clients[0].tokn",
        8,
        "valid keys here",
    );
    refused(
        &format!("{SERVER}comand = [\"x\"]\n{CLIENT}"),
        "servers[0].comand",
        5,
        "command",
    );
    refused(
        &format!("[limits]\nmax_bdy = \"1MiB\"\n{SERVER}{CLIENT}"),
        "limits.max_bdy",
        2,
        "max_body",
    );
    refused(
        &format!("{SERVER}[[clients]]\nname = \"a\"\ntoken = {{ from_envv = \"X\" }}\n"),
        "clients[0].token.from_envv",
        7,
        "from_env",
    );
}

#[test]
fn unknown_top_level_key_is_refused() {
    refused(
        &format!("[server]\nname = \"x\"\n{SERVER}{CLIENT}"),
        "server",
        1,
        "servers",
    );
}

#[test]
fn wrong_types_are_refused_with_the_expected_type() {
    refused(
        &format!("[limits]\nmax_body = 100\n{SERVER}{CLIENT}"),
        "limits.max_body",
        2,
        "MiB",
    );
    refused(
        &format!("[limits]\nheader_timeout = \"10\"\n{SERVER}{CLIENT}"),
        "limits.header_timeout",
        2,
        "60s",
    );
    refused(
        &format!(
            "[[servers]]\nname = \"fs\"\npolicy = \"fs.toml\"\ncommand = \"fs-server\"\n{CLIENT}"
        ),
        "servers[0].command",
        4,
        "list",
    );
}

#[test]
fn invalid_toml_reports_its_line_and_the_serve_docs() {
    let d = err("[listen\naddress = 1\n");
    assert_eq!(d.location.map(|l| l.line), Some(1));
    assert!(d.hint.unwrap_or_default().contains("docs/serve.md"));
}

// ---- names ----

#[test]
fn server_name_with_underscore_or_uppercase_is_refused() {
    for bad in ["my_fs", "FS", "fs.v2", "fs/x", "é"] {
        let text = format!(
            "[[servers]]\nname = \"{bad}\"\npolicy = \"p.toml\"\ncommand = [\"x\"]\n{CLIENT}"
        );
        refused(
            &text,
            "servers[0].name",
            2,
            "'_' keeps that split unambiguous",
        );
    }
}

#[test]
fn client_name_with_invalid_characters_is_refused() {
    refused(
        &format!("{SERVER}[[clients]]\nname = \"Alice Smith\"\ntoken = {{ from_env = \"A\" }}\n"),
        "clients[0].name",
        6,
        "a-z, 0-9 and '-'",
    );
}

#[test]
fn name_longer_than_64_characters_is_refused() {
    let long = "a".repeat(65);
    refused(
        &format!(
            "[[servers]]\nname = \"{long}\"\npolicy = \"p.toml\"\ncommand = [\"x\"]\n{CLIENT}"
        ),
        "servers[0].name",
        2,
        "1 to 64",
    );
    ok(&format!(
        "[[servers]]\nname = \"{}\"\npolicy = \"p.toml\"\ncommand = [\"x\"]\n{CLIENT}",
        "a".repeat(64)
    ));
}

#[test]
fn missing_or_empty_name_is_refused() {
    refused(
        &format!("[[servers]]\npolicy = \"p.toml\"\ncommand = [\"x\"]\n{CLIENT}"),
        "servers[0].name",
        1,
        "add name",
    );
    refused(
        &format!("{SERVER}[[clients]]\nname = \"\"\ntoken = {{ from_env = \"A\" }}\n"),
        "clients[0].name",
        6,
        "has no name",
    );
}

#[test]
fn duplicate_server_names_are_refused() {
    refused(
        &format!("{SERVER}{SERVER}{CLIENT}"),
        "servers[1].name",
        6,
        "also servers[0]",
    );
}

#[test]
fn duplicate_client_names_are_refused() {
    refused(
        &format!(
            "{SERVER}{CLIENT}[[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"OTHER\" }}\n"
        ),
        "clients[1].name",
        9,
        "also clients[0]",
    );
}

// ---- servers ----

#[test]
fn server_with_both_command_and_url_is_refused() {
    refused(
        &format!("[[servers]]\nname = \"x\"\npolicy = \"p.toml\"\ncommand = [\"x\"]\nurl = \"https://a.example/mcp\"\n{CLIENT}"),
        "servers[0].url",
        5,
        "not both",
    );
}

#[test]
fn server_with_neither_command_nor_url_is_refused() {
    refused(
        &format!("[[servers]]\nname = \"x\"\npolicy = \"p.toml\"\n{CLIENT}"),
        "servers[0].command",
        1,
        "neither command nor url",
    );
}

#[test]
fn empty_command_is_refused() {
    for cmd in ["[]", "[\"\"]"] {
        refused(
            &format!("[[servers]]\nname = \"x\"\npolicy = \"p.toml\"\ncommand = {cmd}\n{CLIENT}"),
            "servers[0].command",
            4,
            "needs a program",
        );
    }
}

#[test]
fn server_without_policy_is_refused() {
    refused(
        &format!("[[servers]]\nname = \"x\"\ncommand = [\"x\"]\n{CLIENT}"),
        "servers[0].policy",
        1,
        "add policy",
    );
}

#[test]
fn url_that_is_not_http_or_https_is_refused() {
    for (url, needle) in [
        ("ftp://a.example/mcp", "unsupported scheme"),
        ("tickets.internal/mcp", "not a URL"),
        ("https:///mcp", "no valid host"),
        ("https://a.example:99999/mcp", "invalid port"),
        ("https://a b/mcp", "space"),
        ("https://[::1/mcp", "no valid host"),
    ] {
        refused(
            &format!("[[servers]]\nname = \"x\"\npolicy = \"p.toml\"\nurl = \"{url}\"\n{CLIENT}"),
            "servers[0].url",
            4,
            needle,
        );
    }
}

#[test]
fn plain_http_to_a_remote_host_is_refused() {
    for url in [
        "http://tickets.internal/mcp",
        "http://10.0.0.1:80/mcp",
        "http://localhost.evil.example/mcp",
        "http://[2001:db8::1]/mcp",
    ] {
        refused(
            &format!("[[servers]]\nname = \"x\"\npolicy = \"p.toml\"\nurl = \"{url}\"\n{CLIENT}"),
            "servers[0].url",
            4,
            "use https://",
        );
    }
}

#[test]
fn url_with_credentials_is_refused() {
    refused(
        &format!("[[servers]]\nname = \"x\"\npolicy = \"p.toml\"\nurl = \"https://user:pw@a.example/mcp\"\n{CLIENT}"),
        "servers[0].url",
        4,
        "[secrets]",
    );
}

#[test]
fn url_that_parsers_read_differently_is_refused() {
    // the config checker ends with the strict reader decisions use
    // (crate::url): a backslash is '/' to a WHATWG parser
    for url in [
        "https://a.example/m\\\\cp",
        "https://a.example/?q=\\\\@b.example",
    ] {
        refused(
            &format!("[[servers]]\nname = \"x\"\npolicy = \"p.toml\"\nurl = \"{url}\"\n{CLIENT}"),
            "servers[0].url",
            4,
            "backslash",
        );
    }
}

// ---- clients ----

#[test]
fn client_with_token_and_anonymous_is_refused() {
    refused(
        &format!("{SERVER}{CLIENT}dangerously_allow_anonymous = true\n"),
        "clients[0].dangerously_allow_anonymous",
        8,
        "remove the token",
    );
}

#[test]
fn client_without_token_is_refused() {
    refused(
        &format!("{SERVER}[[clients]]\nname = \"a\"\n"),
        "clients[0].token",
        5,
        "token = { from_env",
    );
    refused(
        &format!("{SERVER}[[clients]]\nname = \"a\"\ndangerously_allow_anonymous = false\n"),
        "clients[0].token",
        5,
        "has no token",
    );
}

#[test]
fn token_with_two_sources_or_none_is_refused() {
    refused(
        &format!("{SERVER}[[clients]]\nname = \"a\"\ntoken = {{ from_env = \"A\", from_file = \"a.token\" }}\n"),
        "clients[0].token",
        7,
        "two sources",
    );
    refused(
        &format!("{SERVER}[[clients]]\nname = \"a\"\ntoken = {{}}\n"),
        "clients[0].token",
        7,
        "no source",
    );
}

#[test]
fn token_from_an_invalid_env_name_is_refused() {
    refused(
        &format!("{SERVER}[[clients]]\nname = \"a\"\ntoken = {{ from_env = \"1-BAD\" }}\n"),
        "clients[0].token.from_env",
        7,
        "environment",
    );
}

#[test]
fn same_token_for_two_clients_is_refused() {
    refused(
        &format!("{SERVER}{CLIENT}[[clients]]\nname = \"bob\"\ntoken = {{ from_env = \"ALICE_TOKEN\" }}\n"),
        "clients[1].token",
        10,
        "its own token",
    );
}

#[test]
fn anonymous_client_on_a_non_loopback_address_is_refused() {
    for address in ["0.0.0.0:8787", "10.0.0.5:8787", "[::]:8787"] {
        refused(
            &format!("[listen]\naddress = \"{address}\"\ntls = {{ cert = \"c.pem\", key = \"k.pem\" }}\n{SERVER}[[clients]]\nname = \"anon\"\ndangerously_allow_anonymous = true\n"),
            "clients[0].dangerously_allow_anonymous",
            10,
            "loopback",
        );
    }
}

#[test]
fn client_servers_naming_an_unknown_server_is_refused() {
    refused(
        &format!("{SERVER}{CLIENT}servers = [\"fs\", \"everything\"]\n"),
        "clients[0].servers[1]",
        8,
        "configured servers: fs",
    );
}

#[test]
fn client_servers_empty_or_repeated_is_refused() {
    refused(
        &format!("{SERVER}{CLIENT}servers = []\n"),
        "clients[0].servers",
        8,
        "leave servers out",
    );
    refused(
        &format!("{SERVER}{CLIENT}servers = [\"fs\", \"fs\"]\n"),
        "clients[0].servers[1]",
        8,
        "listed twice",
    );
}

#[test]
fn config_without_servers_is_refused() {
    let d = err(CLIENT);
    assert_eq!(d.key, "servers");
    assert!(d.hint.unwrap_or_default().contains("[[servers]]"));
}

#[test]
fn config_without_clients_is_refused() {
    let d = err(SERVER);
    assert_eq!(d.key, "clients");
    assert!(d.hint.unwrap_or_default().contains("[[clients]]"));
}

// ---- listen ----

#[test]
fn address_with_a_host_name_is_refused_suggesting_an_ip() {
    let d = refused(
        &format!("[listen]\naddress = \"localhost:9000\"\n{SERVER}{CLIENT}"),
        "listen.address",
        2,
        "\"127.0.0.1:9000\"",
    );
    assert!(d.message.contains("not an ip:port"), "{d}");
    refused(
        &format!("[listen]\naddress = \"mcp.example.com:8787\"\n{SERVER}{CLIENT}"),
        "listen.address",
        2,
        "host names are not resolved",
    );
    refused(
        &format!("[listen]\naddress = \"127.0.0.1\"\n{SERVER}{CLIENT}"),
        "listen.address",
        2,
        "no port",
    );
    refused(
        &format!("[listen]\naddress = \"::1:8787\"\n{SERVER}{CLIENT}"),
        "listen.address",
        2,
        "brackets",
    );
}

#[test]
fn non_loopback_address_without_tls_is_refused() {
    refused(
        &format!("[listen]\naddress = \"0.0.0.0:8787\"\n{SERVER}{CLIENT}"),
        "listen.address",
        2,
        "add tls",
    );
}

#[test]
fn tls_with_dangerously_allow_plaintext_is_refused() {
    refused(
        &format!("[listen]\naddress = \"0.0.0.0:8787\"\ntls = {{ cert = \"c.pem\", key = \"k.pem\" }}\ndangerously_allow_plaintext = true\n{SERVER}{CLIENT}"),
        "listen.dangerously_allow_plaintext",
        4,
        "remove dangerously_allow_plaintext",
    );
}

#[test]
fn tls_without_a_key_is_refused() {
    refused(
        &format!("[listen]\ntls = {{ cert = \"c.pem\" }}\n{SERVER}{CLIENT}"),
        "listen.tls",
        2,
        "key",
    );
}

#[test]
fn allowed_host_with_a_scheme_or_path_is_refused() {
    for bad in ["https://mcp.example.com", "mcp.example.com/mcp", "", "a b"] {
        refused(
            &format!("[listen]\nallowed_hosts = [\"{bad}\"]\n{SERVER}{CLIENT}"),
            "listen.allowed_hosts[0]",
            2,
            "no scheme, no path",
        );
    }
}

#[test]
fn allowed_origin_that_is_not_scheme_host_port_is_refused() {
    for bad in ["*", "app.example.com", "https://app.example.com/", "ws://x"] {
        refused(
            &format!("[listen]\nallowed_origins = [\"{bad}\"]\n{SERVER}{CLIENT}"),
            "listen.allowed_origins[0]",
            2,
            "scheme://host[:port]",
        );
    }
}

// ---- limits ----

#[test]
fn limit_of_zero_is_refused() {
    for (key, value) in [
        ("max_body", "\"0B\""),
        ("max_concurrent", "0"),
        ("rate_per_second", "0"),
        ("burst", "0"),
        ("header_timeout", "\"0s\""),
        ("body_timeout", "\"0ms\""),
        ("max_sessions_per_client", "0"),
        ("max_streams_per_client", "0"),
        ("max_sandboxes_per_client", "0"),
        ("max_buffered_per_session", "\"0B\""),
        ("max_buffered_total", "\"0B\""),
        ("shutdown_grace", "\"0s\""),
    ] {
        refused(
            &format!("[limits]\n{key} = {value}\n{SERVER}{CLIENT}"),
            &format!("limits.{key}"),
            2,
            "above 0",
        );
    }
}

// ---- tokens ----

#[test]
fn token_from_env_is_loaded_and_its_value_never_shown() {
    let var = "MCPBOX_SERVE_TEST_TOKEN_ENV";
    std::env::set_var(var, "s3cr3t-value\n");
    assert_eq!(TokenSource::Env(var.into()).load().unwrap(), "s3cr3t-value");
    std::env::set_var(var, "has space");
    let e = TokenSource::Env(var.into()).load().unwrap_err().to_string();
    assert!(
        e.contains("Authorization") && !e.contains("has space"),
        "{e}"
    );
    std::env::set_var(var, "");
    let e = TokenSource::Env(var.into()).load().unwrap_err();
    assert!(matches!(e, TokenError::Empty { .. }), "{e}");
    std::env::remove_var(var);
    let e = TokenSource::Env(var.into()).load().unwrap_err().to_string();
    assert!(e.contains("not set") && e.contains(var), "{e}");
}

#[test]
fn token_file_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("mcpbox-token-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.token");
    std::fs::write(&file, "tok-123\r\n").unwrap();
    let source = TokenSource::File(file.clone());

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        source.load().unwrap(),
        "tok-123",
        "one trailing newline trimmed"
    );

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = source.load().unwrap_err().to_string();
    assert!(e.contains("chmod 600") && !e.contains("tok-123"), "{e}");

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o620)).unwrap();
    assert!(matches!(source.load(), Err(TokenError::Exposed { .. })));

    std::fs::write(&file, "x".repeat(70_000)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(matches!(source.load(), Err(TokenError::TooLarge { .. })));

    std::fs::write(&file, "\n").unwrap();
    assert!(matches!(source.load(), Err(TokenError::Empty { .. })));

    let e = TokenSource::File(dir.clone()).load().unwrap_err();
    assert!(matches!(e, TokenError::NotAFile { .. }), "{e}");
    let e = TokenSource::File(dir.join("missing")).load().unwrap_err();
    assert!(matches!(e, TokenError::Read { .. }), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- the sandbox lifecycle: [idle], placement, [[templates]] ----

const TEMPLATE: &str =
    "[[templates]]\nname = \"py\"\nbase = \"templates/py\"\npolicy = \"py.toml\"\n";

#[test]
fn idle_defaults_are_pause_5m_stop_30m_never_destroy() {
    let c = ok(&format!("{SERVER}{CLIENT}"));
    let want = Idle {
        pause: Some(Duration::from_secs(300)),
        stop: Some(Duration::from_secs(1800)),
        destroy: None,
    };
    assert_eq!(c.idle, want);
    assert_eq!(Idle::default(), want);
    assert_eq!(c.servers[0].idle, want);
    assert_eq!(c.servers[0].placement, Placement::Sandbox);
    assert_eq!(c.servers[0].template, None);
    assert!(c.templates.is_empty());
}

#[test]
fn idle_is_read_with_units_and_off() {
    let c = ok(&format!(
        "[idle]\npause = \"1m\"\nstop = \"off\"\ndestroy = \"24h\"\n{SERVER}{CLIENT}"
    ));
    let want = Idle {
        pause: Some(Duration::from_secs(60)),
        stop: None,
        destroy: Some(Duration::from_secs(86_400)),
    };
    assert_eq!(c.idle, want);
    assert_eq!(c.servers[0].idle, want);
    let c = ok(&format!(
        "[idle]\npause = \"off\"\nstop = \"off\"\n{SERVER}{CLIENT}"
    ));
    assert_eq!(
        c.idle,
        Idle {
            pause: None,
            stop: None,
            destroy: None
        }
    );
}

#[test]
fn server_idle_replaces_the_default_key_by_key() {
    let c = ok(&format!(
        "[idle]\nstop = \"1h\"\ndestroy = \"7d\"\n{SERVER}idle = {{ pause = \"1m\" }}\n[[servers]]\nname = \"other\"\npolicy = \"o.toml\"\ncommand = [\"o\"]\nidle = {{ destroy = \"off\" }}\n{CLIENT}"
    ));
    assert_eq!(
        c.servers[0].idle,
        Idle {
            pause: Some(Duration::from_secs(60)),
            stop: Some(Duration::from_secs(3600)),
            destroy: Some(Duration::from_secs(7 * 86_400)),
        }
    );
    assert_eq!(
        c.servers[1].idle,
        Idle {
            pause: Some(Duration::from_secs(300)),
            stop: Some(Duration::from_secs(3600)),
            destroy: None,
        }
    );
}

#[test]
fn idle_out_of_order_is_refused_at_the_key_that_breaks_it() {
    // both written: the later one
    refused(
        &format!("[idle]\npause = \"10m\"\nstop = \"5m\"\n{SERVER}{CLIENT}"),
        "idle.stop",
        3,
        "pause < stop < destroy",
    );
    // against a default: the key written
    let d = refused(
        &format!("[idle]\ndestroy = \"10m\"\n{SERVER}{CLIENT}"),
        "idle.destroy",
        2,
        "stop is the default",
    );
    assert!(
        d.message.contains("destroy (10m) is not after stop (30m)"),
        "{d}"
    );
    refused(
        &format!("[idle]\npause = \"1h\"\n{SERVER}{CLIENT}"),
        "idle.pause",
        2,
        "pause < stop < destroy",
    );
    // equal is not after
    refused(
        &format!("[idle]\nstop = \"5m\"\n{SERVER}{CLIENT}"),
        "idle.stop",
        2,
        "is not after pause (5m)",
    );
    // with stop off, destroy still comes after pause
    refused(
        &format!("[idle]\npause = \"1h\"\nstop = \"off\"\ndestroy = \"30m\"\n{SERVER}{CLIENT}"),
        "idle.destroy",
        4,
        "is not after pause (1h)",
    );
    // a server's own key against the inherited [idle]
    refused(
        &format!("[idle]\nstop = \"1h\"\n{SERVER}idle = {{ pause = \"2h\" }}\n{CLIENT}"),
        "servers[0].idle.pause",
        7,
        "stop is inherited from [idle]",
    );
}

#[test]
fn idle_of_zero_or_a_bad_duration_is_refused() {
    refused(
        &format!("[idle]\npause = \"0s\"\n{SERVER}{CLIENT}"),
        "idle.pause",
        2,
        "\"off\"",
    );
    refused(
        &format!("[idle]\nstop = \"never\"\n{SERVER}{CLIENT}"),
        "idle.stop",
        2,
        "\"off\" for never",
    );
    refused(
        &format!("[idle]\npause = 300\n{SERVER}{CLIENT}"),
        "idle.pause",
        2,
        "\"5m\"",
    );
    refused(
        &format!("[idle]\npuase = \"1m\"\n{SERVER}{CLIENT}"),
        "idle.puase",
        2,
        "pause",
    );
    refused(
        &format!("{SERVER}idle = {{ stopp = \"1m\" }}\n{CLIENT}"),
        "servers[0].idle.stopp",
        5,
        "stop",
    );
}

#[test]
fn shared_placement_is_read() {
    let c = ok(&format!("{SERVER}placement = \"shared\"\n{CLIENT}"));
    assert_eq!(c.servers[0].placement, Placement::Shared);
    let c = ok(&format!("{SERVER}placement = \"sandbox\"\n{CLIENT}"));
    assert_eq!(c.servers[0].placement, Placement::Sandbox);
    refused(
        &format!("{SERVER}placement = \"outside\"\n{CLIENT}"),
        "servers[0].placement",
        5,
        "sandbox, shared",
    );
}

const URL_SERVER: &str =
    "[[servers]]\nname = \"tickets\"\nurl = \"https://tickets.internal/mcp\"\npolicy = \"t.toml\"\n";

#[test]
fn url_server_with_shared_placement_or_idle_is_refused() {
    refused(
        &format!("{URL_SERVER}placement = \"shared\"\n{CLIENT}"),
        "servers[0].placement",
        5,
        "no placement",
    );
    // the default, written out, is what every url server has
    let c = ok(&format!("{URL_SERVER}placement = \"sandbox\"\n{CLIENT}"));
    assert_eq!(c.servers[0].placement, Placement::Sandbox);
    refused(
        &format!("{URL_SERVER}idle = {{ pause = \"1m\" }}\n{CLIENT}"),
        "servers[0].idle",
        5,
        "no sandbox",
    );
}

#[test]
fn server_from_a_template_takes_its_policy() {
    let c = ok(&format!(
        "{TEMPLATE}[[templates]]\nname = \"snap\"\nsnapshot = \"/var/snap.tar.gz\"\npolicy = \"/p/s.toml\"\n[[servers]]\nname = \"py\"\ntemplate = \"py\"\ncommand = [\"/usr/bin/env\", \"python3\", \"/workspace/input/server.py\"]\n{CLIENT}"
    ));
    assert_eq!(
        c.templates,
        vec![
            Template {
                name: "py".into(),
                base: TemplateBase::Dir("/etc/mcpbox/templates/py".into()),
                policy: "/etc/mcpbox/py.toml".into(),
                ready: DEFAULT_READY,
            },
            Template {
                name: "snap".into(),
                base: TemplateBase::Snapshot("/var/snap.tar.gz".into()),
                policy: "/p/s.toml".into(),
                ready: DEFAULT_READY,
            }
        ]
    );
    let s = c.server("py").unwrap();
    assert_eq!(s.template.as_deref(), Some("py"));
    assert_eq!(s.policy, PathBuf::from("/etc/mcpbox/py.toml"));
    assert_eq!(c.template("snap").unwrap().name, "snap");
}

#[test]
fn a_template_says_how_many_workspaces_are_made_ahead_and_no_more_than_sixteen() {
    const SERVER: &str =
        "[[servers]]\nname = \"py\"\ntemplate = \"py\"\ncommand = [\"/bin/true\"]\n";
    let with = |ready: &str| format!("{TEMPLATE}{ready}{SERVER}{CLIENT}");
    assert_eq!(ok(&with("")).templates[0].ready, DEFAULT_READY);
    assert_eq!(ok(&with("ready = 0\n")).templates[0].ready, 0);
    assert_eq!(ok(&with("ready = 16\n")).templates[0].ready, 16);
    refused(&with("ready = 17\n"), "templates[0].ready", 5, "at most 16");
    // the effective config writes it out, and reads back the same
    let c = ok(&with("ready = 3\n"));
    let text = c.to_toml();
    assert!(text.contains("ready = 3"), "{text}");
    assert_eq!(ok(&text).templates[0].ready, 3);
}

#[test]
fn server_with_an_unknown_template_is_refused_with_the_known_names() {
    refused(
        &format!(
            "{TEMPLATE}[[servers]]\nname = \"a\"\ntemplate = \"pyy\"\ncommand = [\"x\"]\n{CLIENT}"
        ),
        "servers[0].template",
        7,
        "configured templates: py",
    );
    refused(
        &format!("[[servers]]\nname = \"a\"\ntemplate = \"py\"\ncommand = [\"x\"]\n{CLIENT}"),
        "servers[0].template",
        3,
        "no [[templates]] is configured",
    );
}

#[test]
fn server_with_both_policy_and_template_or_neither_is_refused() {
    refused(
        &format!("{TEMPLATE}{SERVER}template = \"py\"\n{CLIENT}"),
        "servers[0].template",
        9,
        "the template brings the policy",
    );
    refused(
        &format!("{TEMPLATE}[[servers]]\nname = \"a\"\ncommand = [\"x\"]\n{CLIENT}"),
        "servers[0].policy",
        5,
        "template = \"NAME\"",
    );
}

#[test]
fn url_server_with_a_template_is_refused() {
    refused(
        &format!("{TEMPLATE}[[servers]]\nname = \"t\"\nurl = \"https://t.internal/mcp\"\ntemplate = \"py\"\n{CLIENT}"),
        "servers[0].template",
        8,
        "remote server",
    );
}

#[test]
fn template_with_both_bases_or_none_is_refused() {
    refused(
        &format!("[[templates]]\nname = \"py\"\nbase = \"d\"\nsnapshot = \"s.tar.gz\"\npolicy = \"p.toml\"\n{SERVER}{CLIENT}"),
        "templates[0].snapshot",
        4,
        "exactly one of base",
    );
    refused(
        &format!("[[templates]]\nname = \"py\"\npolicy = \"p.toml\"\n{SERVER}{CLIENT}"),
        "templates[0].base",
        1,
        "exactly one of base",
    );
}

#[test]
fn template_without_policy_is_refused() {
    refused(
        &format!("[[templates]]\nname = \"py\"\nbase = \"d\"\n{SERVER}{CLIENT}"),
        "templates[0].policy",
        1,
        "add policy",
    );
}

#[test]
fn template_names_are_checked_and_unique() {
    refused(
        &format!(
            "[[templates]]\nname = \"Py_3\"\nbase = \"d\"\npolicy = \"p.toml\"\n{SERVER}{CLIENT}"
        ),
        "templates[0].name",
        2,
        "a-z, 0-9 and '-'",
    );
    refused(
        &format!("[[templates]]\nbase = \"d\"\npolicy = \"p.toml\"\n{SERVER}{CLIENT}"),
        "templates[0].name",
        1,
        "template has no name",
    );
    refused(
        &format!("{TEMPLATE}{TEMPLATE}{SERVER}{CLIENT}"),
        "templates[1].name",
        6,
        "also templates[0]",
    );
}

#[test]
fn template_paths_are_checked_like_other_paths() {
    refused(
        &format!(
            "[[templates]]\nname = \"py\"\nbase = \"~/t\"\npolicy = \"p.toml\"\n{SERVER}{CLIENT}"
        ),
        "templates[0].base",
        3,
        "not expanded",
    );
    refused(
        &format!(
            "[[templates]]\nname = \"py\"\nsnapshot = \"\"\npolicy = \"p.toml\"\n{SERVER}{CLIENT}"
        ),
        "templates[0].snapshot",
        3,
        "empty path",
    );
    refused(
        &format!("[[templates]]\nname = \"py\"\nbase = \"d\"\npolicy = \"p.toml\"\nsource = \"x\"\n{SERVER}{CLIENT}"),
        "templates[0].source",
        5,
        "snapshot",
    );
}

#[test]
fn lifecycle_keys_are_printed_and_round_trip() {
    let text = format!(
        "[idle]\ndestroy = \"24h\"\n{TEMPLATE}[[servers]]\nname = \"py\"\ntemplate = \"py\"\ncommand = [\"x\"]\nplacement = \"shared\"\nidle = {{ pause = \"1m\" }}\n{SERVER}{URL_SERVER}{CLIENT}"
    );
    let a = ok(&text);
    let printed = a.to_toml();
    let b = match ServeConfig::from_str(&printed, Path::new(FILE)) {
        Ok(b) => b,
        Err(d) => panic!("effective config does not parse:\n{d}\n---\n{printed}"),
    };
    assert_eq!(a, b);
    assert_eq!(printed, b.to_toml());
    for needle in [
        "[idle]\npause = \"5m\"\nstop = \"30m\"\ndestroy = \"1d\"\n",
        "template = \"py\"",
        "placement = \"shared\"",
        "placement = \"sandbox\"",
        "pause = \"1m\"",
        "base = \"/etc/mcpbox/templates/py\"",
        "policy = \"/etc/mcpbox/py.toml\"",
    ] {
        assert!(
            printed.contains(needle),
            "{needle:?} missing in:\n{printed}"
        );
    }
    // a server with the default idle does not repeat it; a url server has no placement
    assert_eq!(printed.matches("pause =").count(), 2, "{printed}");
    assert_eq!(printed.matches("placement =").count(), 2, "{printed}");
    let off = ok(&format!("[idle]\nstop = \"off\"\n{SERVER}{CLIENT}")).to_toml();
    assert!(off.contains("stop = \"off\"\ndestroy = \"off\""), "{off}");
}

#[test]
fn lifecycle_example_parses_as_documented() {
    let text = include_str!("../../../../examples/lifecycle/serve.toml");
    let c = ServeConfig::from_str(text, Path::new("/repo/examples/lifecycle/serve.toml"))
        .unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(
        c.idle,
        Idle {
            pause: Some(Duration::from_secs(300)),
            stop: Some(Duration::from_secs(1800)),
            destroy: Some(Duration::from_secs(86_400)),
        }
    );
    let notes = c.server("notes").unwrap();
    assert_eq!(notes.template.as_deref(), Some("notes"));
    assert_eq!(notes.placement, Placement::Sandbox);
    assert_eq!(notes.idle.pause, Some(Duration::from_secs(60)));
    assert_eq!(notes.idle.stop, c.idle.stop);
    assert_eq!(
        notes.policy,
        PathBuf::from("/repo/examples/lifecycle/notes.toml")
    );
    assert_eq!(
        c.template("notes").unwrap().base,
        TemplateBase::Dir("/repo/examples/lifecycle/template".into())
    );
}

// ---- printing, schema, detection ----

#[test]
fn effective_config_round_trips_with_defaults_filled_in() {
    let a = ok(ISSUE_EXAMPLE);
    let printed = a.to_toml();
    let b = match ServeConfig::from_str(&printed, Path::new(FILE)) {
        Ok(b) => b,
        Err(d) => panic!("effective config does not parse:\n{d}\n---\n{printed}"),
    };
    assert_eq!(a, b);
    assert_eq!(printed, b.to_toml());
    for needle in [
        "address = \"127.0.0.1:8787\"",
        "max_body = \"4MiB\"",
        "header_timeout = \"10s\"",
        "burst = 400",
        "policy = \"/etc/mcpbox/everything.toml\"",
        "from_env = \"ALICE_TOKEN\"",
        "dangerously_allow_anonymous = true",
    ] {
        assert!(
            printed.contains(needle),
            "{needle:?} missing in:\n{printed}"
        );
    }
}

#[test]
fn json_schema_covers_every_key() {
    let s = json_schema();
    let props = s["properties"].as_object().expect("properties");
    for section in ["listen", "limits", "clients", "servers"] {
        assert!(props.contains_key(section), "schema lacks {section}");
        assert!(props[section].get("description").is_some(), "{section}");
    }
    assert_eq!(s["additionalProperties"], serde_json::Value::Bool(false));
    assert!(!s.to_string().contains("null"), "toml has no null");
    let defs = &s["$defs"];
    // exactly one of command, url and builtin
    assert_eq!(defs["Server"]["oneOf"].as_array().map(Vec::len), Some(3));
    assert!(defs["Server"]["properties"]["builtin"]["description"].is_string());
    assert_eq!(defs["Token"]["oneOf"].as_array().map(Vec::len), Some(2));
    assert_eq!(defs["Client"]["oneOf"].as_array().map(Vec::len), Some(2));
    let required = defs["Server"]["required"].to_string();
    assert!(required.contains("name"), "{required}");
    // exactly one of policy and template
    assert_eq!(
        defs["Server"]["allOf"][0]["oneOf"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(defs["Template"]["oneOf"].as_array().map(Vec::len), Some(2));
    let required = defs["Template"]["required"].to_string();
    assert!(
        required.contains("name") && required.contains("policy"),
        "{required}"
    );
    for key in ["pause", "stop", "destroy"] {
        assert!(
            defs["Idle"]["properties"][key].get("description").is_some(),
            "{key}"
        );
    }
    let placements: Vec<&str> = defs["Placement"]["oneOf"]
        .as_array()
        .expect("one schema per placement")
        .iter()
        .filter_map(|v| v["const"].as_str())
        .collect();
    assert_eq!(placements, ["sandbox", "shared"]);
    for section in ["idle", "templates"] {
        assert!(props.contains_key(section), "schema lacks {section}");
        assert!(props[section].get("description").is_some(), "{section}");
    }
    let text = s.to_string();
    for needle in [
        "dangerously_allow_plaintext",
        "allowed_origins",
        "max_streams_per_client",
        "from_file",
        "^[a-z0-9-]+$",
    ] {
        assert!(text.contains(needle), "schema lacks {needle}");
    }
}

#[test]
fn serve_config_is_told_apart_from_a_policy() {
    // a policy has none of the serve config's top-level keys
    let policy = crate::json_schema();
    let policy_keys = policy["properties"].as_object().unwrap();
    for key in TOP_LEVEL_KEYS {
        assert!(!policy_keys.contains_key(key), "a policy has {key}");
    }
    assert!(is_serve_config(ISSUE_EXAMPLE));
    assert!(is_serve_config("[listen]\n"));
    assert!(is_serve_config("[[servers]]\nname = \"x\"\n"));
    assert!(!is_serve_config("[server]\nname = \"x\"\n[tools]\n"));
    assert!(!is_serve_config(""));
    assert!(!is_serve_config("[listen"));
}

#[test]
fn garbage_input_never_panics() {
    const PIECES: &[&str] = &[
        "[",
        "]",
        "[[",
        "]]",
        "=",
        "\"",
        "\n",
        "{",
        "}",
        ",",
        "é",
        "\u{0}",
        "[listen]",
        "[[clients]]",
        "[[servers]]",
        "[limits]",
        "address = ",
        "\"[::1\"",
        "\"localhost:\"",
        "url = ",
        "\"http://@\"",
        "\"https://[\"",
        "\"http://:0\"",
        "token = ",
        "{ from_env = \"\" }",
        "from_file = \"~\"",
        "command = []",
        "name = \"a\"",
        "policy = \"\"",
        "servers = [\"a\"]",
        "dangerously_allow_anonymous = true",
        "max_body = \"99999999999999999999TiB\"",
        "allowed_origins = [\"",
        "https://",
        "\"a__b\"",
        "[idle]",
        "[[templates]]",
        "pause = ",
        "\"off\"",
        "\"0s\"",
        "template = \"py\"",
        "placement = \"shared\"",
        "idle = { stop = \"1m\" }",
        "base = \"d\"",
        "snapshot = \"s\"",
    ];
    let mut rng = crate::tests::Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        let mut text = String::new();
        for _ in 0..rng.below(24) {
            text.push_str(PIECES[rng.below(PIECES.len())]);
            if rng.next() & 1 == 0 {
                text.push('\n');
            }
        }
        let _ = ServeConfig::from_str(&text, Path::new(FILE));
        let _ = is_serve_config(&text);
    }
}

#[test]
fn docs_example_is_the_issue_example_and_its_effective_config_is_printed() {
    let doc = include_str!("../../../../docs/serve.md");
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap_or(""))
        .collect();
    // the first two TOML blocks: the example and its effective config
    assert!(
        blocks.len() >= 2,
        "docs/serve.md has the example and its effective config"
    );
    assert_eq!(
        blocks[0].trim(),
        ISSUE_EXAMPLE.trim(),
        "the documented example is the issue's"
    );
    let c = ServeConfig::from_str(blocks[0], Path::new(FILE)).unwrap_or_else(|d| panic!("{d}"));
    assert!(
        c.to_toml().starts_with(blocks[1]),
        "docs/serve.md shows a stale effective config:\n{}",
        c.to_toml()
    );
}

#[test]
fn docs_lifecycle_example_parses() {
    let doc = include_str!("../../../../docs/serve.md");
    let section = doc
        .split("## Sandbox lifecycle")
        .nth(1)
        .expect("docs/serve.md has a Sandbox lifecycle section");
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a toml block");
    let c = ok(&format!("{block}{CLIENT}"));
    assert_eq!(c.idle.destroy, Some(Duration::from_secs(86_400)));
    let s = c.server("notebook").unwrap();
    assert_eq!(s.placement, Placement::Shared);
    assert_eq!(s.template.as_deref(), Some("py"));
    assert_eq!(s.policy, PathBuf::from("/etc/mcpbox/py.toml"));
    assert_eq!(s.idle.pause, Some(Duration::from_secs(60)));
    assert_eq!(s.idle.stop, Some(Duration::from_secs(1800)));
    // the refusals quoted there are the ones given
    let d = err(&format!(
        "[idle]\npause = \"10m\"\nstop = \"5m\"\n{SERVER}{CLIENT}"
    ));
    let flat = section.replace('\n', " ");
    assert!(flat.contains(&format!("{}: {}", d.key, d.message)), "{d}");
    let d = err(&format!(
        "[idle]\nstop = \"1h\"\n{SERVER}idle = {{ pause = \"2h\" }}\n{CLIENT}"
    ));
    let quoted = format!("{}: {}", d.key, d.message);
    assert!(flat.contains(&quoted), "{quoted} not quoted");
}
