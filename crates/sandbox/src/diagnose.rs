//! Why a command that exists was "not found": its interpreter is missing.
//!
//! execve(2) fails with `ENOENT` both when the program is absent and when
//! the interpreter it names is: the `#!` line of a script, or the ELF
//! loader in a dynamic executable's `PT_INTERP` header ("ENOENT: the
//! pathname, or a script or ELF interpreter, does not exist", execve(2)).
//! Inside a sandbox the second is the common one: `/opt/venv/bin/python`
//! or a home-directory `node` is on the host but not mounted.
//!
//! The child only reports the errno (it may make system calls only, after
//! fork). This runs in the supervisor afterwards, on the mount plan: a
//! path inside the sandbox is mapped to the host path its bind mount shows
//! (symlinks of the plan and of the host followed in the sandbox's view),
//! the program's first bytes are read from there, and the interpreter is
//! looked up the same way. It only explains a failure that already
//! happened; nothing here decides what the sandbox may see.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};

use crate::plan::Step;

/// Symlinks followed at most while mapping one path (path_resolution(7)
/// allows 40; a plan and a host layout need a handful).
const MAX_LINKS: u32 = 16;

/// Linux reads at most this much of a `#!` line (BINPRM_BUF_SIZE in
/// include/uapi/linux/binfmts.h).
const SHEBANG_MAX: usize = 256;

/// Longest `PT_INTERP` path read (PATH_MAX).
const INTERP_MAX: u64 = 4096;

/// What a path inside the sandbox is, as far as the plan tells.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Shown from this host path by a bind mount.
    Host(PathBuf),
    /// Made by the sandbox itself (/proc, a generated file or directory):
    /// nothing to say about it.
    Generated,
    /// Not there: the path (inside, links followed so far) that is not.
    Missing(PathBuf),
}

/// The explanation of an `ENOENT` from execve over `candidates` (the paths
/// tried, inside the sandbox), when the program is there and its
/// interpreter is not; None when the program itself is missing, or the
/// cause cannot be told.
pub(crate) fn missing_interpreter(candidates: &[PathBuf], view: &[Step]) -> Option<String> {
    // execvp(3) went on past each candidate that did not exist; the first
    // one that does is the one whose execve failed for its interpreter.
    let (program, host) = candidates
        .iter()
        .find_map(|c| regular_file(view, c).map(|h| (c, h)))?;
    let (interp, what) = interpreter_of(&host)?;
    let Seen::Missing(missing) = resolve(view, &interp, MAX_LINKS) else {
        // It is there: the ENOENT came from further down (the loader of
        // the interpreter, say); not guessed at.
        return None;
    };
    let program = program.display();
    let shown = interp.display();
    if !interp.exists() {
        return Some(format!(
            "the program {program} exists but its {what} {shown} does not exist, \
             in the sandbox or on the host"
        ));
    }
    // The interpreter may be there and a link on its way not (a venv's
    // `python` the policy mounts, linking to ~/.pyenv/versions/X): the
    // mount to add is the link's target, never what the policy has.
    let (via, dir) = if missing != interp && missing.exists() {
        (
            format!(", which links to {}, and that", missing.display()),
            mount_to_suggest(&missing),
        )
    } else {
        (String::new(), mount_to_suggest(&interp))
    };
    let dir = dir.display();
    Some(format!(
        "the program {program} exists but its {what} {shown}{via} is not in the sandbox: \
         add a read-only mount of {dir} ([[filesystem.mounts]] host = \"{dir}\", \
         at = \"{dir}\"; see docs/policy.md)"
    ))
}

/// The host path of `inside` when it is a regular file there.
fn regular_file(view: &[Step], inside: &Path) -> Option<PathBuf> {
    match resolve(view, inside, MAX_LINKS) {
        Seen::Host(h) if h.is_file() => Some(h),
        _ => None,
    }
}

/// The interpreter a program names, and what to call it: the `#!` line's
/// first word, or an ELF's `PT_INTERP` (its dynamic loader).
fn interpreter_of(host: &Path) -> Option<(PathBuf, &'static str)> {
    match interpreter(host)? {
        Interpreter::Script { path, .. } => Some((path, "interpreter")),
        Interpreter::Loader(path) => Some((path, "ELF loader")),
    }
}

/// What the kernel runs a program file with (execve(2)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interpreter {
    /// A `#!` line: the interpreter and the words after it
    /// (`#!/usr/bin/env node` gives `/usr/bin/env` and `["node"]`).
    Script {
        path: PathBuf,
        args: Vec<std::ffi::OsString>,
    },
    /// A dynamic ELF executable's loader (`PT_INTERP`).
    Loader(PathBuf),
}

/// The interpreter of the program file at `host`, read from its first
/// bytes; None for a static executable, an unreadable file or anything
/// else. Runtime discovery (the binary's `runtime` module) follows it to
/// mount what a program needs, and the "not found" explanation above names
/// it: one reading of `#!` and `PT_INTERP` for both.
pub fn interpreter(host: &Path) -> Option<Interpreter> {
    let file = File::open(host).ok()?;
    let mut head = [0u8; SHEBANG_MAX];
    let n = file.read_at(&mut head, 0).ok()?;
    let head = &head[..n];
    if let Some(line) = head.strip_prefix(b"#!") {
        // binfmt_script: spaces and tabs skipped, the interpreter ends at
        // the first space, tab or newline.
        let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
        let mut words = line
            .split(|b| *b == b' ' || *b == b'\t' || *b == b'\r')
            .filter(|w| !w.is_empty());
        let path = path_of(words.next()?);
        let args = words.map(|w| path_of(w).into_os_string()).collect();
        return Some(Interpreter::Script { path, args });
    }
    elf_interp(&file, head).map(Interpreter::Loader)
}

fn path_of(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
}

/// The `PT_INTERP` path of an ELF file (elf(5)), whose first bytes are
/// `head`; None for anything else, a static executable included.
fn elf_interp(file: &File, head: &[u8]) -> Option<PathBuf> {
    const PT_INTERP: u64 = 3;
    if head.len() < 52 || !head.starts_with(b"\x7fELF") {
        return None;
    }
    let little = match head[5] {
        1 => true,
        2 => false,
        _ => return None,
    };
    let u16_at = |b: &[u8], at: usize| -> Option<u64> {
        let a: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
        Some(u64::from(if little {
            u16::from_le_bytes(a)
        } else {
            u16::from_be_bytes(a)
        }))
    };
    let u32_at = |b: &[u8], at: usize| -> Option<u64> {
        let a: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(u64::from(if little {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }))
    };
    let u64_at = |b: &[u8], at: usize| -> Option<u64> {
        let a: [u8; 8] = b.get(at..at + 8)?.try_into().ok()?;
        Some(if little {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        })
    };
    // (e_phoff, e_phentsize, e_phnum) and, per header, (p_offset,
    // p_filesz) by class: 32-bit or 64-bit.
    let wide = match head[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let (phoff, phentsize, phnum) = if wide {
        (
            u64_at(head, 0x20)?,
            u16_at(head, 0x36)?,
            u16_at(head, 0x38)?,
        )
    } else {
        (
            u32_at(head, 0x1c)?,
            u16_at(head, 0x2a)?,
            u16_at(head, 0x2c)?,
        )
    };
    if phentsize < if wide { 56 } else { 32 } {
        return None;
    }
    for i in 0..phnum {
        let mut ph = [0u8; 56];
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let len = usize::try_from(phentsize.min(56)).ok()?;
        file.read_exact_at(&mut ph[..len], at).ok()?;
        if u32_at(&ph, 0)? != PT_INTERP {
            continue;
        }
        let (offset, size) = if wide {
            (u64_at(&ph, 8)?, u64_at(&ph, 32)?)
        } else {
            (u32_at(&ph, 4)?, u32_at(&ph, 16)?)
        };
        let mut path = vec![0u8; usize::try_from(size.min(INTERP_MAX)).ok()?];
        file.read_exact_at(&mut path, offset).ok()?;
        let end = path.iter().position(|b| *b == 0).unwrap_or(path.len());
        path.truncate(end);
        return (!path.is_empty()).then(|| path_of(&path));
    }
    None
}

/// What `inside` is in the sandbox: the plan step with the longest path
/// that holds it decides (a later step wins a tie, as a bind over the
/// directory made for it does); symlinks, the plan's and those inside a
/// bound host tree, are followed in the sandbox's view.
fn resolve(view: &[Step], inside: &Path, links: u32) -> Seen {
    let Some(inside) = normalize(inside) else {
        return Seen::Missing(inside.to_path_buf());
    };
    let mut best: Option<(&Path, &Step)> = None;
    for step in view {
        let (path, subtree) = match step {
            Step::Bind { path, .. }
            | Step::Alias { path, .. }
            | Step::Tmpfs { path, .. }
            | Step::Proc { path } => (path, true),
            Step::Symlink { path, .. } => (path, true),
            Step::Dir { path, .. } | Step::File { path, .. } => (path, false),
            Step::Chown { .. } | Step::NoExec { .. } => continue,
        };
        let holds = if subtree {
            inside.starts_with(path)
        } else {
            inside == *path
        };
        if holds && best.is_none_or(|(b, _)| path.as_os_str().len() >= b.as_os_str().len()) {
            best = Some((path, step));
        }
    }
    let Some((at, step)) = best else {
        return Seen::Missing(inside);
    };
    let rest = inside.strip_prefix(at).unwrap_or(Path::new(""));
    match step {
        Step::Bind { host, .. } => {
            let host = if rest.as_os_str().is_empty() {
                host.clone()
            } else {
                host.join(rest)
            };
            follow_host(view, &inside, host, links)
        }
        Step::Alias { from, .. } => {
            if links == 0 {
                return Seen::Missing(inside);
            }
            resolve(view, &from.join(rest), links - 1)
        }
        Step::Symlink { target, .. } => {
            if links == 0 {
                return Seen::Missing(inside);
            }
            let base = at.parent().unwrap_or(Path::new("/"));
            resolve(view, &base.join(target).join(rest), links - 1)
        }
        // A tmpfs holds, before the command ran, only what the plan made
        // in it (a longer step, which would have matched first).
        Step::Tmpfs { .. } if !rest.as_os_str().is_empty() => Seen::Missing(inside),
        _ => Seen::Generated,
    }
}

/// A bound host path: a symlink there is read and followed in the
/// sandbox's view (an absolute target means the sandbox's `/`).
fn follow_host(view: &[Step], inside: &Path, host: PathBuf, links: u32) -> Seen {
    match std::fs::symlink_metadata(&host) {
        Err(_) => Seen::Missing(inside.to_path_buf()),
        Ok(m) if m.file_type().is_symlink() => {
            let Ok(target) = std::fs::read_link(&host) else {
                return Seen::Missing(inside.to_path_buf());
            };
            if links == 0 {
                return Seen::Missing(inside.to_path_buf());
            }
            let base = inside.parent().unwrap_or(Path::new("/"));
            resolve(view, &base.join(target), links - 1)
        }
        Ok(_) => Seen::Host(host),
    }
}

/// `path` made absolute and free of `.` and `..` (lexically, as the
/// sandbox's root has no parent); None for a relative path.
pub fn normalize(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// The directory to mount for `interp`: the tree its `bin` belongs to
/// (`/opt/venv/bin/python` -> `/opt/venv`), else its directory.
fn mount_to_suggest(interp: &Path) -> PathBuf {
    let dir = interp.parent().unwrap_or(Path::new("/"));
    let is_bin = matches!(
        dir.file_name().and_then(|n| n.to_str()),
        Some("bin" | "sbin")
    );
    match dir.parent() {
        Some(up) if is_bin && up != Path::new("/") => up.to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::plan::Access;

    fn bind(host: &Path, at: &str) -> Step {
        Step::Bind {
            host: host.to_path_buf(),
            path: PathBuf::from(at),
            access: Access::ReadOnly,
        }
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn a_script_whose_interpreter_is_not_mounted_is_named_with_the_mount() {
        let input = tempfile::tempdir().unwrap();
        let venv = tempfile::tempdir().unwrap();
        std::fs::create_dir(venv.path().join("bin")).unwrap();
        let python = script(&venv.path().join("bin"), "python", "");
        script(
            input.path(),
            "server.py",
            &format!("#! {} -u\nprint(1)\n", python.display()),
        );
        let view = [bind(input.path(), "/workspace/input")];
        let text =
            missing_interpreter(&[PathBuf::from("/workspace/input/server.py")], &view).unwrap();
        assert!(
            text.contains("the program /workspace/input/server.py exists")
                && text.contains(&format!(
                    "interpreter {} is not in the sandbox",
                    python.display()
                ))
                && text.contains(&format!("mount of {}", venv.path().display())),
            "{text}"
        );
        // mounted where the #! line says, it is no longer the cause
        let mut view = view.to_vec();
        view.push(bind(venv.path(), &venv.path().display().to_string()));
        assert_eq!(
            missing_interpreter(&[PathBuf::from("/workspace/input/server.py")], &view),
            None
        );
    }

    /// Issue 32: a venv the policy mounts whose `python` links out of it
    /// (pyenv): the mount to add is the link's target, not the venv the
    /// policy has already.
    #[test]
    fn an_interpreter_that_links_out_of_its_mount_names_the_link_target() {
        let input = tempfile::tempdir().unwrap();
        let venv = tempfile::tempdir().unwrap();
        let pyenv = tempfile::tempdir().unwrap();
        std::fs::create_dir(pyenv.path().join("bin")).unwrap();
        let real = script(&pyenv.path().join("bin"), "python3.11", "");
        std::fs::create_dir(venv.path().join("bin")).unwrap();
        let python = venv.path().join("bin/python");
        std::os::unix::fs::symlink(&real, &python).unwrap();
        script(
            input.path(),
            "server.py",
            &format!("#!{}\n", python.display()),
        );
        let view = [
            bind(input.path(), "/workspace/input"),
            bind(venv.path(), &venv.path().display().to_string()),
        ];
        let text =
            missing_interpreter(&[PathBuf::from("/workspace/input/server.py")], &view).unwrap();
        assert!(
            text.contains(&format!("which links to {}", real.display()))
                && text.contains(&format!("mount of {} ", pyenv.path().display()))
                && !text.contains(&format!("mount of {} ", venv.path().display())),
            "{text}"
        );
    }

    #[test]
    fn an_interpreter_missing_on_the_host_too_is_said_so() {
        let input = tempfile::tempdir().unwrap();
        script(
            input.path(),
            "run",
            "#!/nonexistent/mcpbox-test/bin/python\n",
        );
        let view = [bind(input.path(), "/w")];
        let text = missing_interpreter(&[PathBuf::from("/w/run")], &view).unwrap();
        assert!(
            text.contains("does not exist, in the sandbox or on the host"),
            "{text}"
        );
    }

    #[test]
    fn the_degraded_tiers_host_view_is_explained_on_host_paths() {
        let dir = tempfile::tempdir().unwrap();
        let prog = script(dir.path(), "tool", "#!/nonexistent/z/bin/perl\n");
        let view = [bind(Path::new("/"), "/")];
        let text = missing_interpreter(std::slice::from_ref(&prog), &view).unwrap();
        assert!(text.contains(&prog.display().to_string()) && text.contains("does not exist"));
    }

    #[test]
    fn a_missing_program_or_one_without_an_interpreter_is_not_explained() {
        let input = tempfile::tempdir().unwrap();
        script(input.path(), "data", "just text\n");
        let view = [bind(input.path(), "/w")];
        assert_eq!(
            missing_interpreter(&[PathBuf::from("/w/nope")], &view),
            None
        );
        assert_eq!(
            missing_interpreter(&[PathBuf::from("/w/data")], &view),
            None
        );
        // outside every mount, even if the host has it
        assert_eq!(
            missing_interpreter(&[PathBuf::from("/bin/sh")], &view),
            None
        );
    }

    #[test]
    fn the_first_candidate_that_exists_is_the_one_explained() {
        let a = tempfile::tempdir().unwrap();
        script(a.path(), "tool", "#!/nonexistent/x/bin/node\n");
        let view = [bind(a.path(), "/b")];
        let text =
            missing_interpreter(&[PathBuf::from("/a/tool"), PathBuf::from("/b/tool")], &view)
                .unwrap();
        assert!(text.contains("/b/tool") && text.contains("/nonexistent/x/bin/node"));
    }

    #[test]
    fn plan_and_host_symlinks_are_followed_in_the_sandboxs_view() {
        let usr = tempfile::tempdir().unwrap();
        std::fs::create_dir(usr.path().join("bin")).unwrap();
        script(
            &usr.path().join("bin"),
            "real",
            "#!/nonexistent/y/bin/ruby\n",
        );
        std::os::unix::fs::symlink("real", usr.path().join("bin/link")).unwrap();
        // an absolute host link is the sandbox's path, not the host's
        std::os::unix::fs::symlink("/usr/bin/real", usr.path().join("bin/abs")).unwrap();
        let view = [
            Step::Dir {
                path: "/usr".into(),
                mode: 0o755,
            },
            bind(usr.path(), "/usr"),
            Step::Symlink {
                path: "/bin".into(),
                target: "usr/bin".into(),
            },
        ];
        for c in [
            "/bin/real",
            "/usr/bin/link",
            "/bin/abs",
            "/usr/../bin/./link",
        ] {
            let text = missing_interpreter(&[PathBuf::from(c)], &view);
            assert!(
                text.as_deref()
                    .is_some_and(|t| t.contains("/nonexistent/y/bin/ruby")),
                "{c}: {text:?}"
            );
        }
        assert_eq!(
            resolve(&view, Path::new("/usr"), MAX_LINKS),
            Seen::Host(usr.path().to_path_buf())
        );
    }

    #[test]
    fn an_elf_loader_is_read_from_pt_interp() {
        // the test binary itself is a dynamic ELF (or static: then None)
        let exe = std::env::current_exe().unwrap();
        if let Some((p, what)) = interpreter_of(&exe) {
            assert_eq!(what, "ELF loader");
            assert!(p.is_absolute() && p.exists(), "{p:?}");
        }
        // a hand-made 64-bit little-endian ELF with one PT_INTERP header
        let mut elf = vec![0u8; 64 + 56];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&3u32.to_le_bytes());
        let interp = b"/nonexistent/lib/ld-test.so.2\0";
        elf[64 + 8..64 + 16].copy_from_slice(&120u64.to_le_bytes());
        elf[64 + 32..64 + 40].copy_from_slice(&(interp.len() as u64).to_le_bytes());
        elf.extend_from_slice(interp);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("prog"), &elf).unwrap();
        let (p, what) = interpreter_of(&dir.path().join("prog")).unwrap();
        assert_eq!(
            (p, what),
            (PathBuf::from("/nonexistent/lib/ld-test.so.2"), "ELF loader")
        );
        // truncated or garbage headers are no answer, never a panic
        for cut in [4, 52, 64, 100, 130] {
            std::fs::write(dir.path().join("cut"), &elf[..cut]).unwrap();
            let _ = interpreter_of(&dir.path().join("cut"));
        }
    }

    #[test]
    fn the_mount_suggested_is_the_tree_of_the_bin_directory() {
        assert_eq!(
            mount_to_suggest(Path::new("/opt/venv/bin/python")),
            Path::new("/opt/venv")
        );
        assert_eq!(
            mount_to_suggest(Path::new("/opt/node/node")),
            Path::new("/opt/node")
        );
        assert_eq!(mount_to_suggest(Path::new("/bin/sh")), Path::new("/bin"));
    }
}
