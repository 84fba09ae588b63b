//! `mcpbox check FILE...`: validate policies (files or `preset:NAME`), or
//! `mcpbox serve` configs and every policy they name, against the file
//! format and this host, and print each effective file. Every file is
//! checked and every failure reported, not only the first. Never runs
//! the policy's command (a gVisor policy starts a trivial sandbox: runsc
//! found is not runsc working).

use std::path::Path;
use std::process::ExitCode;

use mcpbox_policy::serve::{self, ServeConfig, Upstream};

use crate::preflight;

/// Which file format `--schema` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaKind {
    /// A sandbox policy (`mcpbox exec`, `mcpbox run`).
    Policy,
    /// The `mcpbox serve` config.
    Serve,
}

pub fn run(files: &[std::path::PathBuf], schema: Option<SchemaKind>) -> ExitCode {
    if let Some(kind) = schema {
        let schema = match kind {
            SchemaKind::Policy => mcpbox_policy::json_schema(),
            SchemaKind::Serve => serve::json_schema(),
        };
        match serde_json::to_string_pretty(&schema) {
            Ok(s) => {
                println!("{s}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("mcpbox: cannot render the schema: {e}");
                return ExitCode::from(1);
            }
        }
    }
    if files.is_empty() {
        eprintln!("mcpbox: check needs a policy file or a serve config");
        return ExitCode::from(2);
    }
    let failed: Vec<&Path> = files
        .iter()
        .filter(|f| !check_one(f))
        .map(|f| f.as_path())
        .collect();
    if failed.is_empty() {
        return ExitCode::SUCCESS;
    }
    if files.len() > 1 {
        let names: Vec<String> = failed.iter().map(|f| f.display().to_string()).collect();
        eprintln!(
            "mcpbox: {} of {} files failed the check: {}",
            failed.len(),
            files.len(),
            names.join(", ")
        );
    }
    ExitCode::from(1)
}

/// Checks one file, reporting on stderr; true when it passed.
fn check_one(file: &Path) -> bool {
    // A file that cannot be read is reported by the policy loader below.
    if std::fs::read_to_string(file).is_ok_and(|text| serve::is_serve_config(&text)) {
        return check_serve(file) == ExitCode::SUCCESS;
    }
    let loaded = match preflight::load(Some(file)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return false;
        }
    };
    // The same host checks `exec` makes, with a placeholder command.
    if let Err(e) = preflight::spec(&loaded, vec!["true".into()], mcpbox_sandbox::Stdio::Inherit) {
        eprintln!("mcpbox: {e}");
        return false;
    }
    // the gVisor tier: a trivial sandbox is started, the one thing check
    // runs, since runsc found is not runsc working (a platform refused)
    if loaded.policy.sandbox.isolation == mcpbox_policy::Isolation::Gvisor {
        if let Err(why) = crate::gvisor::probe() {
            eprintln!(
                "mcpbox: {}: sandbox.isolation = \"gvisor\" cannot run here: {why}\n  \
                 hint: see `mcpbox doctor`, or use isolation = \"namespaces\" (docs/isolation.md)",
                file.display()
            );
            return false;
        }
    }
    warn_policy(&loaded.policy, "");
    let extends = match &loaded.policy.extends {
        Some(base) => format!(", extends {base}"),
        None => String::new(),
    };
    println!(
        "# effective policy for {} (defaults filled in, paths resolved{extends})",
        file.display()
    );
    print!("{}", loaded.policy.to_toml());
    true
}

/// What is valid but may not be what the author meant, on stderr.
fn warn_policy(policy: &mcpbox_policy::Policy, prefix: &str) {
    for o in policy.network.overlaps() {
        eprintln!("mcpbox: warning: {prefix}{o}");
    }
    // What reaches outside the sandbox onto this machine, said whenever it
    // is asked for: a reviewer sees it without reading the TOML.
    for l in policy.network.local_summary() {
        eprintln!("mcpbox: note: {prefix}{l}");
    }
    for l in secrets_summary(policy) {
        eprintln!("mcpbox: {prefix}{l}");
    }
}

/// Ports whose usual protocol is not HTTP: a placeholder is swapped only in
/// HTTP requests, so a secret for such a port would never be added.
const NOT_HTTP_PORTS: &[(u16, &str)] = &[
    (21, "FTP"),
    (22, "SSH"),
    (25, "SMTP"),
    (110, "POP3"),
    (143, "IMAP"),
    (389, "LDAP"),
    (465, "SMTP"),
    (587, "SMTP"),
    (993, "IMAP"),
    (995, "POP3"),
    (1433, "SQL Server"),
    (3306, "MySQL"),
    (5432, "PostgreSQL"),
    (6379, "Redis"),
    (27017, "MongoDB"),
];

/// Which secrets stay outside the sandbox (and for which hosts), which
/// enter it, and why; a secret for a port whose protocol is not HTTP is a
/// warning (placeholders work in HTTP requests only).
fn secrets_summary(policy: &mcpbox_policy::Policy) -> Vec<String> {
    let mut out = Vec::new();
    for (name, secret) in &policy.secrets {
        if secret.hosts.is_empty() {
            out.push(format!(
                "note: secret {name} enters the sandbox: the server can read its value (it names no hosts; with hosts = [...] it would stay outside, docs/policy.md)"
            ));
            continue;
        }
        let hosts: Vec<String> = secret.hosts.iter().map(|h| h.canonical()).collect();
        out.push(format!(
            "note: secret {name} stays outside the sandbox: the server gets a placeholder, and the egress proxy puts the value in requests to {}",
            hosts.join(", ")
        ));
        for h in &secret.hosts {
            if let Some((port, proto)) = h
                .port
                .and_then(|p| NOT_HTTP_PORTS.iter().find(|(q, _)| *q == p))
            {
                out.push(format!(
                    "warning: secret {name}: port {port} is usually {proto}, not HTTP; a placeholder is replaced in HTTP(S) requests only, so this secret would never reach {}: leave hosts out for it",
                    h.canonical()
                ));
            }
        }
    }
    out
}

/// A serve config: the config itself, then each server's policy with the
/// checks a policy gets, then (as warnings: they may exist only where
/// `mcpbox serve` runs) the tokens and TLS files. Every problem is reported,
/// not only the first.
fn check_serve(file: &Path) -> ExitCode {
    let config = match ServeConfig::load(file) {
        Ok(c) => c,
        Err(d) => {
            eprintln!("mcpbox: {d}");
            eprintln!(
                "mcpbox: note: {} was read as an `mcpbox serve` config (it has a top-level listen, clients or servers key; a policy has none); see docs/serve.md",
                file.display()
            );
            return ExitCode::from(1);
        }
    };
    let mut failed = false;
    // every server's audit database counts for every server, as `serve`
    // checks them (a policy that does not load is reported below)
    let policies: Vec<mcpbox_policy::Policy> = config
        .servers
        .iter()
        .filter_map(|s| preflight::load(Some(&s.policy)).ok().map(|l| l.policy))
        .collect();
    let private = crate::state::private_locations(&policies);
    for (i, server) in config.servers.iter().enumerate() {
        let entry = format!("servers[{i}] ({})", server.name);
        let loaded = match preflight::load(Some(&server.policy)) {
            Ok(l) => l,
            Err(preflight::Error::Policy(d)) => {
                eprintln!("mcpbox: {entry}: policy {d}");
                failed = true;
                continue;
            }
            Err(e) => {
                eprintln!("mcpbox: {entry}: {e}");
                failed = true;
                continue;
            }
        };
        // A url server runs outside any sandbox: its policy's sandbox half
        // (filesystem, process limits) does not apply, so it is not checked
        // against this host.
        if let Upstream::Command(_) | Upstream::Builtin(_) = server.upstream {
            if let Err(e) = preflight::spec_among(
                &loaded,
                vec!["true".into()],
                mcpbox_sandbox::Stdio::Piped,
                &private,
            ) {
                eprintln!("mcpbox: {entry}: policy {e}");
                failed = true;
            }
        }
        warn_policy(&loaded.policy, &format!("{entry}: "));
    }
    for (i, t) in config.templates.iter().enumerate() {
        let (key, path, want_dir) = match &t.base {
            serve::TemplateBase::Dir(p) => ("base", p, true),
            serve::TemplateBase::Snapshot(p) => ("snapshot", p, false),
        };
        let ok = std::fs::metadata(path).is_ok_and(|m| m.is_dir() == want_dir);
        if !ok {
            let what = if want_dir { "a directory" } else { "a file" };
            eprintln!(
                "mcpbox: templates[{i}] ({}): {key}: {} is not {what}: make it, or fix the path",
                t.name,
                path.display()
            );
            failed = true;
        } else if want_dir {
            if let Err(e) = crate::state::refuse_private_base(path, &private) {
                eprintln!("mcpbox: templates[{i}] ({}): base: {e:#}", t.name);
                failed = true;
            }
        } else {
            // a snapshot template is checked whole, as restore would
            let limits = mcpbox_lifecycle::snapshot::Limits::default();
            if let Err(e) = mcpbox_lifecycle::snapshot::verify(path, &limits) {
                eprintln!("mcpbox: templates[{i}] ({}): snapshot: {e}", t.name);
                failed = true;
            }
        }
    }
    if failed {
        return ExitCode::from(1);
    }
    for (i, client) in config.clients.iter().enumerate() {
        if let Some(token) = &client.token {
            // The value is dropped unread: only whether it loads is reported.
            if let Err(e) = token.load() {
                eprintln!(
                    "mcpbox: warning: clients[{i}] ({}): {e} (mcpbox serve will refuse to start without it)",
                    client.name
                );
            }
        }
    }
    if let Some(tls) = &config.listen.tls {
        for (key, path) in [("cert", &tls.cert), ("key", &tls.key)] {
            if let Err(e) = std::fs::File::open(path) {
                eprintln!(
                    "mcpbox: warning: listen.tls.{key}: cannot read {}: {e}",
                    path.display()
                );
            }
        }
    }
    println!(
        "# effective serve config for {} (defaults filled in, paths resolved)",
        file.display()
    );
    print!("{}", config.to_toml());
    ExitCode::SUCCESS
}
