//! Attacks on the sandbox of `mcpbox exec`, each run through the real
//! binary with the probe inside. They run as root and, in CI, again as an
//! ordinary user (scripts/test). Named after the attack they try.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_refused, assert_worked, is_root, mcpbox, refused_start, run, Workspace};

// ---- filesystem ----

#[test]
fn reading_host_file_by_absolute_path_fails() {
    let ws = Workspace::new();
    let secret = ws.path().join("host-secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    let p = ws.policy("");
    for path in [
        secret.to_str().unwrap(),
        "/etc/shadow",
        "/etc/sudoers",
        "/var/log/syslog",
        "/root/.bashrc",
    ] {
        let line = ws.probe_line(&p, &["read", path]);
        assert_refused(&line);
        assert!(!line.contains("top secret"));
    }
}

#[test]
fn symlink_in_input_cannot_reach_host_file() {
    let ws = Workspace::new();
    let secret = ws.path().join("host-secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    std::os::unix::fs::symlink(&secret, ws.input().join("abs-link")).unwrap();
    std::os::unix::fs::symlink("../host-secret.txt", ws.input().join("rel-link")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", ws.input().join("shadow-link")).unwrap();
    let p = ws.policy("");
    for link in ["abs-link", "rel-link", "shadow-link"] {
        let line = ws.probe_line(&p, &["read", &format!("/workspace/input/{link}")]);
        assert_refused(&line);
        assert!(!line.contains("top secret"), "{link}: {line}");
    }
}

#[test]
fn dotdot_from_input_cannot_reach_host() {
    let ws = Workspace::new();
    std::fs::write(ws.path().join("host-secret.txt"), "top secret").unwrap();
    let p = ws.policy("");
    let line = ws.probe_line(&p, &["read", "/workspace/input/../host-secret.txt"]);
    assert_refused(&line);
    let line = ws.probe_line(&p, &["read", "/workspace/input/../../../../../etc/shadow"]);
    assert_refused(&line);
}

#[test]
fn input_directory_is_readable() {
    let ws = Workspace::new();
    let line = ws.probe_line(&ws.policy(""), &["read", "/workspace/input/hello.txt"]);
    assert!(line.contains("hello from the host"), "{line}");
}

#[test]
fn root_home_and_host_tmp_are_not_visible() {
    let ws = Workspace::new();
    let p = ws.policy("");
    for dir in ["/root", "/home", "/run", "/var", "/sys", "/mnt", "/boot"] {
        assert_refused(&ws.probe_line(&p, &["list", dir]));
    }
    // /tmp is the sandbox's own tmp, empty but for HOME.
    let line = ws.probe_line(&p, &["list", "/tmp"]);
    assert_eq!(line, "ok home");
    // The test's own workspace (on the host's /tmp) is not reachable.
    assert_refused(&ws.probe_line(&p, &["list", ws.path().to_str().unwrap()]));
}

#[test]
fn only_the_minimal_dev_exists() {
    let ws = Workspace::new();
    let line = ws.probe_line(&ws.policy(""), &["list", "/dev"]);
    assert_eq!(
        line,
        "ok fd,full,null,random,shm,stderr,stdin,stdout,tty,urandom,zero"
    );
    assert_refused(&ws.probe_line(&ws.policy(""), &["read", "/dev/sda"]));
}

#[test]
fn etc_passwd_names_no_host_user() {
    let ws = Workspace::new();
    let line = ws.probe_line(&ws.policy(""), &["read", "/etc/passwd"]);
    assert_worked(&line);
    assert!(!line.contains("mcpbox-test"), "{line}");
    assert!(!line.contains("/root"), "{line}");
}

#[test]
fn credential_folder_as_input_is_refused() {
    let ws = Workspace::new();
    let ssh = ws.path().join("home/u/.ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    std::fs::write(ssh.join("id_rsa"), "PRIVATE").unwrap();
    let p = ws.raw_policy("[filesystem]\ninput = \"home/u/.ssh\"\n");
    let err = refused_start(&p);
    assert!(err.contains("policy.toml:2:"), "{err}");
    assert!(
        err.contains("filesystem.input") && err.contains(".ssh"),
        "{err}"
    );
}

#[test]
fn home_directory_containing_credentials_is_refused_as_mount() {
    let ws = Workspace::new();
    let home = ws.path().join("home/u");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    let p = ws.policy("[[filesystem.mounts]]\nhost = \"home/u\"\nat = \"/data\"\n");
    let err = refused_start(&p);
    assert!(
        err.contains("filesystem.mounts[0].host") && err.contains(".aws"),
        "{err}"
    );
}

#[test]
fn symlink_to_credential_folder_is_refused() {
    let ws = Workspace::new();
    std::fs::create_dir_all(ws.path().join("home/u/.kube")).unwrap();
    std::os::unix::fs::symlink(ws.path().join("home/u/.kube"), ws.path().join("innocent")).unwrap();
    let p = ws.raw_policy("[filesystem]\ninput = \"innocent\"\n");
    assert!(refused_start(&p).contains(".kube"));
}

#[test]
fn credential_override_mounts_read_only_when_asked_explicitly() {
    let ws = Workspace::new();
    let docker = ws.path().join("cfg/.docker");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::write(docker.join("config.json"), "{}").unwrap();
    std::fs::set_permissions(
        ws.path().join("cfg"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&docker, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        docker.join("config.json"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let p = ws.policy(
        "[[filesystem.mounts]]\nhost = \"cfg/.docker\"\nat = \"/data/docker\"\ndangerously_allow_credentials = true\n",
    );
    assert_worked(&ws.probe_line(&p, &["read", "/data/docker/config.json"]));
    assert_refused(&ws.probe_line(&p, &["write", "/data/docker/config.json"]));
}

#[test]
fn missing_input_directory_is_a_clear_error() {
    let ws = Workspace::new();
    let p = ws.raw_policy("[filesystem]\ninput = \"nope\"\n");
    let err = refused_start(&p);
    assert!(
        err.contains("policy.toml:2:") && err.contains("does not exist") && err.contains("hint:"),
        "{err}"
    );
}

#[test]
fn writing_to_input_fails() {
    let ws = Workspace::new();
    let p = ws.policy("");
    assert_refused(&ws.probe_line(&p, &["write", "/workspace/input/hello.txt"]));
    assert_refused(&ws.probe_line(&p, &["write", "/workspace/input/new.txt"]));
    assert_eq!(
        std::fs::read_to_string(ws.input().join("hello.txt")).unwrap(),
        "hello from the host\n"
    );
}

#[test]
fn writing_to_system_directories_fails() {
    let ws = Workspace::new();
    let p = ws.policy("");
    for path in [
        "/usr/bin/evil",
        "/etc/passwd",
        "/etc/evil",
        "/bin/evil",
        "/lib/evil",
        "/evil",
        "/workspace/evil",
    ] {
        assert_refused(&ws.probe_line(&p, &["write", path]));
    }
}

#[test]
fn remounting_input_read_write_is_refused() {
    let ws = Workspace::new();
    let p = ws.policy("");
    assert_refused(&ws.probe_line(&p, &["remount-rw", "/workspace/input"]));
    assert_refused(&ws.probe_line(&p, &["write", "/workspace/input/hello.txt"]));
}

#[test]
fn output_is_writable_and_lands_on_the_host() {
    let ws = Workspace::new();
    assert_worked(&ws.probe_line(&ws.policy(""), &["write", "/workspace/output/result.txt"]));
    assert_eq!(
        std::fs::read_to_string(ws.output().join("result.txt")).unwrap(),
        "probe\n"
    );
}

#[test]
fn setting_setuid_or_setgid_bits_on_output_files_is_refused() {
    // A set-id file left in output keeps its bits on the host, where it
    // runs as its owner (the caller, or root through a root run's
    // idmapped output): chmod, fchmod, install -m, a creation mode and
    // mkdir with a set-id bit are all refused (seccomp), as root and not
    let ws = Workspace::new();
    let script = "cp /bin/true /workspace/output/t; \
        chmod 4755 /workspace/output/t && echo chmod-ran; \
        chmod g+s /workspace/output/t && echo chmod-g+s-ran; \
        install -m 2755 /bin/true /workspace/output/i && echo install-ran; \
        /usr/bin/python3 -c 'import os; os.open(\"/workspace/output/c\", os.O_CREAT | os.O_WRONLY, 0o6755); print(\"open-ran\")'; \
        /usr/bin/python3 -c 'import os; os.mkdir(\"/workspace/output/d\", 0o2775); print(\"mkdir-ran\")'; \
        /usr/bin/python3 -c 'import os; os.fchmod(os.open(\"/workspace/output/t\", os.O_RDONLY), 0o4755); print(\"fchmod-ran\")'; \
        chmod 1777 /workspace/output/t && echo sticky-ok; chmod 755 /workspace/output/t && echo plain-ok";
    let out = Command::new(mcpbox())
        .args(["exec", "--policy"])
        .arg(ws.policy(""))
        .args(["--", "/bin/sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("-ran"),
        "a set-id mode was accepted:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("sticky-ok") && stdout.contains("plain-ok"),
        "{stdout}"
    );
    for f in ["t", "i", "c", "d"] {
        if let Ok(m) = std::fs::metadata(ws.output().join(f)) {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(m.mode() & 0o6000, 0, "{f}: {:o}", m.mode());
        }
    }
}

#[test]
fn a_read_lease_on_an_input_file_is_refused() {
    // a lease on a file the sandbox user owns (its own, or root's through
    // an idmapped input) would hold up a host writer of that file for
    // lease-break-time: seccomp refuses F_SETLEASE
    let ws = Workspace::new();
    let script = "import fcntl, os\n\
        fd = os.open('/workspace/input/hello.txt', os.O_RDONLY)\n\
        try:\n    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)\n    print('lease-taken')\n\
        except OSError as e:\n    print('refused', e.errno)\n";
    let out = Command::new(mcpbox())
        .args(["exec", "--policy"])
        .arg(ws.policy(""))
        .args(["--", "/usr/bin/python3", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("refused {}", libc::EPERM)),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn tmp_is_private_empty_and_size_limited() {
    let ws = Workspace::new();
    let p = ws.policy("tmp = \"1MiB\"\n");
    let out = Command::new(mcpbox())
        .args(["exec", "--policy", p.to_str().unwrap(), "--", "sh", "-c"])
        .arg("dd if=/dev/zero of=/workspace/tmp/big bs=1024 count=2048 2>/dev/null; echo rc=$?")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("rc=1"),
        "writing 2MiB into a 1MiB tmp must fail: {stdout}"
    );
    // A second sandbox starts with an empty tmp again.
    let line = ws.probe_line(&ws.policy(""), &["list", "/workspace/tmp"]);
    assert_eq!(line, "ok home");
}

#[test]
fn allow_exec_blocks_other_executables() {
    let ws = Workspace::new();
    let p = ws.policy("[process]\nallow_exec = [\"/workspace/input/probe\"]\n");
    let line = ws.probe_line(&p, &["exec", "/bin/true"]);
    assert_refused(&line);
    let line = ws.probe_line(&p, &["exec", "/workspace/input/probe", "exit", "0"]);
    assert_worked(&line);
}

// ---- allow_exec against launches without an execve of the program ----
//
// Issue 11 ("Exec allowlist that holds"): a program the list allows could
// start an unlisted one from an anonymous memory file, or through the
// dynamic loader, which maps a file with mmap (Landlock checks execve,
// not mmap). The probe is the allowed program; what it tries to start is
// a copy of itself, which the list does not name.

fn allow_only_the_probe(ws: &Workspace, extra: &str) -> std::path::PathBuf {
    ws.policy(&format!(
        "{extra}[process]\nallow_exec = [\"/workspace/input/probe\"]\n"
    ))
}

#[test]
fn allow_exec_refuses_a_memfd_launch_of_an_unlisted_program() {
    let ws = Workspace::new();
    let p = allow_only_the_probe(&ws, "");
    // execveat(fd, "", AT_EMPTY_PATH), /proc/self/fd/N, the loader given
    // /proc/self/fd/N; with no flags, MFD_NOEXEC_SEAL (which the loader
    // ignores: it maps, it does not execve) and MFD_EXEC. Landlock lets
    // every one of them through (a memfd is on an internal mount); the
    // seccomp filter refuses memfd_create under an allow list.
    for via in ["fd", "proc", "loader"] {
        for flags in ["0", "8", "16"] {
            let line = ws.probe_line(&p, &["memfd-exec", via, flags]);
            assert!(
                line.starts_with("err 38 memfd_create"),
                "{via} {flags}: {line}"
            );
        }
    }
    // Without a list the same launch runs: the refusal is the list's.
    let open = ws.policy("");
    assert_eq!(
        ws.probe_line(&open, &["memfd-exec", "fd", "0"]),
        "ok ran: memfd"
    );
}

#[test]
fn allow_exec_refuses_a_descriptor_launch_of_an_unlisted_file() {
    // The same routes for a file opened by path: execveat of an O_PATH
    // descriptor and /proc/self/fd/N are checked by Landlock as an execve
    // of the file is. The loader route is the Limitation of
    // loader_can_still_run_an_unlisted_read_only_system_program.
    let ws = Workspace::new();
    let p = allow_only_the_probe(&ws, "");
    for via in ["fd", "proc"] {
        let line = ws.probe_line(&p, &["fd-exec", via, "/usr/bin/id"]);
        assert!(line.starts_with("err 13 start"), "{via}: {line}");
    }
    // The listed probe runs that way.
    let line = ws.probe_line(&p, &["fd-exec", "fd", "/workspace/input/probe"]);
    assert_eq!(line, "ok ran: file");
}

#[test]
fn allow_exec_refuses_a_loader_launch_of_a_program_written_to_tmp() {
    let ws = Workspace::new();
    let p = allow_only_the_probe(&ws, "");
    for dst in [
        "/workspace/tmp/p",
        "/tmp/p",
        "/workspace/tmp/home/p",
        "/dev/shm/p",
    ] {
        let line = ws.probe_line(&p, &["plant-and-load", dst]);
        assert!(
            line.starts_with("err ") && line.contains("failed to map segment"),
            "{dst}: {line}"
        );
        // And execve of it, as before (Landlock, and noexec now too).
        assert_refused(&ws.probe_line(&p, &["exec", dst]));
    }
    // Without a list, programs written to tmp may run (scripts, builds).
    let open = ws.policy("");
    assert_eq!(
        ws.probe_line(&open, &["plant-and-load", "/workspace/tmp/p"]),
        "ok ran: planted"
    );
}

#[test]
fn allow_exec_refuses_a_loader_launch_of_a_program_in_output() {
    let ws = Workspace::new();
    let p = allow_only_the_probe(&ws, "");
    let line = ws.probe_line(&p, &["plant-and-load", "/workspace/output/p"]);
    assert!(
        line.starts_with("err ") && line.contains("failed to map segment"),
        "{line}"
    );
    // A program left in output by an earlier run (or by the host) too.
    assert!(ws.output().join("p").exists());
    let line = ws.probe_line(&p, &["loader", "/workspace/output/p", "say", "x"]);
    assert!(line.contains("failed to map segment"), "{line}");
}

#[test]
fn allow_exec_refuses_a_loader_launch_from_a_writable_mount_and_the_tmp_it_aliases() {
    // A writable mount below /tmp makes /tmp a second mount of the
    // sandbox's tmp (not the symlink): both must be noexec.
    let ws = Workspace::new();
    let cache = ws.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    if is_root() {
        std::os::unix::fs::chown(&cache, Some(65534), Some(65534)).unwrap();
    }
    let p = allow_only_the_probe(
        &ws,
        &format!(
            "[[filesystem.mounts]]\nhost = \"{}\"\nat = \"/tmp/cache\"\nmode = \"rw\"\n",
            cache.display()
        ),
    );
    for dst in ["/tmp/cache/p", "/tmp/p"] {
        let line = ws.probe_line(&p, &["plant-and-load", dst]);
        assert!(
            line.starts_with("err ") && line.contains("failed to map segment"),
            "{dst}: {line}"
        );
    }
    assert!(cache.join("p").exists(), "the mount is the host's");
}

#[test]
fn allow_exec_refuses_mapping_a_planted_library_as_code() {
    // What dlopen(3), LD_PRELOAD and Python's ctypes do with a library:
    // mmap it PROT_EXEC.
    let ws = Workspace::new();
    let p = allow_only_the_probe(&ws, "");
    for dst in [
        "/workspace/tmp/lib.so",
        "/dev/shm/lib.so",
        "/workspace/output/lib.so",
    ] {
        let line = ws.probe_line(&p, &["plant-and-map", dst]);
        assert!(line.starts_with("err 1 "), "{dst}: {line}");
    }
    let open = ws.policy("");
    assert_eq!(
        ws.probe_line(&open, &["plant-and-map", "/workspace/tmp/lib.so"]),
        "ok mapped executable"
    );
}

#[test]
fn loader_can_still_run_an_unlisted_read_only_system_program() {
    // Not closed (docs/threat-model.md, Limitations, "allow_exec and the
    // dynamic loader"): the loader must be executable for any listed
    // dynamically linked program to start, and it maps whatever readable
    // file it is given; /usr must be readable for the libraries. So an
    // unlisted program already on a read-only system mount runs through
    // it, while an execve of that program is refused.
    let ws = Workspace::new();
    let p = allow_only_the_probe(&ws, "");
    assert_refused(&ws.probe_line(&p, &["exec", "/usr/bin/id", "-u"]));
    assert_eq!(
        ws.probe_line(&p, &["loader", "/usr/bin/id", "-u"]),
        "ok ran: 1000"
    );
}

// ---- processes ----

#[test]
fn host_processes_are_invisible() {
    let ws = Workspace::new();
    let line = ws.probe_line(&ws.policy(""), &["pids"]);
    // Only the init (1) and the probe itself.
    assert_eq!(line, "ok 1,2");
}

#[test]
fn host_environment_does_not_leak() {
    let ws = Workspace::new();
    let p = ws.policy("[env]\nset = { GREETING = \"hi\" }\npass = [\"MCPBOX_TEST_PASSED\"]\n");
    let out = Command::new(mcpbox())
        .args([
            "exec",
            "--policy",
            p.to_str().unwrap(),
            "--",
            "/workspace/input/probe",
            "env",
        ])
        .env("MCPBOX_TEST_HOST_SECRET", "hunter2")
        .env("MCPBOX_TEST_PASSED", "yes")
        .env("LD_PRELOAD", "/tmp/evil.so")
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(!line.contains("hunter2"), "{line}");
    assert!(!line.contains("LD_PRELOAD"), "{line}");
    assert!(line.contains("GREETING=hi"), "{line}");
    assert!(line.contains("MCPBOX_TEST_PASSED=yes"), "{line}");
    assert!(line.contains("HOME=/workspace/tmp/home"), "{line}");
    let names: Vec<&str> = line
        .trim()
        .trim_start_matches("ok ")
        .split(' ')
        .filter_map(|kv| kv.split('=').next())
        .collect();
    for n in &names {
        assert!(
            [
                "PATH",
                "HOME",
                "LANG",
                "TERM",
                "GREETING",
                "MCPBOX_TEST_PASSED"
            ]
            .contains(n),
            "unexpected variable {n} in {line}"
        );
    }
}

#[test]
fn capabilities_are_dropped_and_no_new_privs_set() {
    let ws = Workspace::new();
    let line = ws.probe_line(&ws.policy(""), &["status"]);
    for want in [
        "CapInh:=0000000000000000",
        "CapPrm:=0000000000000000",
        "CapEff:=0000000000000000",
        "CapBnd:=0000000000000000",
        "CapAmb:=0000000000000000",
        "NoNewPrivs:=1",
        "Seccomp:=2",
    ] {
        assert!(line.contains(want), "missing {want} in {line}");
    }
    assert_refused(&ws.probe_line(&ws.policy(""), &["setuid0"]));
}

#[test]
fn mounting_is_refused() {
    let ws = Workspace::new();
    assert_refused(&ws.probe_line(&ws.policy(""), &["mount"]));
    assert_refused(&ws.probe_line(&ws.policy(""), &["chroot"]));
}

#[test]
fn tracing_is_refused() {
    let ws = Workspace::new();
    assert_refused(&ws.probe_line(&ws.policy(""), &["ptrace"]));
    assert_refused(&ws.probe_line(&ws.policy(""), &["ptrace-init"]));
}

#[test]
fn creating_namespaces_is_refused() {
    let ws = Workspace::new();
    let p = ws.policy("");
    for kind in ["user", "net", "mount", "pid"] {
        assert_refused(&ws.probe_line(&p, &["unshare", kind]));
    }
    assert_refused(&ws.probe_line(&p, &["clone-newuser"]));
    assert_refused(&ws.probe_line(&p, &["setns"]));
}

#[test]
fn io_uring_keyrings_bpf_perf_and_userfaultfd_are_refused() {
    let ws = Workspace::new();
    let p = ws.policy("");
    for action in [
        "io_uring",
        "keyctl",
        "bpf",
        "perf",
        "userfaultfd",
        "mknod",
        "sethostname",
    ] {
        assert_refused(&ws.probe_line(&p, &[action]));
    }
}

#[test]
fn terminal_injection_with_tiocsti_is_refused() {
    let ws = Workspace::new();
    assert_refused(&ws.probe_line(&ws.policy(""), &["tiocsti"]));
}

#[test]
fn killing_the_sandbox_init_from_inside_fails() {
    let ws = Workspace::new();
    assert_refused(&ws.probe_line(&ws.policy(""), &["kill-init"]));
}

// ---- limits ----

#[test]
fn exceeding_the_memory_limit_is_stopped() {
    let ws = Workspace::new();
    // Without cgroups (rootless here) the policy must accept rlimits.
    let degraded = if is_root() {
        ""
    } else {
        "[sandbox]\ndangerously_allow_degraded = true\n"
    };
    let p = ws.policy(&format!("[process]\nmemory = \"64MiB\"\n{degraded}"));
    let out = ws.probe(&p, &["alloc", "256"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("ok allocated 256"),
        "allocation beyond the limit succeeded: {stdout}"
    );
    if is_root() {
        assert_eq!(
            out.status.code(),
            Some(137),
            "the cgroup's OOM kill should end the probe"
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("process.memory"));
    }
}

#[test]
fn memory_limit_without_cgroup_is_refused_unless_degraded_accepted() {
    if is_root() {
        return; // root has cgroups here; the refusal path is the rootless one.
    }
    let ws = Workspace::new();
    let p = ws.policy("[process]\nmemory = \"64MiB\"\n");
    let err = refused_start(&p);
    assert!(
        err.contains("process.memory") && err.contains("cannot be enforced"),
        "{err}"
    );
}

#[test]
fn fork_bomb_stops_at_the_pids_limit() {
    let ws = Workspace::new();
    let p = ws.policy("[process]\npids = 16\n");
    let line = ws.probe_line(&p, &["fork", "200"]);
    assert_refused(&line);
    let forked: usize = line
        .split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .unwrap_or(999);
    assert!(forked < 16, "{line}");
}

#[test]
fn timeout_kills_a_sandbox_that_runs_too_long() {
    let ws = Workspace::new();
    let p = ws.policy("[process]\ntimeout = \"1s\"\n");
    let out = ws.probe(&p, &["sleep", "60"]);
    assert_eq!(out.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&out.stderr).contains("process.timeout"));
}

// ---- network ----

#[test]
fn host_loopback_services_are_unreachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let ws = Workspace::new();
    let line = ws.probe_line(&ws.policy(""), &["connect", &addr.to_string()]);
    assert_refused(&line);
}

#[test]
fn sandbox_loopback_works_inside() {
    let ws = Workspace::new();
    // python3 is on the host's /usr; it listens and connects inside.
    let out = Command::new(mcpbox())
        .args(["exec", "--policy", ws.policy("").to_str().unwrap(), "--", "python3", "-c"])
        .arg("import socket;s=socket.socket();s.bind(('127.0.0.1',0));s.listen();c=socket.create_connection(s.getsockname());print('connected')")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "connected",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- lifecycle ----

#[test]
fn exit_code_and_signal_death_pass_through() {
    let ws = Workspace::new();
    let p = ws.policy("");
    assert_eq!(ws.probe(&p, &["exit", "7"]).status.code(), Some(7));
    assert_eq!(ws.probe(&p, &["kill-self", "9"]).status.code(), Some(137));
    assert_eq!(ws.probe(&p, &["kill-self", "15"]).status.code(), Some(143));
    let out = run(&["exec", "--", "/no/such/command"]);
    assert_eq!(out.status.code(), Some(127));
}

#[test]
fn stdio_passes_through_untouched() {
    let ws = Workspace::new();
    let mut child = Command::new(mcpbox())
        .args([
            "exec",
            "--policy",
            ws.policy("").to_str().unwrap(),
            "--",
            "/workspace/input/probe",
            "cat",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let data: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = {
        let data = data.clone();
        std::thread::spawn(move || stdin.write_all(&data))
    };
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.stdout == data,
        "stdout differs from stdin ({} bytes back)",
        out.stdout.len()
    );
}

fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmdline).contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}

fn killing_mcpbox_leaves_nothing(signal: i32) {
    let ws = Workspace::new();
    let marker = format!(
        "marker-{}-{signal}-{}",
        std::process::id(),
        ws.path().display().to_string().len()
    );
    // The marker goes in argv, which every forked descendant keeps.
    let mut child = Command::new(mcpbox())
        .args([
            "exec",
            "--policy",
            ws.policy("").to_str().unwrap(),
            "--",
            "/workspace/input/probe",
            "spawn-tree",
            "60",
        ])
        .arg(&marker)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ok spawned");
    // mcpbox, the init, the probe, its 3 children and their 3 children:
    // the grandchildren are forked by the children after "ok spawned", so
    // they are waited for (on a loaded machine they may come late).
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).len() < 9 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        processes_with(&marker).len() >= 9,
        "the tree should be running: {:?}",
        processes_with(&marker)
    );
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_with(&marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        processes_with(&marker),
        Vec::<u32>::new(),
        "sandbox processes survived signal {signal}"
    );
}

#[test]
fn killing_mcpbox_with_sigkill_leaves_no_sandbox_process() {
    killing_mcpbox_leaves_nothing(9);
}

#[test]
fn killing_mcpbox_with_sigterm_leaves_no_sandbox_process() {
    killing_mcpbox_leaves_nothing(15);
}

#[test]
fn hostname_is_the_sandboxs_own() {
    let ws = Workspace::new();
    let out = Command::new(mcpbox())
        .args([
            "exec",
            "--policy",
            ws.policy("").to_str().unwrap(),
            "--",
            "hostname",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "mcpbox");
}

#[test]
fn default_policy_has_no_input_or_output_and_a_working_tmp() {
    let out = Command::new(mcpbox())
        .args([
            "exec",
            "--",
            "sh",
            "-c",
            "ls /workspace; echo x > /workspace/tmp/f && cat /workspace/tmp/f; pwd",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "tmp\nx\n/workspace\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- the degraded tier (no user namespaces) ----

/// Runs mcpbox where user namespaces are unavailable: inside an outer user
/// namespace whose `user.max_user_namespaces` is 0, so mcpbox's own
/// unshare fails with ENOSPC, as on a host that forbids them.
fn exec_without_userns(policy: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut script = String::from(
        "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" exec --policy \"$1\" --",
    );
    for i in 0..args.len() {
        script.push_str(&format!(" \"${}\"", i + 2));
    }
    Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c", &script])
        .arg(mcpbox())
        .arg(policy)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("unshare (util-linux) is needed for the degraded-tier tests")
}

#[test]
fn without_user_namespaces_a_policy_is_refused_unless_it_accepts_the_degraded_tier() {
    let ws = Workspace::new();
    let out = exec_without_userns(&ws.policy(""), &["true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("user namespaces") && err.contains("dangerously_allow_degraded"),
        "{err}"
    );
}

#[test]
fn degraded_tier_still_refuses_host_files_network_capabilities_and_syscalls() {
    let ws = Workspace::new();
    let secret = ws.path().join("host-secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    let p = ws.policy("[sandbox]\ndangerously_allow_degraded = true\n");
    let probe = ws.input().join("probe");
    let probe = probe.to_str().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let run = |args: &[&str]| {
        let mut all = vec![probe];
        all.extend_from_slice(args);
        let out = exec_without_userns(&p, &all);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            err.contains("degraded tier"),
            "mcpbox must say it runs degraded: {err}"
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_refused(&run(&["read", secret.to_str().unwrap()]));
    assert_refused(&run(&[
        "write",
        &ws.input().join("new").display().to_string(),
    ]));
    assert_refused(&run(&["write", "/usr/evil"]));
    assert_refused(&run(&["connect", &addr]));
    assert_refused(&run(&["unshare", "user"]));
    assert_refused(&run(&["ptrace"]));
    let status = run(&["status"]);
    for want in [
        "CapEff:=0000000000000000",
        "CapBnd:=0000000000000000",
        "NoNewPrivs:=1",
        "Seccomp:=2",
    ] {
        assert!(status.contains(want), "missing {want} in {status}");
    }
    assert!(
        run(&["read", &ws.input().join("hello.txt").display().to_string()])
            .contains("hello from the host")
    );
}

#[test]
fn degraded_tier_allow_exec_refuses_memfd_but_a_loader_launch_from_output_still_runs() {
    // Without a mount namespace there is no mount to make noexec: the
    // seccomp refusal of memfd_create holds, the loader route from a
    // writable host directory does not, and mcpbox says so on stderr
    // (docs/threat-model.md, Limitations, "Degraded tier").
    let ws = Workspace::new();
    let probe = ws.input().join("probe");
    let probe = probe.to_str().unwrap();
    let p = ws.policy(&format!(
        "[sandbox]\ndangerously_allow_degraded = true\n[process]\nallow_exec = [\"{probe}\"]\n"
    ));
    let run = |args: &[&str]| {
        let mut all = vec![probe];
        all.extend_from_slice(args);
        let out = exec_without_userns(&p, &all);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            err.contains("degraded tier") && err.contains("allow_exec in the degraded tier"),
            "mcpbox must say what allow_exec cannot hold here: {err}"
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for via in ["fd", "proc", "loader"] {
        let line = run(&["memfd-exec", via, "0"]);
        assert!(line.starts_with("err 38 memfd_create"), "{via}: {line}");
    }
    assert_refused(&run(&["exec", "/usr/bin/id"]));
    // Writable whoever the degraded tier runs as (here the outer
    // namespace's root, without capabilities).
    std::fs::set_permissions(
        ws.output(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let planted = ws.output().join("p");
    let line = run(&["plant-and-load", planted.to_str().unwrap()]);
    if host_mount_is_noexec(&ws.output()) {
        assert!(line.contains("failed to map segment"), "{line}");
    } else {
        assert_eq!(line, "ok ran: planted", "the limitation, as documented");
    }
}

/// Whether the host mounts `path`'s filesystem noexec (then the loader
/// cannot map a file there, in any tier).
fn host_mount_is_noexec(path: &std::path::Path) -> bool {
    let st = rustix::fs::statvfs(path).unwrap();
    st.f_flag.contains(rustix::fs::StatVfsMountFlags::NOEXEC)
}

#[test]
fn cpu_limit_is_written_to_the_sandboxs_cgroup() {
    if !is_root() {
        // Rootless here has no writable cgroup: the policy is refused
        // (check_refuses_a_limit_that_cannot_be_enforced_here).
        return;
    }
    let ws = Workspace::new();
    let p = ws.policy("[process]\ncpu = 0.5\nmemory = \"128MiB\"\n");
    let mut child = Command::new(mcpbox())
        .args([
            "exec",
            "--policy",
            p.to_str().unwrap(),
            "--",
            "/workspace/input/probe",
            "sleep",
            "5",
        ])
        .spawn()
        .unwrap();
    // mcpbox names the group after its pid, below its own group in each
    // hierarchy; find it and read what the kernel will enforce.
    let name = format!("mcpbox-{}", child.id());
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut quota = None;
    while quota.is_none() && Instant::now() < deadline {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        for line in own.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, ctrls, path) = (
                parts.next(),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            let candidates = [
                format!("/sys/fs/cgroup/cpu{path}/{name}/cpu.cfs_quota_us"),
                format!("/sys/fs/cgroup{path}/{name}/cpu.max"),
            ];
            if !(ctrls.is_empty() || ctrls.split(',').any(|c| c == "cpu")) {
                continue;
            }
            for c in candidates {
                if let Ok(v) = std::fs::read_to_string(&c) {
                    quota = Some(v.trim().to_string());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGTERM: mcpbox forwards it, the sandbox ends, and mcpbox removes its
    // cgroups on the way out.
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let _ = child.wait();
    let quota = quota.expect("the sandbox's cpu cgroup was not found");
    assert!(
        quota == "50000" || quota.starts_with("50000 "),
        "cpu quota {quota}, want half a core"
    );
}

#[test]
fn mount_at_the_same_path_below_tmp_works() {
    // Regression (CI clones under /tmp): tools mounted at their host path
    // below /tmp, as the interop tests mount their venv.
    let ws = Workspace::new();
    let data = ws.path().join("tooldir");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("tool.txt"), "tool").unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        data.join("tool.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let p = ws.policy(&format!(
        "[[filesystem.mounts]]\nhost = \"{0}\"\nat = \"{0}\"\n",
        data.display()
    ));
    let line = ws.probe_line(&p, &["read", &data.join("tool.txt").display().to_string()]);
    assert!(line.contains("tool"), "{line}");
    // /tmp stays the sandbox's writable tmp (programs' temp files go there).
    assert_worked(&ws.probe_line(&p, &["write", "/tmp/scratch"]));
    assert_refused(&ws.probe_line(&p, &["write", &data.join("evil").display().to_string()]));
}
