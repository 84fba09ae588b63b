//! Only artifacts leave the sandbox: each test plants what a hostile
//! server could leave in `output` and checks it is listed as refused and
//! never copied.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use mcpbox_lifecycle::artifacts;
use mcpbox_lifecycle::Artifact;
use sha2::{Digest, Sha256};

const MAX: u64 = 1 << 20;

fn none() -> artifacts::Approved {
    artifacts::Approved::new()
}

fn pats(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

fn sha(data: &[u8]) -> String {
    mcpbox_policy::hex::encode(&Sha256::digest(data))
}

fn refusal<'a>(list: &'a [Artifact], path: &str) -> &'a str {
    list.iter()
        .find(|a| a.path == path)
        .unwrap_or_else(|| panic!("{path} not listed in {list:?}"))
        .refused
        .as_deref()
        .unwrap_or_else(|| panic!("{path} not refused"))
}

/// Every file below `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    fn go(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                go(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    go(dir, dir, &mut out);
    out.sort();
    out
}

struct Ws {
    _t: tempfile::TempDir,
    out: std::path::PathBuf,
    dest: std::path::PathBuf,
}

fn ws() -> Ws {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("output");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("ok.txt"), "ok").unwrap();
    let dest = t.path().join("exported");
    Ws { out, dest, _t: t }
}

fn mknod(p: &Path, ty: rustix::fs::FileType, dev: rustix::fs::Dev) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        ty,
        rustix::fs::Mode::from_raw_mode(0o666),
        dev,
    )
    .unwrap();
}

#[test]
fn export_refuses_a_symlink_to_a_host_file() {
    let w = ws();
    std::os::unix::fs::symlink("/etc/passwd", w.out.join("passwd.txt")).unwrap();
    let p = pats(&["*.txt"]);
    let list = artifacts::list(&w.out, &p, MAX).unwrap();
    assert!(refusal(&list, "passwd.txt").contains("a symlink"));
    let ex = artifacts::export(&w.out, &p, MAX, &none(), &w.dest).unwrap();
    assert_eq!(ex.len(), 1);
    assert_eq!(files(&w.dest), vec!["ok.txt"]);
}

#[test]
fn export_refuses_a_hardlink() {
    let w = ws();
    // a hardlink to a file outside output (same filesystem: the temp dir)
    let host = w.out.parent().unwrap().join("host-secret");
    fs::write(&host, "secret").unwrap();
    fs::hard_link(&host, w.out.join("secret.txt")).unwrap();
    let p = pats(&["*.txt"]);
    let list = artifacts::list(&w.out, &p, MAX).unwrap();
    assert!(refusal(&list, "secret.txt").contains("a hardlink (2 links)"));
    artifacts::export(&w.out, &p, MAX, &none(), &w.dest).unwrap();
    assert_eq!(files(&w.dest), vec!["ok.txt"]);
}

#[test]
fn export_refuses_a_fifo() {
    let w = ws();
    mknod(&w.out.join("pipe.txt"), rustix::fs::FileType::Fifo, 0);
    let _sock = std::os::unix::net::UnixListener::bind(w.out.join("sock.txt")).unwrap();
    let p = pats(&["*.txt"]);
    let list = artifacts::list(&w.out, &p, MAX).unwrap();
    assert_eq!(
        refusal(&list, "pipe.txt"),
        "a fifo: only regular files are artifacts"
    );
    assert!(refusal(&list, "sock.txt").contains("a socket"));
    // would hang on open(2) if the fifo were opened blocking
    artifacts::export(&w.out, &p, MAX, &none(), &w.dest).unwrap();
    assert_eq!(files(&w.dest), vec!["ok.txt"]);
}

#[test]
fn export_refuses_a_device_node() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: creating a device node needs root (CAP_MKNOD)");
        return;
    }
    let w = ws();
    mknod(
        &w.out.join("zero.txt"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::makedev(1, 5),
    );
    let p = pats(&["*.txt"]);
    let list = artifacts::list(&w.out, &p, MAX).unwrap();
    assert!(refusal(&list, "zero.txt").contains("a char-device"));
    artifacts::export(&w.out, &p, MAX, &none(), &w.dest).unwrap();
    assert_eq!(files(&w.dest), vec!["ok.txt"]);
}

#[test]
fn export_refuses_a_path_that_escapes_output() {
    let w = ws();
    std::os::unix::fs::symlink("/etc", w.out.join("etc")).unwrap();
    // `**` would reach /etc/passwd through the link if it were followed
    let list = artifacts::list(&w.out, &pats(&["**"]), MAX).unwrap();
    assert!(refusal(&list, "etc").contains("a symlink"));
    assert!(!list.iter().any(|a| a.path.starts_with("etc/")), "{list:?}");
    // a pattern that names a file below the link: the link is listed
    let list = artifacts::list(&w.out, &pats(&["etc/passwd"]), MAX).unwrap();
    assert!(refusal(&list, "etc").contains("where matching files could lie below it"));
    let ex =
        artifacts::export(&w.out, &pats(&["**", "etc/passwd"]), MAX, &none(), &w.dest).unwrap();
    assert_eq!(
        ex.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
        vec!["ok.txt"]
    );
    assert_eq!(files(&w.dest), vec!["ok.txt"]);
}

#[test]
fn export_copies_matching_files_with_digests() {
    let w = ws();
    fs::create_dir_all(w.out.join("reports/2024")).unwrap();
    fs::write(w.out.join("reports/2024/q1.pdf"), "q1").unwrap();
    fs::write(w.out.join("reports/2024/notes.md"), "not an artifact").unwrap();
    fs::write(w.out.join("reports/summary.pdf"), "summary").unwrap();
    fs::write(w.out.join("scratch.log"), "not an artifact").unwrap();
    fs::write(w.out.join("empty.txt"), "").unwrap();
    fs::create_dir(w.out.join("dir.txt")).unwrap();
    let p = pats(&["*.txt", "reports/**/*.pdf"]);
    let list = artifacts::list(&w.out, &p, MAX).unwrap();
    assert_eq!(
        refusal(&list, "dir.txt"),
        "a directory: only files are artifacts"
    );
    let ex = artifacts::export(&w.out, &p, MAX, &none(), &w.dest).unwrap();
    let got: Vec<_> = ex
        .iter()
        .map(|e| (e.path.as_str(), e.size, e.sha256.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("empty.txt", 0, sha(b"")),
            ("ok.txt", 2, sha(b"ok")),
            ("reports/2024/q1.pdf", 2, sha(b"q1")),
            ("reports/summary.pdf", 7, sha(b"summary")),
        ]
    );
    assert_eq!(
        files(&w.dest),
        vec![
            "empty.txt",
            "ok.txt",
            "reports/2024/q1.pdf",
            "reports/summary.pdf"
        ]
    );
    for e in &ex {
        assert_eq!(sha(&fs::read(w.dest.join(&e.path)).unwrap()), e.sha256);
    }
    assert_eq!(
        fs::metadata(&w.dest).unwrap().permissions().mode() & 0o777,
        0o700
    );
    // a destination that is not empty is refused, and left alone
    let err = artifacts::export(&w.out, &p, MAX, &none(), &w.dest).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    // a bad pattern is an error, not an empty list
    assert!(artifacts::list(&w.out, &pats(&["../x"]), MAX).is_err());
}

#[test]
fn export_over_the_size_limit_needs_approval() {
    let w = ws();
    fs::write(w.out.join("big.txt"), vec![b'x'; 2048]).unwrap();
    let p = pats(&["*.txt"]);
    let list = artifacts::list(&w.out, &p, 1024).unwrap();
    assert_eq!(
        refusal(&list, "big.txt"),
        "2048 bytes, over the limit of 1024: needs approval"
    );
    let ex = artifacts::export(&w.out, &p, 1024, &none(), &w.dest).unwrap();
    assert_eq!(ex.len(), 1);
    assert_eq!(files(&w.dest), vec!["ok.txt"]);

    let approved = w.dest.with_file_name("approved");
    let yes = artifacts::Approved::from([artifacts::parse_approval("big.txt=2048").unwrap()]);
    let ex = artifacts::export(&w.out, &p, 1024, &yes, &approved).unwrap();
    let big = ex.iter().find(|e| e.path == "big.txt").unwrap();
    assert_eq!(big.size, 2048);
    assert_eq!(fs::metadata(approved.join("big.txt")).unwrap().len(), 2048);
    assert_eq!(fs::metadata(approved.join("big.txt")).unwrap().nlink(), 1);
}

/// Issue 26: a human approved `big.txt` at the 2048 bytes it was listed
/// at; the server grows it before the export. The grown file stays (a new
/// question), nothing of it is copied; an approval for another path
/// approves nothing.
#[test]
fn an_artifact_grown_after_it_was_approved_is_not_exported() {
    let w = ws();
    fs::write(w.out.join("big.txt"), vec![b'x'; 2048]).unwrap();
    let p = pats(&["*.txt"]);
    let yes = artifacts::Approved::from([artifacts::parse_approval("big.txt=2048").unwrap()]);
    fs::write(w.out.join("big.txt"), vec![b'x'; 4096]).unwrap();
    let ex = artifacts::export(&w.out, &p, 1024, &yes, &w.dest).unwrap();
    assert!(ex.iter().all(|e| e.path != "big.txt"), "{ex:?}");
    assert!(!w.dest.join("big.txt").exists());
    let other = artifacts::Approved::from([("ok.txt".to_string(), 1 << 30)]);
    let d2 = w.dest.with_file_name("other");
    let ex = artifacts::export(&w.out, &p, 1024, &other, &d2).unwrap();
    assert!(ex.iter().all(|e| e.path != "big.txt"), "{ex:?}");
}

#[test]
fn an_approval_argument_is_path_equals_bytes() {
    assert_eq!(
        artifacts::parse_approval("a=b/c.bin=42").unwrap(),
        ("a=b/c.bin".to_string(), 42)
    );
    assert!(artifacts::parse_approval("c.bin").is_err());
    assert!(artifacts::parse_approval("c.bin=-1").is_err());
    assert!(artifacts::parse_approval("=5").is_err());
}
