//! Running as root (issue 11): the caller's directories are shown through
//! idmapped mounts, so root's own 0700 directories work without a chmod and
//! what the server writes to output is root's, and the idmap grants nothing
//! more: read-only stays read-only, other users' files stay theirs, no
//! set-id bit can be set (a setuid file in output would be root's on the
//! host), and a filesystem without idmapped mounts gets the old clear error.
//!
//! Root-only: unprivileged, the sandbox user is the caller already and no
//! idmap is made. Each test says so when it is skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{assert_refused, assert_worked, is_root, mcpbox, Workspace};

/// True (and says why) when this run cannot test the root case.
fn skipped(test: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!(
        "{test}: skipped: idmapped mounts are made only when mcpbox runs as root \
         (unprivileged, the sandbox user maps to the caller)"
    );
    true
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `mcpbox exec` of a shell script inside the sandbox.
fn sh(policy: &Path, script: &str) -> Output {
    Command::new(mcpbox())
        .args(["exec", "--policy"])
        .arg(policy)
        .args(["--", "/bin/sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A private input (0700, a 0600 file, as root's own directories are) and
/// a private read-only extra mount next to it.
fn private_input(ws: &Workspace) -> std::path::PathBuf {
    std::fs::write(ws.input().join("secret.txt"), "root's own file\n").unwrap();
    chmod(&ws.input().join("secret.txt"), 0o600);
    chmod(&ws.input(), 0o700);
    let data = ws.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("table.csv"), "a,b\n").unwrap();
    chmod(&data.join("table.csv"), 0o600);
    chmod(&data, 0o700);
    ws.policy(&format!(
        "[[filesystem.mounts]]\nhost = \"{}\"\nat = \"/data\"\n",
        data.display()
    ))
}

#[test]
fn a_0700_root_owned_input_is_readable_without_chmod_as_root() {
    if skipped("a_0700_root_owned_input_is_readable_without_chmod_as_root") {
        return;
    }
    let ws = Workspace::new();
    let policy = private_input(&ws);
    // Before the idmap, `mcpbox exec` refused this policy ("not usable by
    // uid 65534"); now the probe in it runs and reads root's files.
    let line = ws.probe_line(&policy, &["read", "/workspace/input/secret.txt"]);
    assert_worked(&line);
    assert!(line.contains("root's own file"), "{line}");
    assert_worked(&ws.probe_line(&policy, &["read", "/data/table.csv"]));
    // Inside, root's files are the sandbox user's (uid 1000), and the
    // sandbox user is still host nobody: never host root.
    let out = sh(
        &policy,
        "id -u; stat -c %u:%g /workspace/input /workspace/input/secret.txt /data",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1000\n1000:1000\n1000:1000\n1000:1000\n",
        "{}",
        text(&out)
    );
    let status = ws.probe_line(&policy, &["status"]);
    assert!(status.contains("Uid:=1000=1000=1000=1000"), "{status}");
}

#[test]
fn idmapped_readonly_input_still_refuses_writes() {
    if skipped("idmapped_readonly_input_still_refuses_writes") {
        return;
    }
    let ws = Workspace::new();
    let policy = private_input(&ws);
    let before = std::fs::metadata(ws.input().join("hello.txt")).unwrap();
    // A new file, appending to a file that appears to be the sandbox
    // user's own, remounting read-write: all refused.
    assert_refused(&ws.probe_line(&policy, &["write", "/workspace/input/new.txt"]));
    assert_refused(&ws.probe_line(&policy, &["write", "/workspace/input/hello.txt"]));
    assert_refused(&ws.probe_line(&policy, &["write", "/data/table.csv"]));
    assert_refused(&ws.probe_line(&policy, &["remount-rw", "/workspace/input"]));
    assert_refused(&ws.probe_line(&policy, &["remount-rw", "/data"]));
    // The owner's privileges on its "own" files: chmod (setuid), chown,
    // touch; each needs a writable mount.
    for cmd in [
        "chmod 4755 /workspace/input/hello.txt",
        "chmod 777 /workspace/input",
        "chown 1000:1000 /workspace/input/secret.txt",
        "touch -d 2000-01-01 /workspace/input/hello.txt",
        "ln /workspace/input/hello.txt /workspace/input/link",
    ] {
        let out = sh(&policy, cmd);
        assert!(!out.status.success(), "{cmd} worked: {}", text(&out));
    }
    let after = std::fs::metadata(ws.input().join("hello.txt")).unwrap();
    assert_eq!(
        (after.mode(), after.uid(), after.mtime(), after.len()),
        (before.mode(), before.uid(), before.mtime(), before.len())
    );
    assert_eq!(
        std::fs::metadata(ws.input()).unwrap().mode() & 0o7777,
        0o700
    );
    assert!(!ws.input().join("new.txt").exists() && !ws.input().join("link").exists());
}

#[test]
fn files_of_other_host_users_in_an_idmapped_input_stay_theirs() {
    if skipped("files_of_other_host_users_in_an_idmapped_input_stay_theirs") {
        return;
    }
    let ws = Workspace::new();
    let policy = private_input(&ws);
    // Another user's private file, nobody's private file, and another
    // user's world-readable one.
    for (name, uid, mode) in [
        ("theirs.txt", 1001, 0o600),
        ("nobodys.txt", 65534, 0o600),
        ("public.txt", 1001, 0o644),
    ] {
        let p = ws.input().join(name);
        std::fs::write(&p, "not root's\n").unwrap();
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
        chmod(&p, mode);
    }
    // Only uid 0 is mapped: the others show as the overflow id, not as the
    // sandbox user (not even host nobody's file, which the sandbox user
    // owned through a plain bind), and only their "other" bits apply.
    let out = sh(
        &policy,
        "cd /workspace/input && stat -c %u:%g theirs.txt nobodys.txt public.txt",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "65534:65534\n65534:65534\n65534:65534\n",
        "{}",
        text(&out)
    );
    assert_refused(&ws.probe_line(&policy, &["read", "/workspace/input/theirs.txt"]));
    assert_refused(&ws.probe_line(&policy, &["read", "/workspace/input/nobodys.txt"]));
    assert_worked(&ws.probe_line(&policy, &["read", "/workspace/input/public.txt"]));
}

#[test]
fn files_the_server_writes_to_output_belong_to_the_caller_as_root() {
    if skipped("files_the_server_writes_to_output_belong_to_the_caller_as_root") {
        return;
    }
    // A root-owned private output, as root's own directories are: no
    // chmod, no chown to nobody, and what the server writes is root's.
    let ws = Workspace::new();
    std::os::unix::fs::chown(ws.output(), Some(0), Some(0)).unwrap();
    chmod(&ws.output(), 0o700);
    let policy = ws.policy("");
    let out = sh(
        &policy,
        "echo report > /workspace/output/r.md && mkdir /workspace/output/d && \
         echo x > /workspace/output/d/f && stat -c '%u' /workspace/output",
    );
    assert!(out.status.success(), "{}", text(&out));
    // inside, the output is the sandbox user's own
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1000",
        "{}",
        text(&out)
    );
    for f in ["r.md", "d", "d/f"] {
        let meta = std::fs::metadata(ws.output().join(f)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "{f}");
    }
    assert_eq!(
        std::fs::read_to_string(ws.output().join("r.md")).unwrap(),
        "report\n"
    );
}

#[test]
fn a_setuid_file_the_server_makes_in_output_is_never_setuid_on_the_host() {
    if skipped("a_setuid_file_the_server_makes_in_output_is_never_setuid_on_the_host") {
        return;
    }
    // Through the idmapped output this file is uid 0 on disk: with a
    // setuid bit it would be a root shell for any local user. Every way to
    // set the bit is refused (chmod, fchmod, a creation mode, mknod, mkdir).
    let ws = Workspace::new();
    std::os::unix::fs::chown(ws.output(), Some(0), Some(0)).unwrap();
    let policy = ws.policy("");
    let out = sh(
        &policy,
        "cp /bin/true /workspace/output/rootme; \
         chmod 6755 /workspace/output/rootme && echo chmod-ran; \
         chmod u+s /workspace/output/rootme && echo chmod-u+s-ran; \
         install -m 4755 /bin/true /workspace/output/installed && echo install-ran; \
         /usr/bin/python3 -c 'import os; fd = os.open(\"/workspace/output/created\", os.O_CREAT | os.O_WRONLY, 0o4755); print(\"open-ran\")'; \
         /usr/bin/python3 -c 'import os; os.mkdir(\"/workspace/output/sgid\", 0o2775); print(\"mkdir-ran\")'; \
         /usr/bin/python3 -c 'import os; fd = os.open(\"/workspace/output/rootme\", os.O_RDONLY); os.fchmod(fd, 0o4755); print(\"fchmod-ran\")'; \
         true",
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("-ran"),
        "a set-id mode was accepted: {}",
        text(&out)
    );
    let meta = std::fs::metadata(ws.output().join("rootme")).unwrap();
    assert_eq!(meta.uid(), 0, "the output is idmapped: the file is root's");
    assert_eq!(meta.mode() & 0o6000, 0, "{:o}", meta.mode());
    for f in ["installed", "created", "sgid"] {
        if let Ok(m) = std::fs::metadata(ws.output().join(f)) {
            assert_eq!(m.mode() & 0o6000, 0, "{f}: {:o}", m.mode());
        }
    }
    // And an output that is nobody's (not the caller's) is a plain bind,
    // used as host nobody; a private one of someone else's is refused
    // before anything starts, with the fix.
    std::os::unix::fs::chown(ws.output(), Some(1001), Some(1001)).unwrap();
    chmod(&ws.output(), 0o700);
    let out = sh(&policy, "true");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr.contains("filesystem.output") && stderr.contains("not usable by uid 65534"),
        "{stderr}"
    );
}

/// Runs `script` (which gets $MCPBOX and $DIR) in a private mount namespace
/// of the host where $DIR is a ramfs, a filesystem without idmapped mounts.
fn on_ramfs(ws: &Workspace, script: &str) -> Output {
    let dir = ws.path().join("ramfs");
    std::fs::create_dir(&dir).unwrap();
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "/bin/sh", "-ec"])
        .arg(format!("mount -t ramfs ramfs \"$DIR\"\n{script}"))
        .env("DIR", &dir)
        .env("MCPBOX", mcpbox())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn an_input_where_idmapped_mounts_are_refused_gets_the_clear_error_or_a_plain_bind() {
    if skipped("an_input_where_idmapped_mounts_are_refused_gets_the_clear_error_or_a_plain_bind") {
        return;
    }
    let ws = Workspace::new();
    let policy = ws.raw_policy(&format!(
        "[filesystem]\ninput = \"{}\"\n",
        ws.path().join("ramfs/in").display()
    ));
    let run = format!(
        "mkdir \"$DIR/in\"; echo on-ramfs > \"$DIR/in/f\"; chmod {{mode}} \"$DIR/in\"\n\
         exec \"$MCPBOX\" exec --policy {} -- /bin/cat /workspace/input/f",
        policy.display()
    );
    // Private: nobody cannot read it through a plain bind, so the launch
    // stops with the fix, naming the refused idmap.
    let out = on_ramfs(&ws, &run.replace("{mode}", "700"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr.contains("not usable by uid 65534")
            && stderr.contains("refused an idmapped mount")
            && stderr.contains("chmod o+rx"),
        "{stderr}"
    );
    // Readable by all: the plain bind of before, used as host nobody.
    std::fs::remove_dir(ws.path().join("ramfs")).unwrap();
    let out = on_ramfs(&ws, &run.replace("{mode}", "755"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "on-ramfs\n");
}
