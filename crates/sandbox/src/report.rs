//! The report pipe: how the sandbox's children tell the supervisor what
//! happened, in fixed-size binary records.
//!
//! A child writes one [`Record`] (16 bytes, well under PIPE_BUF, so a write
//! is atomic, pipe(7)) from a stack buffer with one write(2): no formatting,
//! no allocation after fork. The supervisor turns a failure into an error
//! naming the [`ChildStep`] and the errno; EOF on the pipe (every write end
//! closed, the command's by its execve, close-on-exec) means the command is
//! running.

use std::os::fd::RawFd;

use crate::sys;

/// Every step a child of the supervisor can fail at, in the order the
/// sequence runs them (ARCHITECTURE.md, "The sandbox sequence").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ChildStep {
    // the supervisor's clone(2) into the new namespaces: its errno is
    // reported as this step, which is what sends [`crate::spawn`] to the
    // degraded tier (no user namespaces here)
    Unshare = 4,
    // init (3, 5 and 6 were the steps of a holder process, gone)
    Pdeathsig = 1,
    Stdio = 2,
    CgroupNamespace = 7,
    Setsid = 10,
    BlockSignals = 11,
    /// One operation of building the root; the record's `arg` is its index
    /// in the prepared list, whose label the supervisor shows.
    Root = 12,
    Sethostname = 13,
    LoopbackUp = 14,
    LandlockRuleset = 15,
    BindBridge = 16,
    ForkBridge = 17,
    ForkCommand = 18,
    NetCapture = 19,
    // the last mile (command, degraded command, bridge)
    Session = 20,
    Chdir = 21,
    Setrlimit = 22,
    CloseFds = 23,
    BoundingSet = 24,
    Ambient = 25,
    Setgroups = 26,
    Setresuid = 27,
    Capset = 28,
    NoNewPrivs = 29,
    Landlock = 30,
    Seccomp = 31,
    Execve = 32,
}

impl ChildStep {
    const ALL: &'static [ChildStep] = &[
        ChildStep::Unshare,
        ChildStep::Pdeathsig,
        ChildStep::Stdio,
        ChildStep::CgroupNamespace,
        ChildStep::Setsid,
        ChildStep::BlockSignals,
        ChildStep::Root,
        ChildStep::Sethostname,
        ChildStep::LoopbackUp,
        ChildStep::LandlockRuleset,
        ChildStep::BindBridge,
        ChildStep::ForkBridge,
        ChildStep::ForkCommand,
        ChildStep::NetCapture,
        ChildStep::Session,
        ChildStep::Chdir,
        ChildStep::Setrlimit,
        ChildStep::CloseFds,
        ChildStep::BoundingSet,
        ChildStep::Ambient,
        ChildStep::Setgroups,
        ChildStep::Setresuid,
        ChildStep::Capset,
        ChildStep::NoNewPrivs,
        ChildStep::Landlock,
        ChildStep::Seccomp,
        ChildStep::Execve,
    ];

    /// The step's name, as errors show it.
    pub fn name(self) -> &'static str {
        match self {
            ChildStep::Pdeathsig => "pdeathsig",
            ChildStep::Stdio => "stdio",
            ChildStep::Unshare => "unshare",
            ChildStep::CgroupNamespace => "cgroup namespace",
            ChildStep::Setsid => "setsid",
            ChildStep::BlockSignals => "block signals",
            ChildStep::Root => "build the root",
            ChildStep::Sethostname => "sethostname",
            ChildStep::LoopbackUp => "loopback up",
            ChildStep::LandlockRuleset => "landlock ruleset",
            ChildStep::BindBridge => "bind the egress bridge",
            ChildStep::ForkBridge => "fork egress bridge",
            ChildStep::ForkCommand => "fork command",
            ChildStep::NetCapture => "transparent egress capture (route and nftables rule)",
            ChildStep::Session => "session",
            ChildStep::Chdir => "chdir",
            ChildStep::Setrlimit => "setrlimit",
            ChildStep::CloseFds => "close fds",
            ChildStep::BoundingSet => "drop bounding set",
            ChildStep::Ambient => "clear ambient capabilities",
            ChildStep::Setgroups => "setgroups",
            ChildStep::Setresuid => "setresuid",
            ChildStep::Capset => "capset",
            ChildStep::NoNewPrivs => "no_new_privs",
            ChildStep::Landlock => "landlock",
            ChildStep::Seccomp => "seccomp",
            ChildStep::Execve => "execve",
        }
    }

    pub(crate) fn from_u16(v: u16) -> Option<ChildStep> {
        ChildStep::ALL.iter().copied().find(|s| *s as u16 == v)
    }
}

impl std::fmt::Display for ChildStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One message on the report (or status) pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// A step failed with `errno`; `arg` says more for some steps (the
    /// index of the root operation).
    Failed {
        step: ChildStep,
        errno: i32,
        arg: i32,
    },
    /// execve of every candidate failed: `code` is 127 (not found) or 126
    /// (cannot run), `errno` the decisive error.
    ExecFailed { code: i32, errno: i32 },
    /// On the status pipe: the init ended with this code (128+N: signal N).
    Ended(i32),
    /// From the helper: the policy's timeout ran out, the sandbox was killed.
    TimedOut,
    /// From the helper: the memory cgroup killed a process; the code.
    OutOfMemory(i32),
}

/// Size of one encoded record.
pub const SIZE: usize = 16;

// 1 and 2 were a holder process's records, gone.
const FAILED: u8 = 3;
const EXEC_FAILED: u8 = 4;
const ENDED: u8 = 5;
const TIMED_OUT: u8 = 6;
const OUT_OF_MEMORY: u8 = 7;

impl Record {
    /// `[tag u8, 0 u8, step u16, errno i32, arg i32, 0 u32]`, little endian.
    pub fn encode(self) -> [u8; SIZE] {
        let (tag, step, a, b) = match self {
            Record::Failed { step, errno, arg } => (FAILED, step as u16, errno, arg),
            Record::ExecFailed { code, errno } => (EXEC_FAILED, 0, errno, code),
            Record::Ended(code) => (ENDED, 0, 0, code),
            Record::TimedOut => (TIMED_OUT, 0, 0, 0),
            Record::OutOfMemory(code) => (OUT_OF_MEMORY, 0, 0, code),
        };
        let mut out = [0u8; SIZE];
        out[0] = tag;
        out[2..4].copy_from_slice(&step.to_le_bytes());
        out[4..8].copy_from_slice(&a.to_le_bytes());
        out[8..12].copy_from_slice(&b.to_le_bytes());
        out
    }

    /// The record in `buf`, or None when it is not one we write.
    pub fn decode(buf: &[u8; SIZE]) -> Option<Record> {
        let step = u16::from_le_bytes([buf[2], buf[3]]);
        let a = i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
        let b = i32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
        match buf[0] {
            FAILED => Some(Record::Failed {
                step: ChildStep::from_u16(step)?,
                errno: a,
                arg: b,
            }),
            EXEC_FAILED => Some(Record::ExecFailed { code: b, errno: a }),
            ENDED => Some(Record::Ended(b)),
            TIMED_OUT => Some(Record::TimedOut),
            OUT_OF_MEMORY => Some(Record::OutOfMemory(b)),
            _ => None,
        }
    }

    /// Writes the record with one write(2) from the stack. For children.
    pub fn send(self, fd: RawFd) -> std::io::Result<()> {
        sys::write_all(fd, &self.encode())
    }
}

/// Reads the next record: Ok(None) on EOF; a short or unknown record is an
/// error (a child died mid-write, or something else wrote on the pipe).
pub fn read(fd: RawFd) -> std::io::Result<Option<Record>> {
    let mut buf = [0u8; SIZE];
    let mut got = 0;
    while got < SIZE {
        let n = sys::read(fd, &mut buf[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    match got {
        0 => Ok(None),
        SIZE => Record::decode(&buf)
            .map(Some)
            .ok_or_else(|| std::io::Error::other("unknown record on the report pipe")),
        _ => Err(std::io::Error::other("short record on the report pipe")),
    }
}

/// A child's report of a failed step; the child then exits with 125.
pub fn fail(fd: RawFd, step: ChildStep, err: &std::io::Error) -> ! {
    fail_at(fd, step, 0, err)
}

/// [`fail`] with the step's argument (the root operation's index).
pub fn fail_at(fd: RawFd, step: ChildStep, arg: i32, err: &std::io::Error) -> ! {
    let errno = err.raw_os_error().unwrap_or(0);
    let _ = Record::Failed { step, errno, arg }.send(fd);
    sys::exit_now(125)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_survives_encode_and_decode() {
        let mut all = vec![
            Record::ExecFailed {
                code: 127,
                errno: libc::ENOENT,
            },
            Record::Ended(137),
            Record::Ended(-1),
            Record::TimedOut,
            Record::OutOfMemory(137),
        ];
        for (i, step) in ChildStep::ALL.iter().enumerate() {
            all.push(Record::Failed {
                step: *step,
                errno: libc::EPERM,
                arg: i as i32,
            });
        }
        for r in all {
            assert_eq!(Record::decode(&r.encode()), Some(r), "{r:?}");
        }
    }

    #[test]
    fn unknown_tags_and_steps_are_refused() {
        let mut buf = Record::TimedOut.encode();
        buf[0] = 99;
        assert_eq!(Record::decode(&buf), None);
        // the retired tags of the holder process
        for tag in [1, 2] {
            buf[0] = tag;
            assert_eq!(Record::decode(&buf), None);
        }
        let mut buf = Record::Failed {
            step: ChildStep::Seccomp,
            errno: 1,
            arg: 0,
        }
        .encode();
        buf[2..4].copy_from_slice(&999u16.to_le_bytes());
        assert_eq!(Record::decode(&buf), None);
    }

    #[test]
    fn step_numbers_and_names_are_unique() {
        let mut nums: Vec<u16> = ChildStep::ALL.iter().map(|s| *s as u16).collect();
        let mut names: Vec<&str> = ChildStep::ALL.iter().map(|s| s.name()).collect();
        nums.sort_unstable();
        nums.dedup();
        names.sort_unstable();
        names.dedup();
        assert_eq!(nums.len(), ChildStep::ALL.len());
        assert_eq!(names.len(), ChildStep::ALL.len());
    }

    #[test]
    fn a_record_read_back_from_a_pipe_is_the_one_written_and_eof_is_none() {
        use std::os::fd::AsRawFd;
        let (r, w) = sys::pipe().unwrap();
        Record::Ended(7).send(w.as_raw_fd()).unwrap();
        Record::Failed {
            step: ChildStep::Unshare,
            errno: libc::ENOSPC,
            arg: 0,
        }
        .send(w.as_raw_fd())
        .unwrap();
        drop(w);
        assert_eq!(read(r.as_raw_fd()).unwrap(), Some(Record::Ended(7)));
        assert_eq!(
            read(r.as_raw_fd()).unwrap(),
            Some(Record::Failed {
                step: ChildStep::Unshare,
                errno: libc::ENOSPC,
                arg: 0
            })
        );
        assert_eq!(read(r.as_raw_fd()).unwrap(), None);
    }

    #[test]
    fn a_short_record_is_an_error() {
        use std::os::fd::AsRawFd;
        let (r, w) = sys::pipe().unwrap();
        sys::write_all(w.as_raw_fd(), &[FAILED, 0, 4]).unwrap();
        drop(w);
        assert!(read(r.as_raw_fd()).is_err());
    }
}
