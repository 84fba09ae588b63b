//! The snapshot restore: `mcpbox_lifecycle::snapshot::restore` on an
//! archive an attacker wrote (a snapshot is a file anyone with the state
//! directory's rights, or a template's author, hands to the gateway).
//!
//! Input layout: the bytes of a tar stream, gzip-compressed by the target
//! before the restore (so the fuzzer works on tar headers and the
//! manifest, not on deflate), unless the first byte is `0xff`: then the
//! rest is used as the archive file as is (gzip framing, trailing bytes).
//!
//! Invariants:
//! - nothing panics;
//! - on success, everything under the destination is a regular file or a
//!   directory, inside the destination (no symlink, device, fifo or
//!   socket was written; nothing escaped through `..` or an absolute path);
//! - on failure, the destination does not exist and nothing was left
//!   beside it (the check comes before the first write, and a failed
//!   extraction is undone);
//! - nothing is ever written outside the scratch directory.
#![no_main]

use std::io::Write;
use std::path::Path;

use libfuzzer_sys::fuzz_target;

fn walk(root: &Path, dir: &Path) {
    for e in std::fs::read_dir(dir).expect("read a restored directory") {
        let e = e.expect("an entry");
        let p = e.path();
        assert!(
            p.starts_with(root),
            "{} is outside {}",
            p.display(),
            root.display()
        );
        let t = std::fs::symlink_metadata(&p).expect("stat").file_type();
        if t.is_dir() {
            walk(root, &p);
        } else {
            assert!(
                t.is_file(),
                "{} is neither a file nor a directory",
                p.display()
            );
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let archive = scratch.path().join("in.tar.gz");
    let bytes = match input.split_first() {
        Some((0xff, rest)) => rest.to_vec(),
        _ => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(input).expect("gzip in memory");
            gz.finish().expect("gzip in memory")
        }
    };
    std::fs::write(&archive, bytes).expect("write the archive");
    let box_dir = scratch.path().join("box");
    std::fs::create_dir(&box_dir).expect("mkdir");
    let dest = box_dir.join("dest");
    match mcpbox_lifecycle::snapshot::restore(&archive, &dest) {
        Ok(_) => walk(&dest, &dest),
        Err(_) => {
            assert!(!dest.exists(), "a refused restore left its destination");
            let left: Vec<_> = std::fs::read_dir(&box_dir).expect("read").collect();
            assert!(left.is_empty(), "a refused restore left {left:?}");
        }
    }
    // nothing beside the scratch files
    let mut names: Vec<String> = std::fs::read_dir(scratch.path())
        .expect("read")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["box", "in.tar.gz"]);
});
