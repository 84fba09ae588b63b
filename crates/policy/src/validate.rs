//! Checks that need the whole policy (ranges, cross-field rules, names) and the
//! lexical resolution of relative paths. No I/O: existence, symlinks and
//! credential folders behind symlinks are the binary's checks.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::credentials::credential_kind;
use crate::diagnostic::Diagnostic;
use crate::locate::{join, Locations};
use crate::model::{Policy, SecretSource};
use crate::network::normalize_name;

/// Largest allowed tmpfs: 64 GiB.
pub const MAX_TMP: u64 = 64 << 30;

/// What a validation step needs to point at a key and resolve a path: shared by
/// policies and `mcpbox serve` configs ([`crate::serve`]).
pub(crate) struct Ctx<'a> {
    pub(crate) file: &'a Path,
    pub(crate) locs: &'a Locations,
    /// The directory relative paths are resolved against.
    pub(crate) base: PathBuf,
    /// What the file is called in hints: "policy file", "config file".
    pub(crate) kind: &'static str,
}

impl Ctx<'_> {
    pub(crate) fn err(
        &self,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Diagnostic {
        Diagnostic::new(self.file, self.locs.get(key), key, message).with_hint(hint)
    }

    /// Checks a host path and makes it absolute against the file's directory.
    pub(crate) fn host_path(&self, key: &str, p: &Path) -> Result<PathBuf, Diagnostic> {
        let s = p.to_string_lossy();
        if s.is_empty() {
            return Err(self.err(
                key,
                "empty path",
                format!("write a path, absolute or relative to the {}", self.kind),
            ));
        }
        if s.contains('\0') {
            return Err(self.err(key, "path contains a NUL character", "write a plain path"));
        }
        if s.starts_with('~') {
            return Err(self.err(
                key,
                format!(
                    "\"{}\" starts with \"~\", which is not expanded",
                    s.escape_debug()
                ),
                format!(
                    "write an absolute path or one relative to the {}",
                    self.kind
                ),
            ));
        }
        Ok(resolve(&self.base, p))
    }
}

/// Joins `p` to `base` unless absolute and drops "." components. ".." is kept:
/// popping it lexically could disagree with the real path when a symlink is
/// involved, and the binary canonicalizes anyway.
pub(crate) fn resolve(base: &Path, p: &Path) -> PathBuf {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// True for a valid environment variable name.
pub(crate) fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 255
}

pub(crate) const ENV_NAME_HINT: &str =
    "an environment name is letters, digits and '_', not starting with a digit, e.g. \"LOG_LEVEL\"";
const LD_HINT: &str = "dynamic-loader variables (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, any LD_*) can inject code into every program in the sandbox and are refused";

/// `name` at `key` is a valid environment variable name (a variable read
/// from mcpbox's own environment, or one set in the sandbox).
pub(crate) fn check_valid_env_name(ctx: &Ctx, key: &str, name: &str) -> Result<(), Diagnostic> {
    if valid_env_name(name) {
        return Ok(());
    }
    Err(ctx.err(
        key,
        format!(
            "invalid environment variable name \"{}\"",
            name.escape_debug()
        ),
        ENV_NAME_HINT,
    ))
}

/// The variables mcpbox points at the sandbox's CA bundle when a secret
/// names `hosts` (its value stays outside; the proxy opens the TLS of
/// those hosts): what OpenSSL, Node, requests, curl, git and pip read.
pub const CA_VARIABLES: &[&str] = &[
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
];

/// The variables mcpbox sets to its egress proxy (crates/egress/src/env.rs,
/// whose test checks the two lists agree), but git's config variables,
/// which are merged.
pub const PROXY_VARIABLES: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "npm_config_proxy",
    "npm_config_https_proxy",
    "PIP_PROXY",
    "GLOBAL_AGENT_HTTP_PROXY",
    "NODE_USE_ENV_PROXY",
];

fn check_env_name(ctx: &Ctx, key: &str, name: &str) -> Result<(), Diagnostic> {
    check_valid_env_name(ctx, key, name)?;
    if name.starts_with("LD_") {
        return Err(ctx.err(key, format!("{name} is a dynamic-loader variable"), LD_HINT));
    }
    Ok(())
}

/// Checks a path inside the sandbox (absolute, no ".."), returning it normalized.
fn sandbox_path(ctx: &Ctx, key: &str, p: &Path) -> Result<(PathBuf, Vec<String>), Diagnostic> {
    let s = p.to_string_lossy();
    if !p.has_root() || s.contains('\0') {
        return Err(ctx.err(
            key,
            format!(
                "\"{}\" is not an absolute path inside the sandbox",
                s.escape_debug()
            ),
            "write an absolute path such as \"/data\"",
        ));
    }
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
            Component::ParentDir => {
                return Err(ctx.err(
                    key,
                    format!("\"{}\" contains \"..\"", s.escape_debug()),
                    "write the path without \"..\" components",
                ))
            }
            _ => {}
        }
    }
    let mut norm = PathBuf::from("/");
    norm.extend(&parts);
    Ok((norm, parts))
}

/// Relative paths are resolved against `base`: the file's directory, or for
/// a preset (text without a directory of its own) where it is used from.
pub(crate) fn validate_in(
    p: &mut Policy,
    file: &Path,
    base: &Path,
    locs: &Locations,
) -> Result<(), Diagnostic> {
    let base = base.to_path_buf();
    let ctx = Ctx {
        file,
        locs,
        base,
        kind: "policy file",
    };

    // [server]
    match &p.server.name {
        Some(name) => {
            let ok = !name.is_empty()
                && name.len() <= 64
                && !name.starts_with('.')
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !ok {
                return Err(ctx.err(
                    "server.name",
                    format!("invalid server name \"{}\"", name.escape_debug()),
                    "use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'",
                ));
            }
        }
        None => p.server.name = Some(name_from_file(file)),
    }

    // [filesystem]
    let fs = &mut p.filesystem;
    if let Some(input) = &fs.input {
        fs.input = Some(ctx.host_path("filesystem.input", input)?);
    }
    if let Some(output) = &fs.output {
        fs.output = Some(ctx.host_path("filesystem.output", output)?);
    }
    if fs.input.is_some() && fs.input == fs.output {
        return Err(ctx.err(
            "filesystem.output",
            "output is the same directory as input, which would make the input writable",
            "use a separate directory for output",
        ));
    }
    if fs.tmp == 0 || fs.tmp > MAX_TMP {
        return Err(ctx.err(
            "filesystem.tmp",
            "tmp size must be more than 0 and at most 64GiB",
            "e.g. tmp = \"256MiB\"",
        ));
    }
    let mut targets: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (i, m) in fs.mounts.iter_mut().enumerate() {
        let key = format!("filesystem.mounts[{i}]");
        m.host = ctx.host_path(&format!("{key}.host"), &m.host)?;
        let at_key = format!("{key}.at");
        let (at, parts) = sandbox_path(&ctx, &at_key, &m.at)?;
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let reserved = match parts.as_slice() {
            [] => Some("the sandbox root"),
            ["proc", ..] => Some("the sandbox's /proc"),
            ["dev", ..] => Some("the sandbox's /dev"),
            ["sys", ..] => Some("/sys"),
            ["workspace"] => Some("/workspace"),
            ["workspace", "input" | "output" | "tmp", ..] => Some("a workspace directory"),
            _ => None,
        };
        if let Some(what) = reserved {
            return Err(ctx.err(
                &at_key,
                format!("\"{}\" would cover {what}", m.at.display()),
                "mount somewhere else, e.g. at = \"/data\"; use filesystem.input/output for the workspace",
            ));
        }
        if let Some(first) = targets.insert(at.clone(), i) {
            return Err(ctx.err(
                &at_key,
                format!(
                    "\"{}\" is already the target of filesystem.mounts[{first}]",
                    at.display()
                ),
                "give each mount its own target",
            ));
        }
        m.at = at;
    }
    // credential locations recognisable from the path as written (the binary re-checks
    // after canonicalizing, which also catches symlinks)
    for (key, path) in [
        ("filesystem.input", fs.input.as_ref()),
        ("filesystem.output", fs.output.as_ref()),
    ] {
        if let Some(kind) = path.and_then(|p| credential_kind(p)) {
            return Err(ctx.err(
                key,
                format!("\"{}\" is or contains the credential location {kind}", path.map(|p| p.display().to_string()).unwrap_or_default()),
                "point it at a project directory; credential folders are only mountable through a [[filesystem.mounts]] entry with dangerously_allow_credentials = true",
            ));
        }
    }
    for (i, m) in fs.mounts.iter().enumerate() {
        if m.dangerously_allow_credentials {
            continue;
        }
        if let Some(kind) = credential_kind(&m.host) {
            return Err(ctx.err(
                &format!("filesystem.mounts[{i}].host"),
                format!("\"{}\" is or contains the credential location {kind}", m.host.display()),
                "mount a directory that holds no credentials, or set dangerously_allow_credentials = true on this mount",
            ));
        }
    }

    // [env]
    for (name, value) in &p.env.set {
        let key = join("env.set", name);
        check_env_name(&ctx, &key, name)?;
        if value.contains('\0') {
            return Err(ctx.err(
                &key,
                "value contains a NUL character",
                "environment values cannot hold NUL",
            ));
        }
    }
    // With egress on, mcpbox points programs at its proxy through these
    // variables (crates/egress/src/env.rs): one the policy also sets would
    // silently lose to it, or win over it. Git's config variables are the
    // exception: mcpbox appends its entry after the policy's.
    let network_on = !p.network.is_closed();
    let proxy_var = |name: &str| network_on && PROXY_VARIABLES.contains(&name);
    // and, with a secret kept outside, at the sandbox's CA bundle
    let keeps_out = p.secrets.values().any(|s| !s.hosts.is_empty());
    for name in p.env.set.keys().chain(p.env.pass.iter()) {
        if keeps_out && CA_VARIABLES.contains(&name.as_str()) {
            return Err(ctx.err(
                "env",
                format!("{name} is set by mcpbox to the sandbox's CA bundle when a secret names hosts"),
                "remove it: the bundle holds the system's roots and the sandbox's CA (the CA a policy trusts for a secret's hosts is its ca_file)",
            ));
        }
    }
    for name in p.env.set.keys() {
        if proxy_var(name) {
            return Err(ctx.err(
                &join("env.set", name),
                format!("{name} is set by mcpbox to its egress proxy when [network] allows anything"),
                "remove it: the proxy carries every connection the policy allows (git's GIT_CONFIG_* variables may be set: mcpbox adds its entry after them)",
            ));
        }
    }
    for (i, name) in p.env.pass.iter().enumerate() {
        let key = format!("env.pass[{i}]");
        check_env_name(&ctx, &key, name)?;
        if proxy_var(name) {
            return Err(ctx.err(
                &key,
                format!(
                    "{name} is set by mcpbox to its egress proxy when [network] allows anything"
                ),
                "remove it from env.pass: the proxy carries every connection the policy allows",
            ));
        }
        if p.env.set.contains_key(name) {
            return Err(ctx.err(
                &key,
                format!("{name} is both set and passed"),
                "keep it in env.set or in env.pass, not both",
            ));
        }
        if p.env.pass[..i].contains(name) {
            return Err(ctx.err(
                &key,
                format!("{name} is listed twice"),
                "list each name once",
            ));
        }
    }

    // [process]
    let pr = &p.process;
    if pr.pids == 0 || pr.pids > 65_536 {
        return Err(ctx.err(
            "process.pids",
            format!("pids {} is out of range", pr.pids),
            "use 1 to 65536, e.g. pids = 64",
        ));
    }
    if pr.memory == Some(0) {
        return Err(ctx.err(
            "process.memory",
            "memory limit is 0",
            "e.g. memory = \"512MiB\"; leave it out for no limit",
        ));
    }
    if let Some(cpu) = pr.cpu {
        if !cpu.is_finite() || cpu <= 0.0 || cpu > 1024.0 {
            return Err(ctx.err(
                "process.cpu",
                format!("cpu {cpu} is out of range"),
                "use cores more than 0 and at most 1024, e.g. cpu = 1.5",
            ));
        }
    }
    for (key, d) in [
        ("process.timeout", pr.timeout),
        ("process.call_timeout", pr.call_timeout),
    ] {
        if d.is_some_and(|d| d.is_zero()) {
            return Err(ctx.err(
                key,
                "timeout is 0",
                "e.g. \"60s\"; leave it out for no limit",
            ));
        }
    }
    let t = p.approvals.timeout;
    if t < std::time::Duration::from_secs(1) || t > std::time::Duration::from_secs(24 * 3600) {
        return Err(ctx.err(
            "approvals.timeout",
            format!("timeout {t:?} is out of range"),
            "use at least \"1s\" and at most \"24h\", e.g. \"10m\"",
        ));
    }
    if let Some(argv) = &p.approvals.notify {
        if argv.first().is_none_or(|a| a.is_empty()) || argv.iter().any(|a| a.contains('\0')) {
            return Err(ctx.err(
                "approvals.notify",
                "notify needs a program and no NUL byte",
                "e.g. notify = [\"notify-send\", \"--app-name=mcpbox\"], or leave it out",
            ));
        }
    }
    if p.output.approve_over == Some(0) {
        return Err(ctx.err(
            "output.approve_over",
            "approve_over is 0: every result would wait for a human",
            "e.g. \"256KiB\"; leave it out to hold no result for its size",
        ));
    }
    if let Some(list) = &pr.allow_exec {
        if list.is_empty() {
            return Err(ctx.err(
                "process.allow_exec",
                "empty allow_exec list would let nothing run, not even the command",
                "list the executables, e.g. [\"/usr/bin/node\"], or leave the key out",
            ));
        }
        let mut seen = Vec::new();
        for (i, exe) in list.iter().enumerate() {
            let (norm, _) = sandbox_path(&ctx, &format!("process.allow_exec[{i}]"), exe)?;
            seen.push(norm);
        }
        p.process.allow_exec = Some(seen);
    }

    // [network]
    let net = &p.network;
    for (i, d) in net.deny.iter().enumerate() {
        if net.allow.iter().any(|a| a.canonical() == d.canonical()) {
            return Err(ctx.err(
                &format!("network.deny[{i}]"),
                format!("\"{d}\" is both allowed and denied"),
                "remove it from network.allow (deny wins) or from network.deny",
            ));
        }
    }
    for (i, rule) in net.local.iter().enumerate() {
        if let Err(m) = crate::network::check_local_rule(rule) {
            return Err(ctx.err(
                &format!("network.local[{i}]"),
                format!("\"{rule}\" {m}"),
                "write the service's port on this machine, e.g. local = [\"localhost:8080\"]",
            ));
        }
    }
    for (name, ip) in &net.hosts {
        let key = join("network.hosts", name);
        if normalize_name(name).is_none() {
            return Err(ctx.err(
                &key,
                format!("invalid host name \"{}\"", name.escape_debug()),
                "write a host name such as \"internal.api\"",
            ));
        }
        if ip.is_unspecified()
            || ip.is_multicast()
            || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast())
        {
            return Err(ctx.err(
                &key,
                format!("{ip} is not a host address"),
                "map the name to the service's unicast address, e.g. \"10.1.2.3\"",
            ));
        }
    }

    // [secrets]
    for (name, secret) in &mut p.secrets {
        let key = join("secrets", name);
        check_env_name(&ctx, &key, name)?;
        if network_on && PROXY_VARIABLES.contains(&name.as_str()) {
            return Err(ctx.err(
                &key,
                format!(
                    "{name} is set by mcpbox to its egress proxy when [network] allows anything"
                ),
                "name the secret otherwise: the proxy carries every connection the policy allows",
            ));
        }
        if p.env.set.contains_key(name) || p.env.pass.contains(name) {
            return Err(ctx.err(
                &key,
                format!("{name} is both a secret and an env variable"),
                "remove it from [env]",
            ));
        }
        match &mut secret.source {
            SecretSource::Env(var) => {
                check_valid_env_name(&ctx, &format!("{key}.from_env"), var)?;
            }
            SecretSource::File(path) => *path = ctx.host_path(&format!("{key}.from_file"), path)?,
            SecretSource::Command(argv) => {
                if !matches!(argv.first(), Some(p) if !p.is_empty())
                    || argv.iter().any(|a| a.contains('\0'))
                {
                    return Err(ctx.err(
                        &format!("{key}.from_command"),
                        "from_command needs a program",
                        "write the program and its arguments, e.g. [\"op\", \"read\", \"op://vault/item\"]",
                    ));
                }
            }
        }
        if let Some(argv) = &secret.revoke {
            let revoke_key = format!("{key}.revoke");
            if argv.is_empty() {
                return Err(ctx.err(
                    &revoke_key,
                    "revoke is an empty command",
                    "write the program and its arguments, e.g. [\"gh\", \"auth\", \"logout\"] (it gets the value in MCPBOX_SECRET_VALUE), or leave revoke out",
                ));
            }
            if argv[0].is_empty() || argv.iter().any(|a| a.contains('\0')) {
                return Err(ctx.err(
                    &revoke_key,
                    "revoke needs a program",
                    "write the program and its arguments, e.g. [\"/usr/local/bin/revoke-token\"]; arguments cannot hold NUL",
                ));
            }
        }
        if secret.bodies && secret.hosts.is_empty() {
            return Err(ctx.err(
                &format!("{key}.bodies"),
                "bodies without hosts",
                "bodies = true lets the proxy put the value in request bodies to the secret's hosts: add hosts = [\"api.example.com\"], or leave bodies out",
            ));
        }
        if let Some(path) = &mut secret.ca_file {
            if secret.hosts.is_empty() {
                return Err(ctx.err(
                    &format!("{key}.ca_file"),
                    "ca_file without hosts",
                    "ca_file names the CA the proxy trusts for the secret's hosts: add hosts = [\"api.example.com\"], or leave ca_file out",
                ));
            }
            *path = ctx.host_path(&format!("{key}.ca_file"), path)?;
        }
        for (i, rule) in secret.hosts.iter().enumerate() {
            // The value goes only where [network] lets the sandbox go; a
            // host the policy refuses (or only asks about) would make a
            // secret nobody can use, or one a human approves unseen.
            let hosts_key = format!("{key}.hosts[{i}]");
            let (probe, port) = match &rule.pattern {
                crate::HostPattern::Name(n) => (n.clone(), rule.port.unwrap_or(443)),
                crate::HostPattern::Subdomains(suffix) => {
                    (format!("a.{suffix}"), rule.port.unwrap_or(443))
                }
                crate::HostPattern::Ip(_) | crate::HostPattern::Cidr(..) => return Err(ctx.err(
                    &hosts_key,
                    format!(
                        "\"{}\" is an address: a secret's hosts are names",
                        rule.canonical()
                    ),
                    "name the host (\"api.example.com\"); the proxy checks the TLS name against it",
                )),
            };
            if p.network.decide(&probe, port).verdict != crate::Verdict::Allow {
                return Err(ctx.err(
                    &hosts_key,
                    format!(
                        "{} is not allowed by [network]",
                        rule.canonical()
                    ),
                    "add the host to network.allow: a secret's hosts must be hosts the sandbox may reach",
                ));
            }
        }
        if secret.ttl.is_some_and(|t| t.is_zero()) {
            return Err(ctx.err(
                &format!("{key}.ttl"),
                "ttl is 0",
                "e.g. ttl = \"1h\"; leave it out to keep the value",
            ));
        }
    }

    // [upstream]
    check_upstream(&ctx, p)?;

    // [[tools.arguments]]
    check_argument_rules(&ctx, &mut p.tools.arguments.rules)?;

    // [commands]
    check_commands(&ctx, &p.commands)?;

    // [jobs]
    check_jobs(&ctx, &p.jobs)?;

    // [output]
    if p.output.max_result == 0 {
        return Err(ctx.err(
            "output.max_result",
            "max_result is 0",
            "e.g. max_result = \"1MiB\"",
        ));
    }
    if p.output.max_line < 1024 {
        return Err(ctx.err(
            "output.max_line",
            "max_line is below 1KiB",
            "e.g. max_line = \"16MiB\"",
        ));
    }

    // [artifacts]
    for (i, pattern) in p.artifacts.patterns.iter().enumerate() {
        let key = format!("artifacts.patterns[{i}]");
        if let Some((message, hint)) = crate::artifacts::check_pattern(pattern) {
            return Err(ctx.err(&key, message, hint));
        }
    }

    // [audit]
    if let Some(path) = &p.audit.path {
        p.audit.path = Some(ctx.host_path("audit.path", path)?);
    }

    // [[tests]]: last, against the fully validated policy
    for (i, example) in p.tests.iter().enumerate() {
        if let Err((suffix, message, hint)) = example.check(p) {
            let key = if suffix.is_empty() {
                format!("tests[{i}]")
            } else {
                format!("tests[{i}].{suffix}")
            };
            return Err(ctx.err(&key, message, hint));
        }
    }
    Ok(())
}

/// `[[tools.arguments]]`: a tool glob, an argument name, at least one
/// constraint, and sandbox directories that are absolute (normalised here).
fn check_argument_rules(
    ctx: &Ctx,
    rules: &mut [crate::arguments::ArgumentRule],
) -> Result<(), Diagnostic> {
    for (i, r) in rules.iter_mut().enumerate() {
        let key = format!("tools.arguments[{i}]");
        if let Err(m) = crate::tools::check_pattern(&r.tool) {
            return Err(ctx.err(
                &format!("{key}.tool"),
                m,
                "write a tool name or a glob over tool names (`*`, `?`), e.g. tool = \"write_*\"",
            ));
        }
        if r.argument.is_empty()
            || r.argument
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ctx.err(
                &format!("{key}.argument"),
                "not an argument name",
                "write the name of one top-level argument of the tool, e.g. argument = \"path\"",
            ));
        }
        let constrained =
            r.paths.is_some() || r.hosts.is_some() || r.one_of.is_some() || r.max_length.is_some();
        if !constrained && !r.not_a_path {
            return Err(ctx.err(
                &key,
                "the rule constrains nothing",
                "add paths, hosts, one_of or max_length (or not_a_path = true to keep the default path rule off this argument)",
            ));
        }
        if r.not_a_path && r.paths.is_some() {
            return Err(ctx.err(
                &format!("{key}.not_a_path"),
                "not_a_path = true and paths contradict each other",
                "leave not_a_path out: a rule with paths already replaces the default path rule for this argument",
            ));
        }
        if let Some(dirs) = r.paths.as_mut() {
            if dirs.is_empty() {
                return Err(ctx.err(
                    &format!("{key}.paths"),
                    "an empty list of directories refuses every value",
                    "list the sandbox directories the argument may name, e.g. paths = [\"/workspace/output\"]",
                ));
            }
            for (j, d) in dirs.iter_mut().enumerate() {
                let (norm, _) =
                    sandbox_path(ctx, &format!("{key}.paths[{j}]"), Path::new(d.as_str()))?;
                *d = norm.to_string_lossy().into_owned();
            }
        }
        if let Some(h) = &r.hosts {
            if h.is_empty() {
                return Err(ctx.err(
                    &format!("{key}.hosts"),
                    "an empty list of hosts refuses every value",
                    "list host patterns as in [network], e.g. hosts = [\"*.example.com\"]",
                ));
            }
        }
        if let Some(values) = &r.one_of {
            if values.is_empty() {
                return Err(ctx.err(
                    &format!("{key}.one_of"),
                    "an empty one_of refuses every value",
                    "list the values the argument may take, e.g. one_of = [\"staging\", \"prod\"]",
                ));
            }
            for (j, v) in values.iter().enumerate() {
                if !(v.is_string() || v.is_number() || v.is_boolean()) {
                    return Err(ctx.err(
                        &format!("{key}.one_of[{j}]"),
                        "one_of holds strings, numbers and booleans only",
                        "write each value as a string, number or boolean",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `[commands]`: declared arguments, the unparsed verdict, program names. Unknown
/// categories and verdicts are refused by deserialization.
fn check_commands(ctx: &Ctx, c: &crate::commands::CommandRules) -> Result<(), Diagnostic> {
    if c.unparsed == crate::Verdict::Allow {
        return Err(ctx.err(
            "commands.unparsed",
            "unparsed = \"allow\" would let through any command that cannot be classified",
            "write \"approve\" (ask a human, the default) or \"deny\"; a computed program name (`$CMD`) or `eval` must never pass unseen",
        ));
    }
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (list, args) in [
        ("commands.tools", &c.line_args),
        ("commands.argv_tools", &c.argv_args),
    ] {
        for (i, a) in args.iter().enumerate() {
            let key = format!("{list}[{i}]");
            let bad =
                |s: &str| s.is_empty() || s.chars().any(|ch| ch.is_whitespace() || ch.is_control());
            if bad(&a.tool) || bad(&a.argument) || a.argument.contains('.') {
                return Err(ctx.err(
                    &key,
                    "not a tool argument written \"tool.argument\"",
                    "write the tool's name, one '.', and the argument's name, e.g. \"run_shell.cmd\"; no whitespace",
                ));
            }
            if let Some(first) = seen.insert(a.to_string(), key.clone()) {
                return Err(ctx.err(
                    &key,
                    format!("{a} is already declared at {first}"),
                    "declare each argument once, in tools (a command line) or argv_tools (an argument vector)",
                ));
            }
        }
    }
    for name in c.programs.keys() {
        if name.is_empty()
            || name.contains('/')
            || name.chars().any(|ch| ch.is_whitespace() || ch.is_control())
        {
            return Err(ctx.err(
                &join("commands.programs", name),
                format!("invalid program name \"{}\"", name.escape_debug()),
                "write a program's basename, e.g. curl = \"deny\" (`/usr/bin/curl` is curl)",
            ));
        }
    }
    Ok(())
}

/// Longest `jobs.max_time`: 24 hours.
const MAX_JOB_TIME: Duration = Duration::from_secs(24 * 3600);
/// Longest `jobs.exec_timeout`: 1 hour.
const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(3600);
/// Largest `jobs.max_memory`: 1 TiB.
const MAX_JOB_MEMORY: u64 = 1 << 40;
/// Largest `jobs.max_output`: 16 MiB.
const MAX_EXEC_OUTPUT: u64 = 16 << 20;
/// Largest `jobs.job_output`: 256 MiB.
const MAX_JOB_OUTPUT: u64 = 256 << 20;

/// `[jobs]`: every limit more than 0 and bounded, so none can be switched off.
fn check_jobs(ctx: &Ctx, j: &crate::model::Jobs) -> Result<(), Diagnostic> {
    if j.max_running == 0 || j.max_running > 64 {
        return Err(ctx.err(
            "jobs.max_running",
            format!("max_running {} is out of range", j.max_running),
            "use 1 to 64, e.g. max_running = 4",
        ));
    }
    for (key, d, max, example) in [
        (
            "jobs.max_time",
            j.max_time,
            MAX_JOB_TIME,
            "max_time = \"10m\"; at most \"24h\"",
        ),
        (
            "jobs.exec_timeout",
            j.exec_timeout,
            MAX_EXEC_TIMEOUT,
            "exec_timeout = \"60s\"; at most \"1h\"",
        ),
    ] {
        if d.is_zero() || d > max {
            return Err(ctx.err(
                key,
                format!("{} is out of range", crate::units::format_duration(d)),
                format!("use more than 0, e.g. {example}"),
            ));
        }
    }
    for (key, size, max, example) in [
        (
            "jobs.max_memory",
            j.max_memory,
            MAX_JOB_MEMORY,
            "max_memory = \"512MiB\"; at most \"1TiB\"",
        ),
        (
            "jobs.max_output",
            j.max_output,
            MAX_EXEC_OUTPUT,
            "max_output = \"64KiB\"; at most \"16MiB\"",
        ),
        (
            "jobs.job_output",
            j.job_output,
            MAX_JOB_OUTPUT,
            "job_output = \"8MiB\"; at most \"256MiB\"",
        ),
    ] {
        if size == 0 || size > max {
            return Err(ctx.err(
                key,
                format!("{} is out of range", crate::units::format_size(size)),
                format!("use more than 0, e.g. {example}"),
            ));
        }
    }
    Ok(())
}

/// Headers the gateway sets itself on every upstream request, or that shape
/// the connection: a credential may not take their place.
const RESERVED_HEADERS: [&str; 13] = [
    "host",
    "content-type",
    "content-length",
    "accept",
    "connection",
    "transfer-encoding",
    "te",
    "upgrade",
    "keep-alive",
    "trailer",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

fn check_upstream(ctx: &Ctx, p: &Policy) -> Result<(), Diagnostic> {
    let u = &p.upstream;
    const EXAMPLE: &str =
        "e.g. header = \"Authorization\" and value = \"Bearer ${TICKETS_TOKEN}\", with TICKETS_TOKEN in [secrets]";
    let (header, value) = match (&u.header, &u.value) {
        (None, None) => return Ok(()),
        (Some(h), Some(v)) => (h, v),
        (None, Some(_)) => return Err(ctx.err("upstream.value", "value without header", EXAMPLE)),
        (Some(_), None) => return Err(ctx.err("upstream.header", "header without value", EXAMPLE)),
    };
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if header.is_empty() || !header.bytes().all(tchar) {
        return Err(ctx.err(
            "upstream.header",
            format!("\"{}\" is not an HTTP header name", header.escape_debug()),
            EXAMPLE,
        ));
    }
    let lower = header.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
        return Err(ctx.err(
            "upstream.header",
            format!("{header} is set by the gateway itself"),
            "name the header the upstream reads its credential from, such as Authorization or X-Api-Key",
        ));
    }
    let parts =
        crate::model::parse_value(value).map_err(|m| ctx.err("upstream.value", m, EXAMPLE))?;
    let mut secrets = 0;
    for part in &parts {
        match part {
            crate::model::ValuePart::Text(t) => {
                if !t.bytes().all(crate::model::header_value_byte) {
                    return Err(ctx.err(
                        "upstream.value",
                        "value holds a character an HTTP header cannot carry",
                        "use printable ASCII",
                    ));
                }
            }
            crate::model::ValuePart::Secret(name) => {
                if !p.secrets.contains_key(*name) {
                    return Err(ctx.err(
                        "upstream.value",
                        format!("${{{name}}} names no secret of [secrets]"),
                        format!("add {name} = {{ from_env = \"VAR\" }} (or from_file, from_command) to [secrets]"),
                    ));
                }
                secrets += 1;
            }
        }
    }
    if secrets == 0 {
        return Err(ctx.err(
            "upstream.value",
            "value names no secret",
            format!("a credential written into the policy file ends up in backups and reviews; {EXAMPLE}"),
        ));
    }
    Ok(())
}

/// A server name from the policy file's stem, with unusable characters
/// replaced (`mcpbox learn` names its proposal the same way).
pub fn name_from_file(file: &Path) -> String {
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    while name.starts_with('.') {
        name.remove(0);
    }
    if name.is_empty() {
        "policy".into()
    } else {
        name
    }
}
