//! The lifecycle's kernel mechanisms on the real kernel: a sandbox below a
//! cgroup parent is frozen and thawed as a whole, killed and removed
//! without leftovers, and keeps its tmp across launches with `tmp_dir`.
//!
//! This binary has its own `main` (`harness = false`): the in-process
//! [`spawn`] refuses a multi-threaded caller, and [`helper::spawn`]
//! re-executes this binary as the helper. Tests run one after the other;
//! arguments not starting with `-` filter them by name. A test that needs
//! root (to make cgroups) skips with a reason when not root, and fails
//! under `CI=true` instead (convention 9).

// A test binary without the harness: clippy's in-tests allowances do not
// reach it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use mcpbox_sandbox::cgroup::{Parent, Version};
use mcpbox_sandbox::{helper, spawn, Error, Limits, Sandbox, Spec, Stdio};

fn no_bridge(_: mcpbox_sandbox::BridgeSockets, _: &std::path::Path) -> std::io::Result<()> {
    Ok(())
}

fn spec(script: &str) -> Spec {
    Spec {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("HOME".into(), mcpbox_sandbox::HOME.into()),
        ],
        input: None,
        output: None,
        tmp_size: 1 << 20,
        mounts: Vec::new(),
        limits: Limits::default(),
        allow_exec: None,
        allow_degraded: false,
        stdio: Stdio::Piped,
        egress: None,
        tmp_dir: None,
        cgroup_parent: None,
    }
}

/// Whether this run may make cgroups; says why not, and fails under CI.
fn can_make_cgroups() -> bool {
    if mcpbox_sandbox::is_host_root() {
        return true;
    }
    let why = "not root: making cgroup parents needs root (or a delegated v2 subtree)";
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why}, and CI=true");
    }
    println!("    skipped: {why}");
    false
}

fn unique(tag: &str) -> String {
    format!("mcpbox-sb-test-{}-{tag}", std::process::id())
}

fn usage(parent: &Parent) -> Duration {
    parent.cpu_usage().expect("the parent has a cpu counter")
}

fn stop(mut sb: Sandbox) {
    sb.kill();
    let _ = sb.wait();
}

fn frozen_sandbox_uses_no_cpu_and_thaws_with_state_intact() {
    if !can_make_cgroups() {
        return;
    }
    for version in [Version::V2, Version::V1] {
        let name = unique(&format!("freeze-{version:?}").to_lowercase());
        let parent = Parent::create(&name, Some(version)).unwrap();
        assert_eq!(parent.version(), version);
        // Idempotent, and re-adopted on its own freezer whatever is preferred.
        assert_eq!(Parent::create(&name, None).unwrap(), parent);
        assert_eq!(Parent::open(&name).as_ref(), Some(&parent));
        assert!(Parent::list_names().contains(&name));
        // Counts to the counter file, so that thawing shows the loop went
        // on from where it was (state intact), not from the start.
        // (written beside and renamed, so a read never sees it half written)
        let script = "i=0; while :; do i=$((i+1)); [ $((i % 20000)) = 0 ] && echo $i > /workspace/tmp/n.new && mv /workspace/tmp/n.new /workspace/tmp/n; done";
        let tmp = tempfile::tempdir().unwrap();
        let counter = tmp.path().join("n");
        let count = || -> u64 {
            std::fs::read_to_string(&counter)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0)
        };
        let mut s = spec(script);
        s.cgroup_parent = Some(name.clone());
        s.tmp_dir = Some(tmp.path().to_path_buf());
        // v2 through the helper (the spec crosses wire.rs), v1 in-process.
        let sb = match version {
            Version::V2 => helper::spawn(&s).unwrap(),
            Version::V1 => spawn(&s).unwrap(),
        };
        // init (or its launch group's members), sh at least.
        std::thread::sleep(Duration::from_millis(300));
        assert!(parent.procs().len() >= 2, "{:?}", parent.procs());
        // the loop runs and is counted (on a loaded machine it may take a
        // while to get its CPU: waited for, not timed)
        let u0 = usage(&parent);
        let u1 = wait_for(|| {
            let u = usage(&parent);
            (u > u0 + Duration::from_millis(50) && count() > 0).then_some(u)
        })
        .unwrap_or_else(|| panic!("{version:?}: busy loop not counted from {u0:?}"));
        assert!(u1 > u0);

        parent.freeze().unwrap();
        assert!(parent.is_frozen());
        let (f0, n0) = (usage(&parent), count());
        std::thread::sleep(Duration::from_secs(2));
        let (f1, n1) = (usage(&parent), count());
        assert_eq!(n0, n1, "{version:?}: the loop counted while frozen");
        assert!(
            f1.saturating_sub(f0) < Duration::from_millis(5),
            "{version:?}: frozen yet used {:?}",
            f1 - f0
        );

        parent.thaw().unwrap();
        assert!(!parent.is_frozen());
        // Goes on counting from where it was: the same shell, not a new one.
        let t1 = wait_for(|| {
            let t = usage(&parent);
            (count() > n1 && t > f1 + Duration::from_millis(50)).then_some(t)
        })
        .unwrap_or_else(|| panic!("{version:?}: {} after thaw, {n1} before", count()));
        assert!(
            t1 > f1,
            "{version:?}: not running after thaw: {f1:?} -> {t1:?}"
        );
        assert!(
            n1 > 0,
            "{version:?}: the loop never reached its first count"
        );

        stop(sb);
        parent.kill_all().unwrap();
        parent.remove().unwrap();
        for dir in parent.dirs() {
            assert!(!dir.exists(), "{} left", dir.display());
        }
    }
}

fn killing_a_frozen_parent_leaves_no_process_and_no_group() {
    if !can_make_cgroups() {
        return;
    }
    for version in [Version::V2, Version::V1] {
        let name = unique(&format!("kill-{version:?}").to_lowercase());
        let parent = Parent::create(&name, Some(version)).unwrap();
        // A child that leaves the server's process group, too.
        let mut s = spec("setsid sleep 1000 & sleep 1000 & while :; do :; done");
        s.cgroup_parent = Some(name.clone());
        let mut sb = match version {
            Version::V2 => spawn(&s).unwrap(),
            Version::V1 => helper::spawn(&s).unwrap(),
        };
        std::thread::sleep(Duration::from_millis(300));
        let before = parent.procs();
        assert!(before.len() >= 4, "{version:?}: {before:?}");
        parent.freeze().unwrap();
        parent.kill_all().unwrap();
        assert!(parent.procs().is_empty(), "{:?}", parent.procs());
        for pid in before {
            // a killed process leaves its cgroup in do_exit a moment before
            // it is a zombie: wait (bounded) for that moment
            let gone =
                || !std::path::Path::new(&format!("/proc/{pid}/status")).exists() || is_zombie(pid);
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !gone() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(gone(), "{version:?}: pid {pid} alive");
        }
        let _ = sb.wait().unwrap();
        drop(sb);
        parent.remove().unwrap();
        for dir in parent.dirs() {
            assert!(!dir.exists(), "{} left", dir.display());
        }
        assert!(Parent::open(&name).is_none());
        assert!(!Parent::list_names().contains(&name));
    }
}

/// A pid of ours that is dead but not reaped yet (the init, our child).
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn read_stdout(mut sb: Sandbox) -> (String, i32) {
    let mut out = String::new();
    sb.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let code = sb.wait().unwrap().code();
    (out, code)
}

fn tmp_dir_survives_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let tmp: PathBuf = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut first = spec("echo kept > /workspace/tmp/file && cd && echo home > h && pwd");
    first.tmp_dir = Some(tmp.clone());
    let (out, code) = read_stdout(spawn(&first).unwrap());
    assert_eq!((out.trim(), code), (mcpbox_sandbox::HOME, 0));
    assert!(tmp.join("file").is_file() && tmp.join("home/h").is_file());

    let mut second = spec("cat /workspace/tmp/file $HOME/h && touch $HOME/again && echo ok");
    second.tmp_dir = Some(tmp.clone());
    let (out, code) = read_stdout(helper::spawn(&second).unwrap());
    assert_eq!((out.as_str(), code), ("kept\nhome\nok\n", 0));
    // Without tmp_dir, a fresh tmpfs: nothing of the above.
    let (out, _) = read_stdout(spawn(&spec("ls -A /workspace/tmp")).unwrap());
    assert_eq!(out.trim(), "home");
}

fn a_parent_name_that_climbs_out_of_the_hierarchy_is_refused() {
    for bad in ["../x", "mcpbox-sb-../../x", "mcpbox-sb-a/b", ""] {
        assert!(
            matches!(Parent::create(bad, None), Err(Error::CgroupParent { .. })),
            "{bad:?}"
        );
        assert!(Parent::open(bad).is_none());
        let mut s = spec("true");
        s.cgroup_parent = Some(bad.into());
        assert!(
            matches!(spawn(&s), Err(Error::CgroupParent { .. })),
            "{bad:?}"
        );
    }
    // A valid name that does not exist: the launch names it.
    let mut s = spec("true");
    let missing = unique("missing");
    s.cgroup_parent = Some(missing.clone());
    let err = helper::spawn(&s).unwrap_err().to_string();
    assert!(
        err.contains(&missing) && err.contains("does not exist"),
        "{err}"
    );
}

fn limits_outside_the_parents_hierarchies_still_apply() {
    if !can_make_cgroups() {
        return;
    }
    let name = unique("limits");
    let parent = Parent::create(&name, None).unwrap();
    let mut s = spec("sleep 1000");
    s.cgroup_parent = Some(name.clone());
    s.limits.memory = Some(64 << 20);
    let sb = spawn(&s).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pids = parent.procs();
    assert!(!pids.is_empty());
    // Every process of the parent is in a memory group of this launch with
    // the limit, wherever the memory controller lives.
    let layout = mcpbox_sandbox::cgroup::Layout::read();
    let (_, memory) = layout
        .locate(mcpbox_sandbox::cgroup::Controller::Memory)
        .unwrap();
    let launch = format!("mcpbox-{}", std::process::id());
    let limit = [memory.join(&launch), parent.dirs()[0].join(&launch)]
        .iter()
        .find_map(|d| {
            std::fs::read_to_string(d.join("memory.limit_in_bytes"))
                .or_else(|_| std::fs::read_to_string(d.join("memory.max")))
                .ok()
        });
    assert_eq!(limit.as_deref().map(str::trim), Some("67108864"));
    stop(sb);
    parent.kill_all().unwrap();
    parent.remove().unwrap();
}

/// A sandbox's init is born in its cgroup v2 group (clone3 with
/// CLONE_INTO_CGROUP, sys.rs) rather than moved there; its groups in the
/// other hierarchies (v1 memory and cpu on a hybrid host) it must still be
/// moved into. Every process of the sandbox, the init and its command, is
/// in each of them: none runs outside a limit or outside the group a
/// pause or a teardown acts on.
fn no_process_of_a_sandbox_born_in_its_v2_group_is_outside_another_of_its_groups() {
    if !can_make_cgroups() {
        return;
    }
    let name = unique("born");
    let parent = Parent::create(&name, Some(Version::V2)).unwrap();
    let s = limited_spec(&name);
    // in-process (the launch group is named after this process) and
    // through the helper (named after the helper)
    for through_helper in [false, true] {
        let sb = if through_helper {
            helper::spawn(&s).unwrap()
        } else {
            spawn(&s).unwrap()
        };
        assert_every_process_in_its_groups(&parent, &name);
        stop(sb);
    }
    parent.kill_all().unwrap();
    parent.remove().unwrap();
}

/// Where clone3 is refused (before Linux 5.3, or under a seccomp profile
/// such as Docker's default, which answers ENOSYS so that libc falls back
/// to clone), the init is cloned the old way and moved into every group,
/// its v2 one included. Run in a child of this test with such a filter
/// (the fork and the filter are the only unsafe code of these tests).
#[allow(unsafe_code)]
fn a_host_that_refuses_clone3_still_gets_every_process_into_its_groups() {
    if !can_make_cgroups() {
        return;
    }
    let name = unique("noclone3");
    let parent = Parent::create(&name, Some(Version::V2)).unwrap();
    let s = limited_spec(&name);
    // SAFETY: this test binary is single-threaded (harness = false); the
    // child runs the test and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            refuse_clone3();
            let sb = spawn(&s).unwrap();
            assert_every_process_in_its_groups(&parent, &name);
            stop(sb);
        })
        .is_ok();
        // SAFETY: leaves the forked child without the parent's atexit work
        unsafe { libc::_exit(i32::from(!ok)) }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the test failed in its child (status {status:#x}): see its panic above"
    );
    parent.kill_all().unwrap();
    parent.remove().unwrap();
}

/// A seccomp filter on this process: clone3 fails with ENOSYS, every
/// other call is let through (seccomp(2), as Docker's default profile).
#[allow(unsafe_code)]
fn refuse_clone3() {
    let nr = u32::try_from(libc::SYS_clone3).unwrap();
    let mut code = [
        // A = the system call's number
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: nr,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: code.len() as u16,
        filter: code.as_mut_ptr(),
    };
    // SAFETY: prctl(2) with a filter program that outlives the call
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            std::ptr::addr_of!(prog),
        )
    };
    assert_eq!(rc, 0, "seccomp: {}", std::io::Error::last_os_error());
    // SAFETY: the raw call, to see the filter answer
    let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::ENOSYS))
    );
}

/// A long-lived command below the cgroup parent `name`, with limits whose
/// controllers are v1 on a hybrid host.
fn limited_spec(name: &str) -> Spec {
    let mut s = spec("sleep 1000");
    s.cgroup_parent = Some(name.to_string());
    s.limits.memory = Some(64 << 20);
    s.limits.cpu = Some(0.5);
    s
}

/// Every process below `parent` (the init and its command at least) is
/// in its launch group in the v2 hierarchy and in each v1 hierarchy its
/// limits use.
fn assert_every_process_in_its_groups(parent: &Parent, name: &str) {
    let pids = wait_for(|| {
        let p = parent.procs();
        (p.len() >= 2).then_some(p)
    })
    .unwrap_or_else(|| panic!("init and sleep in the parent: {:?}", parent.procs()));
    let layout = mcpbox_sandbox::cgroup::Layout::read();
    for pid in pids {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if text.is_empty() {
            continue; // it ended meanwhile
        }
        let v2 = text.lines().find(|l| l.starts_with("0::")).unwrap();
        assert!(v2.contains(&format!("/{name}/mcpbox-")), "{pid}: {text}");
        for ctrl in [
            mcpbox_sandbox::cgroup::Controller::Memory,
            mcpbox_sandbox::cgroup::Controller::Cpu,
        ] {
            let Some((Version::V1, _)) = layout.locate(ctrl) else {
                continue; // on v2: the line checked above
            };
            let line = text
                .lines()
                .find(|l| {
                    l.split(':')
                        .nth(1)
                        .is_some_and(|c| c.split(',').any(|c| c == ctrl.name()))
                })
                .unwrap_or_else(|| panic!("{pid}: no {} line in {text}", ctrl.name()));
            assert!(
                line.contains("/mcpbox-"),
                "{pid} outside its {} group: {text}",
                ctrl.name()
            );
        }
    }
}

fn doctor_says_which_freezer_idle_pause_uses() {
    let checks = mcpbox_sandbox::doctor::run();
    let freezer = checks.iter().find(|c| c.name == "cgroup freezer").unwrap();
    if mcpbox_sandbox::is_host_root() {
        assert_eq!(
            freezer.level,
            mcpbox_sandbox::doctor::Level::Ok,
            "{freezer:?}"
        );
        assert!(freezer.detail.starts_with("v2") || freezer.detail.starts_with("v1"));
    } else if freezer.level != mcpbox_sandbox::doctor::Level::Ok {
        assert!(
            freezer.advice.contains("stopping the server"),
            "{freezer:?}"
        );
    }
}

/// Polls `f` every 20 ms for up to 20 s (a bound against a hang, not a
/// measure): its first `Some`.
fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    helper::enter_if_requested(no_bridge);
    let tests: &[(&str, fn())] = &[
        (
            "frozen_sandbox_uses_no_cpu_and_thaws_with_state_intact",
            frozen_sandbox_uses_no_cpu_and_thaws_with_state_intact,
        ),
        (
            "killing_a_frozen_parent_leaves_no_process_and_no_group",
            killing_a_frozen_parent_leaves_no_process_and_no_group,
        ),
        ("tmp_dir_survives_the_sandbox", tmp_dir_survives_the_sandbox),
        (
            "limits_outside_the_parents_hierarchies_still_apply",
            limits_outside_the_parents_hierarchies_still_apply,
        ),
        (
            "no_process_of_a_sandbox_born_in_its_v2_group_is_outside_another_of_its_groups",
            no_process_of_a_sandbox_born_in_its_v2_group_is_outside_another_of_its_groups,
        ),
        (
            "a_host_that_refuses_clone3_still_gets_every_process_into_its_groups",
            a_host_that_refuses_clone3_still_gets_every_process_into_its_groups,
        ),
        (
            "doctor_says_which_freezer_idle_pause_uses",
            doctor_says_which_freezer_idle_pause_uses,
        ),
        (
            "a_parent_name_that_climbs_out_of_the_hierarchy_is_refused",
            a_parent_name_that_climbs_out_of_the_hierarchy_is_refused,
        ),
    ];
    // The libtest command line, as far as `cargo test` and `cargo nextest`
    // use it: `--list [--format terse] [--ignored]` lists the tests
    // (`name: test` lines; none is ignored), `--exact NAME` runs exactly
    // that one, other words filter by substring, other flags are ignored.
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            for (name, _) in tests {
                println!("{name}: test");
            }
        }
        return;
    }
    let exact = args.iter().any(|a| a == "--exact");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected = |name: &str| {
        filters.is_empty()
            || filters.iter().any(|f| {
                if exact {
                    name == f.as_str()
                } else {
                    name.contains(f.as_str())
                }
            })
    };
    let mut failed = Vec::new();
    for (name, test) in tests {
        if !selected(name) {
            continue;
        }
        println!("test {name} ...");
        match std::panic::catch_unwind(test) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        println!("failed: {failed:?}");
        std::process::exit(1);
    }
}
