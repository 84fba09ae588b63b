//! The one parser of `/proc/self/mountinfo` (proc(5)): the cgroup layout
//! ([`crate::cgroup::Layout`]) and the workspace volumes of `serve` and
//! `run --builtin` (the binary's `volume` module) read their mounts here.

use std::path::PathBuf;

/// One line of mountinfo: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3
/// /dev/root rw,errors=continue".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// "major:minor" of the filesystem's device.
    pub device: String,
    /// Where it is mounted (octal escapes such as `\040` undone).
    pub mount_point: PathBuf,
    pub fstype: String,
    /// The mount source ("/dev/loop3", "tmpfs", ...), escapes undone.
    pub source: String,
    /// The superblock's options ("rw,size=4096k").
    pub super_options: String,
}

/// The mounts of `/proc/self/mountinfo`, in its order (a later mount on
/// the same point is on top); empty when it cannot be read.
pub fn read() -> Vec<Mount> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// Parses mountinfo text (pure, for tests). A line that does not have the
/// shape proc(5) gives is skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        // the optional fields end at " - "; the mount point cannot hold a
        // literal space (it is escaped as \040), so the split is exact
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(device), Some(mnt), Some(fstype)) = (fields.get(2), fields.get(4), right.first())
        else {
            continue;
        };
        out.push(Mount {
            device: (*device).to_string(),
            mount_point: PathBuf::from(unescape(mnt)),
            fstype: (*fstype).to_string(),
            source: unescape(right.get(1).copied().unwrap_or("")),
            super_options: right.get(2).copied().unwrap_or("").to_string(),
        });
    }
    out
}

/// The topmost mount whose mount point is exactly `at`.
pub fn at<'a>(mounts: &'a [Mount], at: &std::path::Path) -> Option<&'a Mount> {
    mounts.iter().rev().find(|m| m.mount_point == at)
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012`
/// newline, `\134` backslash) of a mountinfo field.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        if let (b'\\', Some(v)) = (b[i], octal) {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const TEXT: &str = "\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
27 22 0:23 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw,nsdelegate
40 22 7:3 / /var/lib/mcpbox/sandboxes/ab12/volume rw,nosuid,nodev - ext4 /dev/loop3 rw
41 22 0:50 / /tmp/with\\040space rw - tmpfs tmp\\040fs rw,size=4096k
garbage line without the separator
42 22 7:4 / /var/lib/mcpbox/sandboxes/ab12/volume rw - ext4 /dev/loop4 rw
";

    #[test]
    fn parses_fields_and_undoes_escapes() {
        let m = parse(TEXT);
        assert_eq!(m.len(), 5);
        assert_eq!(m[1].fstype, "cgroup2");
        assert_eq!(m[1].mount_point, Path::new("/sys/fs/cgroup"));
        assert_eq!(m[2].device, "7:3");
        assert_eq!(m[2].source, "/dev/loop3");
        assert_eq!(m[3].mount_point, Path::new("/tmp/with space"));
        assert_eq!(m[3].source, "tmp fs");
        assert_eq!(m[3].super_options, "rw,size=4096k");
    }

    #[test]
    fn at_finds_the_topmost_mount_on_a_point_only() {
        let m = parse(TEXT);
        let top = at(&m, Path::new("/var/lib/mcpbox/sandboxes/ab12/volume")).unwrap();
        assert_eq!(top.source, "/dev/loop4");
        assert!(at(&m, Path::new("/var/lib/mcpbox/sandboxes/ab1")).is_none());
        assert!(at(&m, Path::new("/var/lib/mcpbox/sandboxes")).is_none());
    }

    #[test]
    fn a_lone_backslash_is_kept() {
        assert_eq!(unescape("a\\b\\04"), "a\\b\\04");
        assert_eq!(unescape("a\\134b"), "a\\b");
    }
}
