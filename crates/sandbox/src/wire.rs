//! What mcpbox and its sandbox helper tell each other over the control
//! socket before the report records start: the [`Spec`] one way, the
//! outcome of the start (the init's pid and the notes, or the typed
//! [`Error`]) the other. Length-prefixed frames of length-prefixed fields;
//! both ends are the same binary, so there is no versioning.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::time::Duration;

use crate::report::ChildStep;
use crate::{BindMount, Egress, Error, Limits, Spec, Stdio};

/// Largest frame accepted: a spec is a few KiB; this bounds a garbage length.
const MAX_FRAME: u32 = 64 << 20;

#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn os(&mut self, s: &std::ffi::OsStr) {
        self.bytes(s.as_bytes());
    }
    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u64(v);
            }
            None => self.u8(0),
        }
    }
    fn opt_path(&mut self, p: &Option<PathBuf>) {
        match p {
            Some(p) => {
                self.u8(1);
                self.os(p.as_os_str());
            }
            None => self.u8(0),
        }
    }
    fn io_error(&mut self, e: &io::Error) {
        self.i32(e.raw_os_error().unwrap_or(0));
        self.bytes(e.to_string().as_bytes());
    }
}

struct R<'a>(&'a [u8]);

fn bad() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed helper message")
}

impl R<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(bad());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i32(&mut self) -> io::Result<i32> {
        Ok(self.u32()? as i32)
    }
    fn u64(&mut self) -> io::Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn os(&mut self) -> io::Result<OsString> {
        Ok(OsString::from_vec(self.bytes()?))
    }
    fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| bad())
    }
    fn opt_u64(&mut self) -> io::Result<Option<u64>> {
        Ok(match self.u8()? {
            0 => None,
            _ => Some(self.u64()?),
        })
    }
    fn opt_path(&mut self) -> io::Result<Option<PathBuf>> {
        Ok(match self.u8()? {
            0 => None,
            _ => Some(PathBuf::from(self.os()?)),
        })
    }
    fn io_error(&mut self) -> io::Result<io::Error> {
        let errno = self.i32()?;
        let text = self.string()?;
        Ok(if errno != 0 {
            io::Error::from_raw_os_error(errno)
        } else {
            io::Error::other(text)
        })
    }
}

/// The spec, for the helper. The bridge function is not sent: the helper
/// is the same binary and is handed it at its entry point.
pub fn encode_spec(spec: &Spec) -> Vec<u8> {
    let mut w = W::default();
    w.u32(spec.argv.len() as u32);
    for a in &spec.argv {
        w.os(a);
    }
    w.u32(spec.env.len() as u32);
    for (k, v) in &spec.env {
        w.os(k);
        w.os(v);
    }
    w.opt_path(&spec.input);
    w.opt_path(&spec.output);
    w.u64(spec.tmp_size);
    w.u32(spec.mounts.len() as u32);
    for m in &spec.mounts {
        w.os(m.host.as_os_str());
        w.os(m.at.as_os_str());
        w.u8(m.writable as u8);
    }
    w.opt_u64(spec.limits.memory);
    w.opt_u64(spec.limits.pids);
    w.opt_u64(spec.limits.cpu.map(f64::to_bits));
    w.opt_u64(spec.limits.timeout.map(|t| t.as_nanos() as u64));
    match &spec.allow_exec {
        Some(list) => {
            w.u8(1);
            w.u32(list.len() as u32);
            for p in list {
                w.os(p.as_os_str());
            }
        }
        None => w.u8(0),
    }
    w.u8(spec.allow_degraded as u8);
    w.u8(match spec.stdio {
        Stdio::Inherit => 0,
        Stdio::Piped => 1,
    });
    match &spec.egress {
        Some(e) => {
            w.u8(1);
            w.os(e.socket_dir.as_os_str());
            w.u32(u32::from(e.port));
        }
        None => w.u8(0),
    }
    w.opt_path(&spec.tmp_dir);
    w.opt_path(&spec.cgroup_parent.as_ref().map(PathBuf::from));
    w.0
}

pub fn decode_spec(buf: &[u8], bridge: crate::BridgeFn) -> io::Result<Spec> {
    let mut r = R(buf);
    let argv = (0..r.u32()?).map(|_| r.os()).collect::<io::Result<_>>()?;
    let env = (0..r.u32()?)
        .map(|_| Ok((r.os()?, r.os()?)))
        .collect::<io::Result<_>>()?;
    let input = r.opt_path()?;
    let output = r.opt_path()?;
    let tmp_size = r.u64()?;
    let mounts = (0..r.u32()?)
        .map(|_| {
            Ok(BindMount {
                host: r.os()?.into(),
                at: r.os()?.into(),
                writable: r.u8()? != 0,
            })
        })
        .collect::<io::Result<_>>()?;
    let limits = Limits {
        memory: r.opt_u64()?,
        pids: r.opt_u64()?,
        cpu: r.opt_u64()?.map(f64::from_bits),
        timeout: r.opt_u64()?.map(Duration::from_nanos),
    };
    let allow_exec = match r.u8()? {
        0 => None,
        _ => Some(
            (0..r.u32()?)
                .map(|_| r.os().map(PathBuf::from))
                .collect::<io::Result<_>>()?,
        ),
    };
    let allow_degraded = r.u8()? != 0;
    let stdio = match r.u8()? {
        0 => Stdio::Inherit,
        _ => Stdio::Piped,
    };
    let egress = match r.u8()? {
        0 => None,
        _ => Some(Egress {
            socket_dir: r.os()?.into(),
            port: u16::try_from(r.u32()?).map_err(|_| bad())?,
            bridge,
        }),
    };
    let tmp_dir = r.opt_path()?;
    let cgroup_parent = match r.opt_path()? {
        Some(p) => Some(p.into_os_string().into_string().map_err(|_| bad())?),
        None => None,
    };
    if !r.0.is_empty() {
        return Err(bad());
    }
    Ok(Spec {
        argv,
        env,
        input,
        output,
        tmp_size,
        mounts,
        limits,
        allow_exec,
        allow_degraded,
        stdio,
        egress,
        tmp_dir,
        cgroup_parent,
    })
}

/// The helper's answer to a start: the init's pid and the notes, or why not.
pub type Started = Result<(i32, Vec<String>), Error>;

pub fn encode_started(started: &Started) -> Vec<u8> {
    let mut w = W::default();
    match started {
        Ok((init, notes)) => {
            w.u8(0);
            w.i32(*init);
            w.u32(notes.len() as u32);
            for n in notes {
                w.bytes(n.as_bytes());
            }
        }
        Err(e) => encode_error(&mut w, e),
    }
    w.0
}

fn encode_error(w: &mut W, e: &Error) {
    match e {
        Error::Setup { step, source } => {
            w.u8(1);
            w.bytes(step.as_bytes());
            w.io_error(source);
        }
        Error::Child { step, at, errno } => {
            w.u8(2);
            w.u32(u32::from(*step as u16));
            w.bytes(at.as_deref().unwrap_or("").as_bytes());
            w.i32(*errno);
        }
        Error::Exec {
            command,
            detail,
            code,
        } => {
            w.u8(3);
            w.bytes(command.as_bytes());
            w.bytes(detail.as_bytes());
            w.i32(*code);
        }
        Error::Unenforceable(text) => {
            w.u8(4);
            w.bytes(text.as_bytes());
        }
        Error::NoUserNamespaces { errno } => {
            w.u8(5);
            w.i32(*errno);
        }
        Error::Cgroup { path, source } => {
            w.u8(6);
            w.os(path.as_os_str());
            w.io_error(source);
        }
        Error::Threaded { threads } => {
            w.u8(7);
            w.u64(*threads);
        }
        Error::CgroupParent { name, detail } => {
            w.u8(8);
            w.bytes(name.as_bytes());
            w.bytes(detail.as_bytes());
        }
    }
}

pub fn decode_started(buf: &[u8]) -> io::Result<Started> {
    let mut r = R(buf);
    let out = match r.u8()? {
        0 => {
            let init = r.i32()?;
            let notes = (0..r.u32()?)
                .map(|_| r.string())
                .collect::<io::Result<_>>()?;
            Ok((init, notes))
        }
        1 => Err(Error::Setup {
            step: r.string()?,
            source: r.io_error()?,
        }),
        2 => {
            let n = r.u32()?;
            let step = u16::try_from(n)
                .ok()
                .and_then(ChildStep::from_u16)
                .ok_or_else(bad)?;
            let at = r.string()?;
            Err(Error::Child {
                step,
                at: (!at.is_empty()).then_some(at),
                errno: r.i32()?,
            })
        }
        3 => Err(Error::Exec {
            command: r.string()?,
            detail: r.string()?,
            code: r.i32()?,
        }),
        4 => Err(Error::Unenforceable(r.string()?)),
        5 => Err(Error::NoUserNamespaces { errno: r.i32()? }),
        6 => Err(Error::Cgroup {
            path: r.os()?.into(),
            source: r.io_error()?,
        }),
        7 => Err(Error::Threaded { threads: r.u64()? }),
        8 => Err(Error::CgroupParent {
            name: r.string()?,
            detail: r.string()?,
        }),
        _ => return Err(bad()),
    };
    if !r.0.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// Writes one frame: a u32 length, then the bytes.
pub fn write_frame(mut to: impl Write, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| bad())?;
    to.write_all(&len.to_le_bytes())?;
    to.write_all(bytes)?;
    to.flush()
}

/// Reads one frame.
pub fn read_frame(mut from: impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(bad());
    }
    let mut buf = vec![0u8; len as usize];
    from.read_exact(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_bridge(_: crate::BridgeSockets, _: &std::path::Path) -> io::Result<()> {
        Ok(())
    }

    fn spec() -> Spec {
        Spec {
            argv: vec!["/bin/echo".into(), "hi there".into()],
            env: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("K".into(), "v=w".into()),
            ],
            input: Some("/srv/in".into()),
            output: None,
            tmp_size: 64 << 20,
            mounts: vec![BindMount {
                host: "/opt/tool".into(),
                at: "/tmp/tool".into(),
                writable: true,
            }],
            limits: Limits {
                memory: Some(1 << 30),
                pids: Some(64),
                cpu: Some(1.5),
                timeout: Some(Duration::from_millis(2500)),
            },
            allow_exec: Some(vec!["/usr/bin/python3".into()]),
            allow_degraded: true,
            stdio: Stdio::Piped,
            egress: Some(Egress {
                socket_dir: "/run/user/1000/mcpbox/x".into(),
                port: 3128,
                bridge: no_bridge,
            }),
            tmp_dir: Some("/var/lib/mcpbox/sb/tmp".into()),
            cgroup_parent: Some("mcpbox-sb-0123456789abcdef".into()),
        }
    }

    #[test]
    fn a_spec_survives_the_trip_to_the_helper() {
        let s = spec();
        let back = decode_spec(&encode_spec(&s), no_bridge).unwrap();
        assert_eq!(back.argv, s.argv);
        assert_eq!(back.env, s.env);
        assert_eq!((back.input, back.output), (s.input, s.output));
        assert_eq!(back.tmp_size, s.tmp_size);
        assert_eq!(back.mounts, s.mounts);
        assert_eq!(back.limits, s.limits);
        assert_eq!(back.allow_exec, s.allow_exec);
        assert_eq!(back.allow_degraded, s.allow_degraded);
        assert_eq!(back.stdio, s.stdio);
        assert_eq!(back.tmp_dir, s.tmp_dir);
        assert_eq!(back.cgroup_parent, s.cgroup_parent);
        let (e, f) = (back.egress.unwrap(), s.egress.unwrap());
        assert_eq!((e.socket_dir, e.port), (f.socket_dir, f.port));
    }

    #[test]
    fn a_truncated_or_padded_spec_is_refused() {
        let bytes = encode_spec(&spec());
        assert!(decode_spec(&bytes[..bytes.len() - 1], no_bridge).is_err());
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(decode_spec(&padded, no_bridge).is_err());
    }

    #[test]
    fn errors_keep_their_step_errno_and_exit_code_through_the_helper() {
        let cases = vec![
            Error::Child {
                step: ChildStep::Root,
                at: Some("bind /usr -> /usr".into()),
                errno: libc::ENOENT,
            },
            Error::Exec {
                command: "nope".into(),
                detail: "command not found in the sandbox".into(),
                code: 127,
            },
            Error::NoUserNamespaces {
                errno: libc::ENOSPC,
            },
            Error::Setup {
                step: "writing uid_map".into(),
                source: io::Error::from_raw_os_error(libc::EPERM),
            },
            Error::Unenforceable("no".into()),
            Error::Threaded { threads: 3 },
            Error::CgroupParent {
                name: "mcpbox-sb-x".into(),
                detail: "does not exist".into(),
            },
        ];
        for e in cases {
            let text = e.to_string();
            let (step, code) = (e.step(), e.exit_code());
            let back = decode_started(&encode_started(&Err(e)))
                .unwrap()
                .unwrap_err();
            assert_eq!(back.to_string(), text);
            assert_eq!((back.step(), back.exit_code()), (step, code));
        }
        let ok = decode_started(&encode_started(&Ok((42, vec!["note".into()])))).unwrap();
        assert_eq!(ok.unwrap(), (42, vec!["note".to_string()]));
    }
}
