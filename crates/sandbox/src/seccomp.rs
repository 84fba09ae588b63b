//! The seccomp filter: system calls a contained process never needs.
//!
//! The filter is a deny list kept as data ([`RULES`]), one entry per system
//! call with the reason it is refused. Everything not listed is allowed:
//! the namespaces, the mount table, Landlock and the dropped capabilities
//! already bound what an allowed call can reach; this list removes kernel
//! attack surface on top (seccomp(2), Documentation/userspace-api/seccomp_filter.rst).
//!
//! The program is compiled here by hand into classic BPF, because it is a
//! short linear list: check the architecture, refuse x32 system call
//! numbers, then one comparison per rule, then allow.

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Fail with this errno; the program sees an ordinary error.
    Errno(u16),
}

/// An extra condition on one argument (lower 32 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgCond {
    /// The rule matches only when `args[arg] & mask != 0`.
    AnyBit { arg: u8, mask: u32 },
    /// The rule matches only when `args[arg] == value` (lower 32 bits).
    Equals { arg: u8, value: u32 },
}

/// One refused system call.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub name: &'static str,
    pub nr: libc::c_long,
    pub cond: Option<ArgCond>,
    pub action: Action,
}

const EPERM: Action = Action::Errno(libc::EPERM as u16);
const ENOSYS: Action = Action::Errno(libc::ENOSYS as u16);

/// Namespace-creating clone flags (clone(2)); CLONE_NEWTIME is 0x80.
const CLONE_NS_FLAGS: u32 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u32
    | 0x80;

/// S_ISUID | S_ISGID (inode(7)).
const SETID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;
/// A mode argument, by its position, that carries a set-id bit.
const SETID_MODE_ARG1: ArgCond = ArgCond::AnyBit {
    arg: 1,
    mask: SETID_BITS,
};
const SETID_MODE_ARG2: ArgCond = ArgCond::AnyBit {
    arg: 2,
    mask: SETID_BITS,
};
const SETID_MODE_ARG3: ArgCond = ArgCond::AnyBit {
    arg: 3,
    mask: SETID_BITS,
};

macro_rules! rule {
    ($name:ident, $action:expr) => {
        Rule {
            name: stringify!($name),
            nr: libc::$name,
            cond: None,
            action: $action,
        }
    };
    ($name:ident, $cond:expr, $action:expr) => {
        Rule {
            name: stringify!($name),
            nr: libc::$name,
            cond: Some($cond),
            action: $action,
        }
    };
}

/// The deny list. Keep one comment per entry saying why.
pub const RULES: &[Rule] = &[
    // Mount table changes: the sandbox's view of the filesystem is fixed
    // before the command starts; remounting could undo read-only binds.
    rule!(SYS_mount, EPERM),
    rule!(SYS_umount2, EPERM),
    rule!(SYS_pivot_root, EPERM),
    rule!(SYS_move_mount, EPERM),
    rule!(SYS_open_tree, EPERM),
    rule!(SYS_fsopen, EPERM),
    rule!(SYS_fsconfig, EPERM),
    rule!(SYS_fsmount, EPERM),
    rule!(SYS_fspick, EPERM),
    rule!(SYS_mount_setattr, EPERM),
    // chroot: a classic ingredient of escapes; never needed by a server.
    rule!(SYS_chroot, EPERM),
    // Tracing and reading other processes' memory.
    rule!(SYS_ptrace, EPERM),
    rule!(SYS_process_vm_readv, EPERM),
    rule!(SYS_process_vm_writev, EPERM),
    // kcmp leaks kernel pointer ordering between processes.
    rule!(SYS_kcmp, EPERM),
    // Kernel modules and replacing the kernel.
    rule!(SYS_init_module, EPERM),
    rule!(SYS_finit_module, EPERM),
    rule!(SYS_delete_module, EPERM),
    rule!(SYS_kexec_load, EPERM),
    rule!(SYS_kexec_file_load, EPERM),
    rule!(SYS_reboot, EPERM),
    // eBPF and perf: large kernel attack surface, frequent CVEs.
    rule!(SYS_bpf, EPERM),
    rule!(SYS_perf_event_open, EPERM),
    // Keyrings are not namespaced: a sandbox could read or plant keys of the
    // user's session keyring.
    rule!(SYS_add_key, EPERM),
    rule!(SYS_request_key, EPERM),
    rule!(SYS_keyctl, EPERM),
    // io_uring bypasses per-syscall filtering and has had many CVEs.
    rule!(SYS_io_uring_setup, EPERM),
    rule!(SYS_io_uring_enter, EPERM),
    rule!(SYS_io_uring_register, EPERM),
    // userfaultfd is a common primitive for kernel exploit races.
    rule!(SYS_userfaultfd, EPERM),
    // New namespaces: a nested user namespace regains capabilities over new
    // mounts and widens the kernel surface (CVE-2022-0185 and friends).
    rule!(SYS_unshare, EPERM),
    rule!(SYS_setns, EPERM),
    rule!(
        SYS_clone,
        ArgCond::AnyBit {
            arg: 0,
            mask: CLONE_NS_FLAGS
        },
        EPERM
    ),
    // clone3 passes its flags in memory, which seccomp cannot read; ENOSYS
    // makes libc fall back to clone, which is checked above.
    rule!(SYS_clone3, ENOSYS),
    // File handles bypass path-based checks (the "shocker" escape).
    rule!(SYS_open_by_handle_at, EPERM),
    rule!(SYS_name_to_handle_at, EPERM),
    // System-wide state: swap, accounting, clocks, kernel log, quotas.
    rule!(SYS_swapon, EPERM),
    rule!(SYS_swapoff, EPERM),
    rule!(SYS_acct, EPERM),
    rule!(SYS_settimeofday, EPERM),
    rule!(SYS_clock_settime, EPERM),
    rule!(SYS_clock_adjtime, EPERM),
    rule!(SYS_syslog, EPERM),
    rule!(SYS_quotactl, EPERM),
    rule!(SYS_vhangup, EPERM),
    // fanotify can watch whole mounts; never needed by a server.
    rule!(SYS_fanotify_init, EPERM),
    // Pushing input into a terminal (CVE-2017-5226) and console ioctls.
    rule!(
        SYS_ioctl,
        ArgCond::Equals {
            arg: 1,
            value: libc::TIOCSTI as u32
        },
        EPERM
    ),
    rule!(
        SYS_ioctl,
        ArgCond::Equals {
            arg: 1,
            value: libc::TIOCLINUX as u32
        },
        EPERM
    ),
    // Set-user-ID and set-group-ID bits (chmod(2), open(2), mknod(2),
    // mkdir(2)): every mount of the sandbox is nosuid, so inside they mean
    // nothing, but a file the server leaves in output keeps them on the
    // host, where it runs as its owner: the caller (rootless), or root
    // itself through the idmapped output of a root run, whose files are
    // stored as uid 0. So the mode of a chmod, and the creation mode of an
    // open, mknod or mkdir, may not carry S_ISUID or S_ISGID. openat2
    // passes its mode in memory, which seccomp cannot read: it can create
    // an empty set-id file, whose bits the kernel clears on the first write
    // or truncate by a process without CAP_FSETID, as every sandboxed one
    // is (docs/threat-model.md, Limitations).
    rule!(SYS_fchmod, SETID_MODE_ARG1, EPERM),
    rule!(SYS_fchmodat, SETID_MODE_ARG2, EPERM),
    rule!(SYS_fchmodat2, SETID_MODE_ARG2, EPERM),
    rule!(SYS_openat, SETID_MODE_ARG3, EPERM),
    rule!(SYS_mknodat, SETID_MODE_ARG2, EPERM),
    rule!(SYS_mkdirat, SETID_MODE_ARG2, EPERM),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_chmod, SETID_MODE_ARG1, EPERM),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_open, SETID_MODE_ARG2, EPERM),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_creat, SETID_MODE_ARG1, EPERM),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_mknod, SETID_MODE_ARG1, EPERM),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_mkdir, SETID_MODE_ARG1, EPERM),
    // File leases (fcntl(2) F_SETLEASE): a read lease on a file of the
    // caller's, which an idmapped mount lets the sandbox user own, would
    // hold up a host process that opens it for writing for up to
    // lease-break-time (45 s). No server needs one.
    rule!(
        SYS_fcntl,
        ArgCond::Equals {
            arg: 1,
            value: libc::F_SETLEASE as u32
        },
        EPERM
    ),
    // Obsolete or x86-only privileged calls.
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_iopl, EPERM),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_ioperm, EPERM),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_uselib, EPERM),
];

/// Refused on top of [`RULES`] when `process.allow_exec` is set: the ways
/// a listed program could start an unlisted one without an `execve` that
/// Landlock checks (docs/threat-model.md, "Exec allowlist").
pub const ALLOW_EXEC_RULES: &[Rule] = &[
    // memfd_create: an anonymous memory file lives on the kernel's internal
    // shmem mount, which Landlock lets through (it checks paths, and an
    // internal mount has none) and which no mount of ours can make noexec.
    // So an unlisted program copied into one runs through execveat(fd, "",
    // AT_EMPTY_PATH), fexecve, `/proc/self/fd/N`, or the dynamic loader
    // (`ld.so /proc/self/fd/N` maps it with mmap, which neither an
    // MFD_NOEXEC_SEAL nor vm.memfd_noexec = 2 refuses: they only take the
    // exec bits away). Refused whatever the flags, with ENOSYS, as on a
    // kernel before 3.17, so that a program with a fallback (shm_open, a
    // file in tmp) takes it, and the fallback's file is on a noexec mount.
    rule!(SYS_memfd_create, ENOSYS),
];

/// The rules of one sandbox: [`RULES`], plus [`ALLOW_EXEC_RULES`] when
/// its policy has an `allow_exec` list.
pub fn rules(allow_exec: bool) -> Vec<Rule> {
    let mut rules = RULES.to_vec();
    if allow_exec {
        rules.extend_from_slice(ALLOW_EXEC_RULES);
    }
    rules
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// x32 system calls on x86_64 carry this bit; they would bypass a filter
/// written in x86_64 numbers.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
fn off_arg_lo(arg: u8) -> u32 {
    16 + 8 * u32::from(arg)
}

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}
fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE_K: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const JSET_K: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
const RET_K: u32 = libc::BPF_RET | libc::BPF_K;

fn ret(action: Action) -> libc::sock_filter {
    match action {
        Action::Errno(e) => stmt(RET_K, SECCOMP_RET_ERRNO | u32::from(e)),
    }
}

/// Compiles `rules` into a BPF program for seccomp(2).
pub fn compile(rules: &[Rule]) -> Vec<libc::sock_filter> {
    let mut p = vec![
        // A foreign architecture's numbers mean different calls: kill.
        stmt(LD_W_ABS, OFF_ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(LD_W_ABS, OFF_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        p.push(jump(JGE_K, X32_SYSCALL_BIT, 0, 1));
        p.push(ret(EPERM));
    }
    for rule in rules {
        let nr = rule.nr as u32;
        match rule.cond {
            None => {
                p.push(jump(JEQ_K, nr, 0, 1));
                p.push(ret(rule.action));
            }
            Some(cond) => {
                // nr matches -> load the argument, test it, return or reload nr.
                p.push(jump(JEQ_K, nr, 0, 4));
                match cond {
                    ArgCond::AnyBit { arg, mask } => {
                        p.push(stmt(LD_W_ABS, off_arg_lo(arg)));
                        p.push(jump(JSET_K, mask, 0, 1));
                    }
                    ArgCond::Equals { arg, value } => {
                        p.push(stmt(LD_W_ABS, off_arg_lo(arg)));
                        p.push(jump(JEQ_K, value, 0, 1));
                    }
                }
                p.push(ret(rule.action));
                p.push(stmt(LD_W_ABS, OFF_NR));
            }
        }
    }
    p.push(stmt(RET_K, SECCOMP_RET_ALLOW));
    p
}

/// Names of the refused calls, for `doctor` and the docs.
pub fn refused_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = RULES
        .iter()
        .map(|r| r.name.trim_start_matches("SYS_"))
        .collect();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny classic-BPF interpreter for the instructions `compile` emits,
    /// so the program's decisions are checked without loading it.
    fn run(prog: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let ins = prog[pc];
            let code = u32::from(ins.code);
            if code == LD_W_ABS {
                let k = ins.k as usize;
                acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                pc += 1;
            } else if code == RET_K {
                return ins.k;
            } else {
                let taken = match code {
                    c if c == JEQ_K => acc == ins.k,
                    c if c == JGE_K => acc >= ins.k,
                    c if c == JSET_K => acc & ins.k != 0,
                    other => panic!("unexpected opcode {other:#x}"),
                };
                pc += 1 + usize::from(if taken { ins.jt } else { ins.jf });
            }
        }
    }

    fn eperm() -> u32 {
        SECCOMP_RET_ERRNO | libc::EPERM as u32
    }

    #[test]
    fn ordinary_calls_are_allowed() {
        let p = compile(RULES);
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
        ] {
            assert_eq!(run(&p, AUDIT_ARCH, nr as u32, [0; 6]), SECCOMP_RET_ALLOW);
        }
    }

    #[test]
    fn every_listed_call_is_refused() {
        let p = compile(RULES);
        for r in RULES.iter().filter(|r| r.cond.is_none()) {
            assert_ne!(
                run(&p, AUDIT_ARCH, r.nr as u32, [0; 6]),
                SECCOMP_RET_ALLOW,
                "{}",
                r.name
            );
        }
    }

    #[test]
    fn clone_with_namespace_flag_is_refused_but_plain_clone_allowed() {
        let p = compile(RULES);
        let nr = libc::SYS_clone as u32;
        assert_eq!(
            run(&p, AUDIT_ARCH, nr, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as u64;
        assert_eq!(run(&p, AUDIT_ARCH, nr, [flags, 0, 0, 0, 0, 0]), eperm());
    }

    #[test]
    fn tiocsti_ioctl_is_refused_other_ioctls_allowed() {
        let p = compile(RULES);
        let nr = libc::SYS_ioctl as u32;
        assert_eq!(
            run(&p, AUDIT_ARCH, nr, [0, libc::TIOCSTI, 0, 0, 0, 0]),
            eperm()
        );
        assert_eq!(
            run(&p, AUDIT_ARCH, nr, [0, libc::TIOCGWINSZ, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
    }

    #[test]
    fn set_id_modes_are_refused_plain_modes_allowed() {
        let p = compile(RULES);
        let at = |nr: libc::c_long, arg: usize, mode: u64| {
            let mut args = [0u64; 6];
            args[arg] = mode;
            run(&p, AUDIT_ARCH, nr as u32, args)
        };
        for (nr, arg) in [
            (libc::SYS_fchmod, 1),
            (libc::SYS_fchmodat, 2),
            (libc::SYS_fchmodat2, 2),
            (libc::SYS_openat, 3),
            (libc::SYS_mknodat, 2),
            (libc::SYS_mkdirat, 2),
        ] {
            assert_eq!(at(nr, arg, 0o4755), eperm(), "{nr} setuid");
            assert_eq!(at(nr, arg, 0o2755), eperm(), "{nr} setgid");
            assert_eq!(at(nr, arg, 0o1777), SECCOMP_RET_ALLOW, "{nr} sticky");
            assert_eq!(at(nr, arg, 0o755), SECCOMP_RET_ALLOW, "{nr} plain");
        }
    }

    #[test]
    fn file_leases_are_refused_other_fcntls_allowed() {
        let p = compile(RULES);
        let nr = libc::SYS_fcntl as u32;
        let cmd = |c: i32| run(&p, AUDIT_ARCH, nr, [3, c as u64, 0, 0, 0, 0]);
        assert_eq!(cmd(libc::F_SETLEASE), eperm());
        assert_eq!(cmd(libc::F_GETFL), SECCOMP_RET_ALLOW);
        assert_eq!(cmd(libc::F_SETFD), SECCOMP_RET_ALLOW);
    }

    #[test]
    fn foreign_architecture_is_killed() {
        let p = compile(RULES);
        assert_eq!(run(&p, 0x4000_0003, 0, [0; 6]), SECCOMP_RET_KILL_PROCESS);
    }

    #[test]
    fn memfd_create_is_refused_with_enosys_only_under_an_allow_list() {
        let nr = libc::SYS_memfd_create as u32;
        let enosys = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        let open = compile(&rules(false));
        assert_eq!(run(&open, AUDIT_ARCH, nr, [0; 6]), SECCOMP_RET_ALLOW);
        let listed = compile(&rules(true));
        // MFD_CLOEXEC, MFD_EXEC, MFD_NOEXEC_SEAL: refused whatever the flags,
        // since the loader maps a sealed one just as well.
        for flags in [0u64, 1, 0x10, 0x8] {
            assert_eq!(run(&listed, AUDIT_ARCH, nr, [0, flags, 0, 0, 0, 0]), enosys);
        }
        // The rest of the list still holds.
        assert_eq!(
            run(&listed, AUDIT_ARCH, libc::SYS_mount as u32, [0; 6]),
            eperm()
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_numbers_are_refused() {
        let p = compile(RULES);
        assert_eq!(run(&p, AUDIT_ARCH, X32_SYSCALL_BIT | 1, [0; 6]), eperm());
    }
}
