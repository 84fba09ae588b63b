//! A small filesystem made by a test (root only): a tmpfs of a few MiB,
//! for the audit log or the whole state directory, to be filled.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a directory, unmounted (with what is mounted below
/// it, lazily) when dropped.
pub struct SmallFs {
    at: PathBuf,
    /// The fresh directory it is mounted on, when it made one.
    _dir: Option<tempfile::TempDir>,
}

impl SmallFs {
    /// A tmpfs of `size` ("4m") on a fresh directory.
    pub fn mount(size: &str) -> SmallFs {
        let dir = tempfile::Builder::new()
            .prefix("mcpbox-smallfs-")
            .tempdir()
            .unwrap();
        let mut fs = SmallFs::mount_at(dir.path(), size, "0755");
        fs._dir = Some(dir);
        fs
    }

    /// A tmpfs of `size` with `mode` on `at` (made when missing).
    pub fn mount_at(at: &Path, size: &str, mode: &str) -> SmallFs {
        std::fs::create_dir_all(at).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode={mode}"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs on {}", at.display());
        SmallFs {
            at: at.to_path_buf(),
            _dir: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.at
    }

    /// Writes a filler file until the filesystem is full.
    pub fn fill(&self) -> PathBuf {
        let filler = self.at.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0x5au8; 4096];
        while f.write_all(&chunk).is_ok() {}
        while f.write_all(&[0]).is_ok() {}
        let _ = f.sync_all();
        filler
    }

    /// Bytes free on it.
    pub fn free(&self) -> u64 {
        let out = Command::new("stat")
            .args(["-f", "-c", "%a %S"])
            .arg(&self.at)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
        it.next().unwrap() * it.next().unwrap()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .args(["-R", "-l"])
            .arg(&self.at)
            .status();
    }
}
