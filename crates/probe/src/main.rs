//! `mcpbox-probe ACTION [ARGS]`: run inside a sandbox by the integration
//! tests, tries one thing a hostile server might try, and prints one line:
//! `ok <detail>` when the attempt worked, `err <errno> <detail>` when the
//! kernel refused it. The tests decide what is expected.
//!
//! This is an attack tool for tests only, not part of mcpbox: it makes raw
//! system calls on purpose, so it is the one crate besides the sandbox that
//! may use `unsafe` (docs/conventions.md).
#![allow(unsafe_code)]
#![allow(clippy::undocumented_unsafe_blocks)]

use std::io::{Read, Write};
use std::time::Duration;

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn result(r: std::io::Result<String>) {
    match r {
        Ok(detail) => println!("ok {detail}"),
        Err(e) => println!("err {} {e}", e.raw_os_error().unwrap_or(0)),
    }
}

fn ret(v: libc::c_long) -> std::io::Result<String> {
    if v < 0 {
        Err(errno())
    } else {
        Ok(format!("returned {v}"))
    }
}

fn arg(args: &[String], i: usize) -> &str {
    args.get(i).map(String::as_str).unwrap_or("")
}

fn cstr(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s).unwrap_or_default()
}

/// The dynamic loader, run as a program: `ld.so FILE ARGS` maps FILE with
/// mmap and jumps to it, so FILE itself is never execve'd.
#[cfg(target_arch = "x86_64")]
const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
#[cfg(target_arch = "aarch64")]
const LOADER: &str = "/lib/ld-linux-aarch64.so.1";

/// Runs `cmd` with its output captured: `ok ran: <its first stdout line>`
/// when it exited 0, `err <errno> ...` when it could not be started, and
/// `err 1 ...` with its first stderr line when it failed (the loader
/// refusing to map a file says why there).
fn report_run(cmd: &mut std::process::Command) {
    match cmd.stdin(std::process::Stdio::null()).output() {
        Err(e) => println!("err {} start: {e}", e.raw_os_error().unwrap_or(0)),
        Ok(o) if o.status.success() => {
            let out = String::from_utf8_lossy(&o.stdout);
            println!("ok ran: {}", out.lines().next().unwrap_or(""));
        }
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            println!("err 1 {}: {}", o.status, err.lines().next().unwrap_or(""));
        }
    }
}

/// Copies this probe's own executable to `dst`, mode 0755: a program the
/// allow list does not name, planted where the sandbox can write.
fn plant(dst: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy("/proc/self/exe", dst)?;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o755))
}

/// An anonymous memory file (memfd_create(2) with `flags`) holding a copy
/// of this probe; not close-on-exec, so that a child can reach it as
/// /proc/self/fd/N.
fn memfd_with_self(flags: libc::c_uint) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let fd = unsafe { libc::syscall(libc::SYS_memfd_create, cstr("probe").as_ptr(), flags) };
    if fd < 0 {
        return Err(errno());
    }
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    let mut file = std::fs::File::from(fd.try_clone()?);
    std::io::copy(&mut std::fs::File::open("/proc/self/exe")?, &mut file)?;
    Ok(fd)
}

/// Starts the program open at `fd` with the argument `say WORD` through
/// `via`: `fd` execveat(fd, "", AT_EMPTY_PATH) (fexecve(3)), `proc`
/// execve of /proc/self/fd/N, `loader` the dynamic loader given
/// /proc/self/fd/N; reports as [`report_run`].
fn run_from_fd(fd: &std::os::fd::OwnedFd, via: &str, word: &'static str) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let raw = fd.as_raw_fd();
    let by_path = format!("/proc/self/fd/{raw}");
    let mut cmd = match via {
        "fd" => {
            let mut cmd = std::process::Command::new("/nonexistent");
            let argv = [cstr("probe"), cstr("say"), cstr(word)];
            // Runs in the child after stdio is set up: on success the child
            // becomes the descriptor's program, on failure spawning fails
            // with execveat's errno.
            unsafe {
                cmd.pre_exec(move || {
                    let ptrs = [
                        argv[0].as_ptr(),
                        argv[1].as_ptr(),
                        argv[2].as_ptr(),
                        std::ptr::null(),
                    ];
                    let env = [std::ptr::null::<libc::c_char>()];
                    libc::syscall(
                        libc::SYS_execveat,
                        raw,
                        c"".as_ptr(),
                        ptrs.as_ptr(),
                        env.as_ptr(),
                        libc::AT_EMPTY_PATH,
                    );
                    Err(errno())
                })
            };
            cmd
        }
        "proc" => {
            let mut cmd = std::process::Command::new(&by_path);
            cmd.args(["say", word]);
            cmd
        }
        _ => {
            let mut cmd = std::process::Command::new(LOADER);
            cmd.args([by_path.as_str(), "say", word]);
            cmd
        }
    };
    report_run(&mut cmd);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let action = arg(&args, 1);
    match action {
        "read" => result(std::fs::File::open(arg(&args, 2)).and_then(|mut f| {
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)?;
            Ok(format!(
                "{} bytes: {}",
                buf.len(),
                String::from_utf8_lossy(&buf[..buf.len().min(64)])
            ))
        })),
        "write" => result(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(arg(&args, 2))
                .and_then(|mut f| f.write_all(b"probe\n"))
                .map(|()| "written".into()),
        ),
        "list" => result(std::fs::read_dir(arg(&args, 2)).map(|rd| {
            let mut names: Vec<String> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.join(",")
        })),
        "exec" => result(
            std::process::Command::new(arg(&args, 2))
                .args(&args[3.min(args.len())..])
                .status()
                .map(|s| format!("status {s}")),
        ),
        // Prints its arguments: what a program the tests start prints to
        // show it ran.
        "say" => println!("{}", args[2.min(args.len())..].join(" ")),
        // `memfd-exec VIA FLAGS`: copies this probe into an anonymous memory
        // file made with FLAGS (0, MFD_NOEXEC_SEAL = 8, MFD_EXEC = 16) and
        // starts it, as a program the allow list does not name, through
        // VIA (see run_from_fd).
        "memfd-exec" => {
            let flags: libc::c_uint = arg(&args, 3).parse().unwrap_or(0);
            match memfd_with_self(flags) {
                Ok(fd) => run_from_fd(&fd, arg(&args, 2), "memfd"),
                Err(e) => println!("err {} memfd_create: {e}", e.raw_os_error().unwrap_or(0)),
            }
        }
        // `fd-exec VIA PATH`: the same launches of a file opened by path
        // (O_PATH for `fd`, as fexecve(3) allows, else read-only).
        "fd-exec" => {
            use std::os::unix::fs::OpenOptionsExt;
            let mut open = std::fs::OpenOptions::new();
            open.read(true);
            if arg(&args, 2) == "fd" {
                open.custom_flags(libc::O_PATH);
            }
            match open.open(arg(&args, 3)) {
                Ok(f) => run_from_fd(&std::os::fd::OwnedFd::from(f), arg(&args, 2), "file"),
                Err(e) => println!("err {} open: {e}", e.raw_os_error().unwrap_or(0)),
            }
        }
        // `loader PATH ARGS...`: the dynamic loader runs PATH.
        "loader" => report_run(
            std::process::Command::new(LOADER)
                .arg(arg(&args, 2))
                .args(&args[3.min(args.len())..]),
        ),
        // `plant-and-load DST`: plants a copy of this probe at DST and has
        // the dynamic loader run it.
        "plant-and-load" => match plant(arg(&args, 2)) {
            Err(e) => println!("err {} plant: {e}", e.raw_os_error().unwrap_or(0)),
            Ok(()) => report_run(std::process::Command::new(LOADER).args([
                arg(&args, 2),
                "say",
                "planted",
            ])),
        },
        // `plant-and-map DST`: plants a copy of this probe (an ELF file, as
        // a library is) at DST and maps it as code, as dlopen(3) and
        // Python's ctypes do.
        "plant-and-map" => {
            use std::os::fd::AsRawFd;
            let mapped = plant(arg(&args, 2))
                .and_then(|()| std::fs::File::open(arg(&args, 2)))
                .and_then(|f| {
                    let p = unsafe {
                        libc::mmap(
                            std::ptr::null_mut(),
                            4096,
                            libc::PROT_READ | libc::PROT_EXEC,
                            libc::MAP_PRIVATE,
                            f.as_raw_fd(),
                            0,
                        )
                    };
                    if p == libc::MAP_FAILED {
                        return Err(errno());
                    }
                    unsafe { libc::munmap(p, 4096) };
                    Ok("mapped executable".into())
                });
            result(mapped)
        }
        "status" => {
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let keep = [
                "CapInh",
                "CapPrm",
                "CapEff",
                "CapBnd",
                "CapAmb",
                "NoNewPrivs",
                "Seccomp:",
                "Uid",
                "Gid",
            ];
            let lines: Vec<String> = status
                .lines()
                .filter(|l| keep.iter().any(|k| l.starts_with(k)))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join("="))
                .collect();
            println!("ok {}", lines.join(" "));
        }
        "mount" => {
            let r = unsafe {
                libc::mount(
                    cstr("none").as_ptr(),
                    cstr("/workspace/tmp").as_ptr(),
                    cstr("tmpfs").as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            result(ret(r.into()))
        }
        "remount-rw" => {
            let r = unsafe {
                libc::mount(
                    std::ptr::null(),
                    cstr(arg(&args, 2)).as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_BIND,
                    std::ptr::null(),
                )
            };
            result(ret(r.into()))
        }
        "ptrace" => {
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                std::thread::sleep(Duration::from_secs(5));
                unsafe { libc::_exit(0) };
            }
            let r = unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) };
            let out = ret(r);
            unsafe { libc::kill(pid, libc::SIGKILL) };
            result(out)
        }
        "ptrace-init" => {
            let r = unsafe { libc::ptrace(libc::PTRACE_ATTACH, 1, 0, 0) };
            result(ret(r))
        }
        "unshare" => {
            let flag = match arg(&args, 2) {
                "user" => libc::CLONE_NEWUSER,
                "net" => libc::CLONE_NEWNET,
                "mount" => libc::CLONE_NEWNS,
                "pid" => libc::CLONE_NEWPID,
                _ => libc::CLONE_NEWUSER | libc::CLONE_NEWNS,
            };
            result(ret(unsafe { libc::unshare(flag) }.into()))
        }
        "clone-newuser" => {
            let r = unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
                    0,
                    0,
                    0,
                    0,
                )
            };
            if r == 0 {
                unsafe { libc::_exit(0) };
            }
            result(ret(r))
        }
        "setns" => {
            let fd = unsafe { libc::open(cstr("/proc/1/ns/net").as_ptr(), libc::O_RDONLY) };
            result(ret(unsafe { libc::setns(fd, 0) }.into()))
        }
        "io_uring" => {
            let mut params = [0u8; 120];
            result(ret(unsafe {
                libc::syscall(libc::SYS_io_uring_setup, 8u32, params.as_mut_ptr())
            }))
        }
        "keyctl" => {
            const KEY_SPEC_PROCESS_KEYRING: i32 = -2;
            result(ret(unsafe {
                libc::syscall(
                    libc::SYS_add_key,
                    cstr("user").as_ptr(),
                    cstr("probe").as_ptr(),
                    b"x".as_ptr(),
                    1usize,
                    KEY_SPEC_PROCESS_KEYRING,
                )
            }))
        }
        "bpf" => {
            let mut attr = [0u8; 128];
            result(ret(unsafe {
                libc::syscall(libc::SYS_bpf, 0, attr.as_mut_ptr(), attr.len())
            }))
        }
        "perf" => {
            let mut attr = [0u8; 128];
            attr[4..8].copy_from_slice(&128u32.to_le_bytes());
            result(ret(unsafe {
                libc::syscall(libc::SYS_perf_event_open, attr.as_mut_ptr(), 0, -1, -1, 0)
            }))
        }
        "userfaultfd" => result(ret(unsafe { libc::syscall(libc::SYS_userfaultfd, 0) })),
        "chroot" => result(ret(unsafe {
            libc::chroot(cstr("/workspace/tmp").as_ptr())
        }
        .into())),
        "setuid0" => result(ret(unsafe { libc::setuid(0) }.into())),
        "sethostname" => result(ret(unsafe {
            libc::sethostname(b"evil".as_ptr().cast(), 4)
        }
        .into())),
        "tiocsti" => {
            let c = b'x';
            result(ret(unsafe { libc::ioctl(0, libc::TIOCSTI, &c) }.into()))
        }
        "mknod" => result(ret(unsafe {
            libc::mknod(
                cstr("/workspace/tmp/sda").as_ptr(),
                libc::S_IFBLK | 0o600,
                libc::makedev(8, 0),
            )
        }
        .into())),
        "alloc" => {
            // Allocates and touches N MiB, one MiB at a time.
            let mib: usize = arg(&args, 2).parse().unwrap_or(1);
            let mut keep: Vec<Vec<u8>> = Vec::new();
            for _ in 0..mib {
                let mut v = Vec::new();
                if v.try_reserve_exact(1 << 20).is_err() {
                    println!("err 12 allocation refused after {} MiB", keep.len());
                    return;
                }
                v.resize(1 << 20, 1u8);
                keep.push(v);
            }
            println!("ok allocated {} MiB", keep.len());
        }
        "fork" => {
            // Forks N children that wait; reports how many forks worked.
            let n: usize = arg(&args, 2).parse().unwrap_or(1);
            let mut pids = Vec::new();
            let mut failure = None;
            for _ in 0..n {
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    std::thread::sleep(Duration::from_secs(10));
                    unsafe { libc::_exit(0) };
                }
                if pid < 0 {
                    failure = Some(errno());
                    break;
                }
                pids.push(pid);
            }
            for p in &pids {
                unsafe { libc::kill(*p, libc::SIGKILL) };
            }
            match failure {
                Some(e) => println!(
                    "err {} forked {} before: {e}",
                    e.raw_os_error().unwrap_or(0),
                    pids.len()
                ),
                None => println!("ok forked {}", pids.len()),
            }
        }
        "connect" => result(
            arg(&args, 2)
                .parse::<std::net::SocketAddr>()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
                .and_then(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)))
                .map(|_| "connected".into()),
        ),
        // connect to a unix socket, send one line, print the answer line
        "unix-call" => {
            use std::io::{BufRead, Write};
            let r = std::os::unix::net::UnixStream::connect(arg(&args, 2)).and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                // A server that refuses the peer answers and closes before
                // reading (lifecycle's control socket does): the write may
                // then fail with EPIPE while the answer waits to be read,
                // as mcpbox's own client (`control::call`) reads it.
                let written = s.write_all(format!("{}\n", arg(&args, 3)).as_bytes());
                let mut line = String::new();
                let read = std::io::BufReader::new(s).read_line(&mut line);
                if line.is_empty() {
                    written?;
                    read?;
                }
                Ok(line.trim_end().to_string())
            });
            result(r)
        }
        "pids" => {
            let mut pids: Vec<u32> = std::fs::read_dir("/proc")
                .map(|rd| {
                    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            pids.sort();
            println!(
                "ok {}",
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        "env" => {
            let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
            println!("ok {}", vars.join(" "));
        }
        "sleep" => {
            let secs: u64 = arg(&args, 2).parse().unwrap_or(1);
            std::thread::sleep(Duration::from_secs(secs));
            println!("ok slept");
        }
        "spawn-tree" => {
            // Leaves a tree of sleeping descendants (children and a
            // double-forked "daemon") that all carry this argv, then sleeps.
            let secs: u64 = arg(&args, 2).parse().unwrap_or(30);
            for _ in 0..3 {
                if unsafe { libc::fork() } == 0 {
                    if unsafe { libc::fork() } == 0 {
                        unsafe { libc::setsid() };
                        std::thread::sleep(Duration::from_secs(secs));
                        unsafe { libc::_exit(0) };
                    }
                    std::thread::sleep(Duration::from_secs(secs));
                    unsafe { libc::_exit(0) };
                }
            }
            println!("ok spawned");
            let _ = std::io::stdout().flush();
            std::thread::sleep(Duration::from_secs(secs));
        }
        "exit" => std::process::exit(arg(&args, 2).parse().unwrap_or(0)),
        "kill-self" => {
            let sig: i32 = arg(&args, 2).parse().unwrap_or(libc::SIGKILL);
            unsafe { libc::kill(libc::getpid(), sig) };
            std::thread::sleep(Duration::from_secs(5));
        }
        "kill-init" => {
            // pid 1 of a pid namespace ignores signals it has no handler for
            // when they come from inside (kill may even return 0): the
            // attack worked only if the init is gone afterwards (and then
            // this process is gone too, and prints nothing).
            let r = unsafe { libc::kill(1, libc::SIGKILL) };
            let e = errno();
            std::thread::sleep(Duration::from_millis(100));
            if std::path::Path::new("/proc/1/status").exists() {
                println!(
                    "err {} init survived (kill returned {r}: {e})",
                    e.raw_os_error().unwrap_or(0)
                );
            } else {
                println!("ok init killed");
            }
        }
        "cat" => {
            // stdin to stdout, untouched.
            let mut buf = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut buf);
            let _ = std::io::stdout().write_all(&buf);
        }
        _ => {
            eprintln!("usage: mcpbox-probe ACTION [ARGS]");
            std::process::exit(2);
        }
    }
}
