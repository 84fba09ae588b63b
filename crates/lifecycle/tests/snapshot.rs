//! Snapshots and restores, and the crafted archives a restore refuses.
//! Each refusal test builds its archive by hand and checks the error and
//! that nothing was written at or beside the destination.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use mcpbox_lifecycle::snapshot::{self, Error, Limits};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

fn sha(data: &[u8]) -> String {
    mcpbox_policy::hex::encode(&Sha256::digest(data))
}

type Tar = tar::Builder<GzEncoder<Vec<u8>>>;

/// A gzip-compressed tar built by `f`, written to `dir/a.tgz`.
fn archive(dir: &Path, f: impl FnOnce(&mut Tar)) -> PathBuf {
    let mut b = tar::Builder::new(GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    f(&mut b);
    let bytes = b.into_inner().unwrap().finish().unwrap();
    let p = dir.join("a.tgz");
    fs::write(&p, bytes).unwrap();
    p
}

fn manifest(entries: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "format": "mcpbox-snapshot/1",
        "parts": ["output"],
        "entries": entries,
    }))
    .unwrap()
}

fn dir_entry(path: &str) -> Value {
    json!({"path": path, "kind": "dir", "size": 0, "mode": "0755"})
}

fn file_entry(path: &str, data: &[u8]) -> Value {
    json!({"path": path, "kind": "file", "size": data.len(), "mode": "0644", "sha256": sha(data)})
}

/// An entry whose name is written raw into the header (the tar crate's
/// `set_path` would refuse or normalise it).
fn raw(b: &mut Tar, kind: EntryType, name: &[u8], data: &[u8], link: Option<&[u8]>) {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l);
    }
    h.set_cksum();
    b.append(&h, data).unwrap();
}

fn file(b: &mut Tar, name: &str, data: &[u8]) {
    raw(b, EntryType::Regular, name.as_bytes(), data, None);
}

fn dir(b: &mut Tar, name: &str) {
    raw(b, EntryType::Directory, name.as_bytes(), b"", None);
}

/// The restore failed and left nothing: no `dest`, nothing but the
/// archive beside it.
fn assert_nothing_written(t: &Path, dest: &Path) {
    assert!(fs::symlink_metadata(dest).is_err(), "{dest:?} exists");
    let names: Vec<_> = fs::read_dir(t)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["a.tgz".to_string()], "left beside dest");
}

fn refused(t: &Path, archive: &Path) -> Error {
    let dest = t.join("restored");
    let err = snapshot::restore(archive, &dest).expect_err("the restore must refuse");
    assert_nothing_written(t, &dest);
    err
}

/// path -> (kind, mode, content digest) of a tree, not following symlinks.
fn tree(root: &Path) -> BTreeMap<String, (String, u32, String)> {
    fn go(root: &Path, dir: &Path, out: &mut BTreeMap<String, (String, u32, String)>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let mode = m.mode() & 0o7777;
            if m.is_dir() {
                out.insert(rel, ("dir".into(), mode, String::new()));
                go(root, &p, out);
            } else if m.is_file() {
                out.insert(rel, ("file".into(), mode, sha(&fs::read(&p).unwrap())));
            } else {
                out.insert(rel, ("other".into(), mode, String::new()));
            }
        }
    }
    let mut out = BTreeMap::new();
    go(root, root, &mut out);
    out
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn snapshot_restores_with_identical_digests() {
    // the modes below assume it (process-wide; every test here is fine with 022)
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let t = tempfile::tempdir().unwrap();
    let ws = t.path().join("ws");
    let out = ws.join("output");
    let tmp = ws.join("tmp");
    fs::create_dir_all(out.join("sub/deeper")).unwrap();
    fs::create_dir_all(out.join("empty-dir")).unwrap();
    fs::create_dir_all(&tmp).unwrap();
    fs::write(out.join("a.txt"), "hello\n").unwrap();
    fs::write(out.join("empty.txt"), "").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(out.join("sub/deeper/big.bin"), &big).unwrap();
    fs::write(out.join("run.sh"), "#!/bin/sh\n").unwrap();
    chmod(&out.join("run.sh"), 0o755);
    fs::write(out.join("private"), "k").unwrap();
    chmod(&out.join("private"), 0o600);
    chmod(&out.join("sub"), 0o750);
    let long = "n".repeat(120);
    fs::write(out.join("sub").join(&long), "long name").unwrap();
    fs::write(tmp.join("scratch"), "s").unwrap();

    let archive = t.path().join("snap.tgz");
    let info = snapshot::write(&[("output", &out), ("tmp", &tmp)], &archive).unwrap();
    assert_eq!(fs::metadata(&archive).unwrap().mode() & 0o777, 0o600);
    // output, sub, deeper, empty-dir, tmp + 7 files
    assert_eq!(info.entries, 12);
    assert_eq!(info.bytes, 6 + big.len() as u64 + 10 + 1 + 9 + 1);
    assert!(info.skipped.is_empty());

    let checked = snapshot::verify(&archive, &Limits::default()).unwrap();
    assert_eq!(checked.entries.len(), info.entries);

    let dest = t.path().join("restored");
    let r = snapshot::restore(&archive, &dest).unwrap();
    assert_eq!(r.manifest_sha256, info.manifest_sha256);
    assert_eq!(r.entries, info.entries);
    assert_eq!(r.parts, vec!["output", "tmp"]);
    assert_eq!(fs::metadata(&dest).unwrap().mode() & 0o777, 0o700);
    let mut want = tree(&ws);
    // the workspace root is not a part; the restored root is ours (0700)
    want.retain(|k, _| k.starts_with("output") || k.starts_with("tmp"));
    assert_eq!(tree(&dest), want);
    assert_eq!(
        fs::read(dest.join("output/sub/deeper/big.bin")).unwrap(),
        big
    );
    assert_eq!(
        fs::metadata(dest.join("output/sub")).unwrap().mode() & 0o777,
        0o750
    );

    // the first entry is the manifest, and it names every file's digest
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(
        fs::File::open(&archive).unwrap(),
    ));
    let mut first = ar.entries().unwrap().next().unwrap().unwrap();
    assert_eq!(&*first.path_bytes(), b"MANIFEST.json");
    let mut text = String::new();
    first.read_to_string(&mut text).unwrap();
    let m: snapshot::Manifest = serde_json::from_str(&text).unwrap();
    let a = m.entries.iter().find(|e| e.path == "output/a.txt").unwrap();
    assert_eq!(a.sha256.as_deref(), Some(sha(b"hello\n").as_str()));
    assert_eq!(a.mode, 0o644);

    // an existing archive is not overwritten, a symlink there not followed
    let err = snapshot::write(&[("output", &out)], &archive).unwrap_err();
    assert!(err.to_string().contains("snapshot: archive"), "{err}");
    let target = t.path().join("victim");
    fs::write(&target, "keep").unwrap();
    let link = t.path().join("link.tgz");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert!(snapshot::write(&[("output", &out)], &link).is_err());
    assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
}

#[test]
fn snapshot_skips_symlinks_fifos_and_devices_left_in_the_workspace() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("output");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("real.txt"), "real").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", out.join("passwd")).unwrap();
    std::os::unix::fs::symlink("/etc", out.join("etc")).unwrap();
    fs::hard_link(out.join("real.txt"), out.join("hard.txt")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        out.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(out.join("sock")).unwrap();
    let root = rustix::process::geteuid().is_root();
    if root {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            out.join("null"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 3),
        )
        .unwrap();
    } else {
        eprintln!("not root: the device node part of this test is skipped (mknod needs CAP_MKNOD)");
    }

    let archive = t.path().join("a.tgz");
    let info = snapshot::write(&[("output", &out)], &archive).unwrap();
    let mut skipped: Vec<(String, String)> = info
        .skipped
        .iter()
        .map(|s| (s.path.clone(), s.kind.clone()))
        .collect();
    skipped.sort();
    let mut want = vec![
        ("output/etc".to_string(), "symlink".to_string()),
        ("output/fifo".into(), "fifo".into()),
        ("output/passwd".into(), "symlink".into()),
        ("output/sock".into(), "socket".into()),
    ];
    if root {
        want.push(("output/null".into(), "char-device".into()));
        want.sort();
    }
    assert_eq!(skipped, want);

    // the archive holds only files and directories
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(
        fs::File::open(&archive).unwrap(),
    ));
    let mut names = Vec::new();
    for e in ar.entries().unwrap() {
        let e = e.unwrap();
        let ty = e.header().entry_type();
        assert!(ty.is_file() || ty.is_dir(), "{ty:?}");
        names.push(String::from_utf8(e.path_bytes().to_vec()).unwrap());
    }
    assert_eq!(
        names,
        vec![
            "MANIFEST.json",
            "output",
            "output/hard.txt",
            "output/real.txt"
        ]
    );

    let dest = t.path().join("restored");
    let r = snapshot::restore(&archive, &dest).unwrap();
    assert_eq!(r.skipped.len(), want.len());
    assert_eq!(
        fs::read_to_string(dest.join("output/hard.txt")).unwrap(),
        "real"
    );
    assert_eq!(
        fs::metadata(dest.join("output/hard.txt")).unwrap().nlink(),
        1
    );
    let restored: Vec<_> = tree(&dest).into_keys().collect();
    assert_eq!(
        restored,
        vec!["output", "output/hard.txt", "output/real.txt"]
    );
}

#[test]
fn restore_refuses_a_digest_mismatch_before_writing() {
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        // the first file is fine: a restore that wrote as it read would
        // have written it already
        let m = manifest(json!([
            dir_entry("output"),
            file_entry("output/fine.txt", b"fine"),
            file_entry("output/a.txt", b"hello"),
        ]));
        file(b, "MANIFEST.json", &m);
        dir(b, "output");
        file(b, "output/fine.txt", b"fine");
        file(b, "output/a.txt", b"HELLO");
    });
    let err = refused(t.path(), &a);
    assert_eq!(
        err.to_string(),
        "restore: entry \"output/a.txt\": a digest mismatch: its SHA-256 is not the manifest's"
    );
}

#[test]
fn restore_refuses_a_dotdot_entry() {
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        file(b, "MANIFEST.json", &manifest(json!([dir_entry("output")])));
        dir(b, "output");
        file(b, "output/../x", b"escaped");
    });
    let err = refused(t.path(), &a);
    assert_eq!(
        err.to_string(),
        "restore: entry \"output/../x\": a path with '..'"
    );
    assert!(!t.path().join("x").exists());

    // and in the manifest too
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        let m = manifest(json!([
            dir_entry("output"),
            file_entry("output/../x", b"e")
        ]));
        file(b, "MANIFEST.json", &m);
    });
    let err = refused(t.path(), &a);
    assert!(
        matches!(err, Error::Entry { ref path, .. } if path == "output/../x"),
        "{err}"
    );
}

#[test]
fn restore_refuses_an_absolute_path() {
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        file(b, "MANIFEST.json", &manifest(json!([dir_entry("output")])));
        dir(b, "output");
        file(b, "/tmp/mcpbox-restore-absolute", b"escaped");
    });
    let err = refused(t.path(), &a);
    assert_eq!(
        err.to_string(),
        "restore: entry \"/tmp/mcpbox-restore-absolute\": an absolute path"
    );
    assert!(!Path::new("/tmp/mcpbox-restore-absolute").exists());
}

#[test]
fn restore_refuses_a_symlink_entry() {
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        file(b, "MANIFEST.json", &manifest(json!([dir_entry("output")])));
        dir(b, "output");
        raw(
            b,
            EntryType::Symlink,
            b"output/passwd",
            b"",
            Some(b"/etc/passwd"),
        );
    });
    let err = refused(t.path(), &a);
    assert!(matches!(err, Error::Entry { ref path, .. } if path == "output/passwd"));
    assert!(err.to_string().contains("a symlink entry"), "{err}");
}

#[test]
fn restore_refuses_a_hardlink_entry() {
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        let m = manifest(json!([
            dir_entry("output"),
            file_entry("output/passwd", b"")
        ]));
        file(b, "MANIFEST.json", &m);
        dir(b, "output");
        raw(
            b,
            EntryType::Link,
            b"output/passwd",
            b"",
            Some(b"/etc/passwd"),
        );
    });
    let err = refused(t.path(), &a);
    assert!(err.to_string().contains("a hardlink entry"), "{err}");
}

#[test]
fn restore_refuses_a_device_entry() {
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        file(b, "MANIFEST.json", &manifest(json!([dir_entry("output")])));
        dir(b, "output");
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Char);
        h.set_size(0);
        h.set_mode(0o666);
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
        h.as_old_mut().name[..11].copy_from_slice(b"output/null");
        h.set_cksum();
        b.append(&h, &b""[..]).unwrap();
    });
    let err = refused(t.path(), &a);
    assert_eq!(
        err.to_string(),
        "restore: entry \"output/null\": a character device entry (only files and directories are restored)"
    );
}

#[test]
fn restore_refuses_an_entry_missing_from_the_manifest() {
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        let m = manifest(json!([
            dir_entry("output"),
            file_entry("output/a.txt", b"a")
        ]));
        file(b, "MANIFEST.json", &m);
        dir(b, "output");
        file(b, "output/a.txt", b"a");
        file(b, "output/extra.txt", b"smuggled");
    });
    let err = refused(t.path(), &a);
    assert_eq!(
        err.to_string(),
        "restore: entry \"output/extra.txt\": not in the manifest"
    );

    // the other way round: the manifest promises what the archive lacks
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        let m = manifest(json!([
            dir_entry("output"),
            file_entry("output/a.txt", b"a")
        ]));
        file(b, "MANIFEST.json", &m);
        dir(b, "output");
    });
    let err = refused(t.path(), &a);
    assert!(
        err.to_string()
            .contains("in the manifest but not in the archive"),
        "{err}"
    );

    // a duplicate, and an entry outside the parts (a second manifest)
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        let m = manifest(json!([
            dir_entry("output"),
            file_entry("output/a.txt", b"a")
        ]));
        file(b, "MANIFEST.json", &m);
        dir(b, "output");
        file(b, "output/a.txt", b"a");
        file(b, "output/a.txt", b"a");
    });
    assert!(refused(t.path(), &a)
        .to_string()
        .contains("a duplicate entry"));
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        file(b, "MANIFEST.json", &manifest(json!([dir_entry("output")])));
        dir(b, "output");
        file(b, "MANIFEST.json", b"{}");
    });
    assert!(refused(t.path(), &a)
        .to_string()
        .contains("outside the snapshot's parts"));
}

/// A stream of `n` zeros that is never held in memory.
fn zeros(n: u64) -> impl Read {
    std::io::repeat(0).take(n)
}

#[test]
fn restore_refuses_a_gzip_bomb() {
    const BOMB: u64 = 16 << 20;
    let small = Limits {
        max_bytes: 1 << 20,
        ..Limits::default()
    };
    let zeros_sha = {
        let mut h = Sha256::new();
        std::io::copy(&mut zeros(BOMB), &mut h).unwrap();
        mcpbox_policy::hex::encode(&h.finalize())
    };
    let bomb_entry = json!({"path": "output/zeros", "kind": "file", "size": BOMB, "mode": "0644", "sha256": zeros_sha});

    // 1. an honest manifest over the byte limit: refused before any data
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        file(
            b,
            "MANIFEST.json",
            &manifest(json!([dir_entry("output"), bomb_entry])),
        );
        dir(b, "output");
        let mut h = Header::new_gnu();
        h.set_size(BOMB);
        h.set_mode(0o644);
        b.append_data(&mut h, "output/zeros", zeros(BOMB)).unwrap();
    });
    let dest = t.path().join("restored");
    let err = snapshot::restore_with(&a, &dest, &small).unwrap_err();
    assert_eq!(
        err.to_string(),
        "restore: the files add up to more than 1048576 bytes"
    );
    assert_nothing_written(t.path(), &dest);

    // 2. a manifest that declares one byte, a header that declares 16 MiB
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        let m = manifest(json!([
            dir_entry("output"),
            file_entry("output/zeros", b"\0")
        ]));
        file(b, "MANIFEST.json", &m);
        dir(b, "output");
        let mut h = Header::new_gnu();
        h.set_size(BOMB);
        h.set_mode(0o644);
        b.append_data(&mut h, "output/zeros", zeros(BOMB)).unwrap();
    });
    let err = refused(t.path(), &a);
    assert!(
        err.to_string()
            .contains("16777216 bytes in the archive, 1 in the manifest"),
        "{err}"
    );

    // 3. a GNU long name of 16 MiB (the tar parser would buffer it all):
    //    stopped by the stream budget the manifest accounts for
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        file(b, "MANIFEST.json", &manifest(json!([dir_entry("output")])));
        dir(b, "output");
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::GNULongName);
        h.set_size(BOMB);
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_cksum();
        b.append(&h, zeros(BOMB)).unwrap();
        file(b, "output/x", b"x");
    });
    let err = refused(t.path(), &a);
    assert_eq!(
        err.to_string(),
        "restore: the archive holds more data than its manifest accounts for"
    );

    // 4. a manifest over its own limit
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        let mut h = Header::new_gnu();
        h.set_size(65 << 20);
        h.set_mode(0o644);
        b.append_data(&mut h, "MANIFEST.json", zeros(65 << 20))
            .unwrap();
    });
    let err = refused(t.path(), &a);
    assert!(
        err.to_string().contains("a manifest of 68157440 bytes"),
        "{err}"
    );

    // 5. zeros after the end of the archive are fine, data is not
    let t = tempfile::tempdir().unwrap();
    let p = archive(t.path(), |b| {
        file(b, "MANIFEST.json", &manifest(json!([dir_entry("output")])));
        dir(b, "output");
    });
    let mut tar_bytes = Vec::new();
    flate2::read::GzDecoder::new(fs::File::open(&p).unwrap())
        .read_to_end(&mut tar_bytes)
        .unwrap();
    tar_bytes.extend_from_slice(&[b'x'; 512]);
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar_bytes).unwrap();
    fs::write(&p, gz.finish().unwrap()).unwrap();
    let err = refused(t.path(), &p);
    assert_eq!(
        err.to_string(),
        "restore: data after the end of the archive"
    );
}

/// Issue 26: a second gzip member after a valid archive was never read by
/// the check, and a gzip tool (or a later reader) would append its bytes.
/// Refused, whatever it holds, with nothing written; so is plain garbage.
#[test]
fn restore_refuses_a_second_gzip_member_or_bytes_after_the_gzip_stream() {
    for tail in ["member", "garbage"] {
        let (src, t) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let out = src.path().join("output");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("f"), "f").unwrap();
        let p = t.path().join("a.tgz");
        snapshot::write(&[("output", &out)], &p).unwrap();
        let mut bytes = fs::read(&p).unwrap();
        if tail == "member" {
            let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(b"smuggled bytes no check ever read").unwrap();
            bytes.extend(gz.finish().unwrap());
        } else {
            bytes.extend_from_slice(b"trailing garbage");
        }
        fs::write(&p, bytes).unwrap();
        let err = refused(t.path(), &p);
        assert!(
            err.to_string().contains("after the archive's gzip stream"),
            "{tail}: {err}"
        );
        assert!(snapshot::verify(&p, &Limits::default()).is_err(), "{tail}");
    }
}

/// Issue 26: snapshot writing had no byte limit while restore refuses an
/// archive over its limits: an archive nobody could restore. Now writing
/// refuses it first, with the reason, and leaves no file.
#[test]
fn snapshot_refuses_what_restore_would_refuse_before_writing() {
    let (src, t) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = src.path().join("output");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("a"), vec![b'a'; 600]).unwrap();
    fs::write(out.join("b"), vec![b'b'; 600]).unwrap();
    let p = t.path().join("a.tgz");
    let limits = Limits {
        max_bytes: 1000,
        ..Limits::default()
    };
    let err = snapshot::write_with(&[("output", &out)], &p, &[], &limits).unwrap_err();
    assert!(err.to_string().contains("more than 1000 bytes"), "{err}");
    assert_eq!(
        fs::read_dir(t.path()).unwrap().count(),
        0,
        "something was written"
    );
    // within the limit, what is written restores under the same limits
    fs::remove_file(out.join("b")).unwrap();
    snapshot::write_with(&[("output", &out)], &p, &[], &limits).unwrap();
    snapshot::restore_with(&p, &t.path().join("r"), &limits).unwrap();
}

#[test]
fn restore_refuses_a_destination_that_is_not_empty() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("output");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("f"), "f").unwrap();
    let a = t.path().join("a.tgz");
    snapshot::write(&[("output", &out)], &a).unwrap();
    let dest = t.path().join("dest");
    fs::create_dir(&dest).unwrap();
    fs::write(dest.join("mine"), "mine").unwrap();
    let err = snapshot::restore(&a, &dest).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    assert_eq!(fs::read_to_string(dest.join("mine")).unwrap(), "mine");
    // an empty directory is fine
    let empty = t.path().join("empty");
    fs::create_dir(&empty).unwrap();
    snapshot::restore(&a, &empty).unwrap();
    assert_eq!(fs::read_to_string(empty.join("output/f")).unwrap(), "f");
}

#[test]
fn restore_refuses_a_part_it_does_not_know() {
    // a snapshot of "etc" is well-formed, but not a workspace part
    let t = tempfile::tempdir().unwrap();
    let a = archive(t.path(), |b| {
        let m = serde_json::to_vec(&json!({
            "format": "mcpbox-snapshot/1",
            "parts": ["etc"],
            "entries": [dir_entry("etc"), file_entry("etc/passwd", b"x")],
        }))
        .unwrap();
        file(b, "MANIFEST.json", &m);
        dir(b, "etc");
        file(b, "etc/passwd", b"x");
    });
    let err = refused(t.path(), &a);
    assert_eq!(
        err.to_string(),
        "restore: manifest: part \"etc\" is not one of output, tmp"
    );
}
