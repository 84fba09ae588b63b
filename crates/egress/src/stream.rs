//! Listeners and streams the proxy serves on (TCP or Unix), and the one copy
//! loop every relay uses.

use std::io::{self, Read, Write};
use std::net::{Shutdown as How, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

/// Size of the fixed relay buffer, one per direction per connection. A
/// download of any size streams through it; nothing buffers a whole body.
pub const RELAY_BUFFER: usize = 64 * 1024;

/// The socket the proxy accepts clients on.
#[derive(Debug)]
pub enum Listener {
    /// A TCP listener (tests, the benchmark, a bridge-less setup).
    Tcp(TcpListener),
    /// A Unix socket listener (production: the bridge inside the sandbox
    /// connects here).
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Self::Tcp(l)
    }
}

impl From<UnixListener> for Listener {
    fn from(l: UnixListener) -> Self {
        Self::Unix(l)
    }
}

/// Where to connect to wake a blocked `accept` at shutdown.
#[derive(Debug, Clone)]
pub(crate) enum WakeTarget {
    Tcp(std::net::SocketAddr),
    Unix(std::path::PathBuf),
}

impl WakeTarget {
    pub(crate) fn poke(&self) {
        // The connection only wakes the accept loop; its result is irrelevant.
        let _ = match self {
            Self::Tcp(addr) => TcpStream::connect_timeout(addr, Duration::from_secs(1)).map(drop),
            Self::Unix(path) => UnixStream::connect(path).map(drop),
        };
    }
}

impl Listener {
    pub(crate) fn accept(&self) -> io::Result<ClientStream> {
        match self {
            Self::Tcp(l) => {
                let (s, _) = l.accept()?;
                // Small writes (a CONNECT answer, an echo) must not wait for Nagle.
                s.set_nodelay(true)?;
                Ok(ClientStream::Tcp(s))
            }
            Self::Unix(l) => Ok(ClientStream::Unix(l.accept()?.0)),
        }
    }

    pub(crate) fn wake_target(&self) -> io::Result<Option<WakeTarget>> {
        match self {
            Self::Tcp(l) => {
                let mut addr = l.local_addr()?;
                if addr.ip().is_unspecified() {
                    addr.set_ip(match addr {
                        std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                        std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                    });
                }
                Ok(Some(WakeTarget::Tcp(addr)))
            }
            Self::Unix(l) => Ok(l
                .local_addr()?
                .as_pathname()
                .map(|p| WakeTarget::Unix(p.to_path_buf()))),
        }
    }
}

/// A client connection, over TCP or a Unix socket.
#[derive(Debug)]
pub enum ClientStream {
    /// TCP.
    Tcp(TcpStream),
    /// Unix socket.
    Unix(UnixStream),
}

impl Read for ClientStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
        }
    }
}

impl Write for ClientStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(buf),
            Self::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for ClientStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Tcp(s) => s.as_fd(),
            Self::Unix(s) => s.as_fd(),
        }
    }
}

/// The socket operations the relay needs from both ends.
pub(crate) trait Socket: Read + Write + AsFd + Send + Sized + 'static {
    fn clone_socket(&self) -> io::Result<Self>;
    fn shutdown_socket(&self, how: How);
    fn read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
}

impl Socket for TcpStream {
    fn clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_socket(&self, how: How) {
        // ENOTCONN after the peer is gone is expected and harmless.
        let _ = self.shutdown(how);
    }
    fn read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d)
    }
}

impl Socket for UnixStream {
    fn clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_socket(&self, how: How) {
        let _ = self.shutdown(how);
    }
    fn read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d)
    }
}

impl Socket for ClientStream {
    fn clone_socket(&self) -> io::Result<Self> {
        Ok(match self {
            Self::Tcp(s) => Self::Tcp(s.try_clone()?),
            Self::Unix(s) => Self::Unix(s.try_clone()?),
        })
    }
    fn shutdown_socket(&self, how: How) {
        match self {
            Self::Tcp(s) => s.shutdown_socket(how),
            Self::Unix(s) => s.shutdown_socket(how),
        }
    }
    fn read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_read_timeout(d),
            Self::Unix(s) => s.set_read_timeout(d),
        }
    }
}

/// Copies until end of file, adding what was written to `count` as it goes
/// (so a failed relay still reports its bytes).
///
/// On Linux the bytes move with splice(2) through a pipe of the default
/// 64 KiB capacity, socket to socket without a copy through user space (a
/// copying relay costs two extra copies per byte, which on a 2-core machine
/// halves throughput). Where splice is refused (EINVAL on an fd type that
/// cannot splice) it falls back to a read/write loop through `buf`, grown to
/// [`RELAY_BUFFER`] only then.
pub(crate) fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    buf: &mut Vec<u8>,
    count: &mut u64,
) -> io::Result<()>
where
    R: Read + AsFd,
    W: Write + AsFd,
{
    match splice_loop(from.as_fd(), to.as_fd(), count)? {
        Spliced::Done => Ok(()),
        Spliced::Unusable { pending } => {
            to.write_all(&pending)?;
            *count += pending.len() as u64;
            buf.resize(RELAY_BUFFER, 0);
            copy_loop(from, to, buf, count)
        }
    }
}

/// How a splice relay ended.
enum Spliced {
    /// End of file reached.
    Done,
    /// Splice is unusable for this pair before any byte went out (an fd type
    /// that cannot splice, e.g. an `O_APPEND` file; a seccomp filter that
    /// refuses splice or pipe2; no fds left for the pipe). `pending` holds
    /// the bytes already taken into the pipe, to be written by the caller.
    Unusable { pending: Vec<u8> },
}

fn splice_unusable(e: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    [
        Errno::INVAL,
        Errno::NOSYS,
        Errno::PERM,
        Errno::OPNOTSUPP,
        Errno::MFILE,
        Errno::NFILE,
    ]
    .contains(&e)
}

fn splice_loop(from: BorrowedFd<'_>, to: BorrowedFd<'_>, count: &mut u64) -> io::Result<Spliced> {
    use rustix::io::Errno;
    use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
    let (pipe_r, pipe_w) = match pipe_with(PipeFlags::CLOEXEC) {
        Ok(p) => p,
        Err(e) if splice_unusable(e) => {
            return Ok(Spliced::Unusable {
                pending: Vec::new(),
            })
        }
        Err(e) => return Err(e.into()),
    };
    loop {
        let n = match splice(from, None, &pipe_w, None, RELAY_BUFFER, SpliceFlags::MOVE) {
            Ok(0) => return Ok(Spliced::Done),
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) if *count == 0 && splice_unusable(e) => {
                return Ok(Spliced::Unusable {
                    pending: Vec::new(),
                })
            }
            Err(e) => return Err(e.into()),
        };
        let mut left = n;
        while left > 0 {
            match splice(&pipe_r, None, to, None, left, SpliceFlags::MOVE) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => {
                    left -= m;
                    *count += m as u64;
                }
                Err(Errno::INTR) => continue,
                Err(e) if *count == 0 && splice_unusable(e) => {
                    // Take back what is sitting in the pipe.
                    let mut pending = vec![0u8; left];
                    let mut got = 0;
                    while got < left {
                        match rustix::io::read(&pipe_r, &mut pending[got..]) {
                            Ok(0) => break,
                            Ok(k) => got += k,
                            Err(Errno::INTR) => continue,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    pending.truncate(got);
                    return Ok(Spliced::Unusable { pending });
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The portable relay loop through one fixed buffer.
pub(crate) fn copy_loop<R: Read, W: Write>(
    from: &mut R,
    to: &mut W,
    buf: &mut [u8],
    count: &mut u64,
) -> io::Result<()> {
    loop {
        let n = match from.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        *count += n as u64;
    }
}

/// Relays two sockets both ways (one extra pooled thread) with half-close
/// passed through; used by the bridge, where no inspection happens.
pub(crate) fn splice_both<A: Socket, B: Socket>(
    a: A,
    b: B,
    pool: &crate::pool::Pool,
) -> io::Result<(u64, u64)> {
    let mut a_read = a.clone_socket()?;
    let mut b_write = b.clone_socket()?;
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<u64>(1);
    pool.run(move || {
        let mut buf = Vec::new();
        let mut n = 0;
        match pump(&mut a_read, &mut b_write, &mut buf, &mut n) {
            Ok(()) => b_write.shutdown_socket(How::Write),
            Err(_) => {
                a_read.shutdown_socket(How::Both);
                b_write.shutdown_socket(How::Both);
            }
        }
        let _ = done_tx.send(n);
    })?;
    let (mut a, mut b) = (a, b);
    let mut buf = Vec::new();
    let mut down = 0;
    match pump(&mut b, &mut a, &mut buf, &mut down) {
        Ok(()) => a.shutdown_socket(How::Write),
        Err(_) => {
            a.shutdown_socket(How::Both);
            b.shutdown_socket(How::Both);
        }
    }
    let up = done_rx.recv().unwrap_or(0);
    Ok((up, down))
}

/// Joins two TCP connections both ways with the relay the proxy and the
/// bridge run once a tunnel is open (splice(2), half-close passed through),
/// and nothing else: no request, no policy, no record. Public for
/// `examples/egress_bench.rs`, whose `bare relay` row is the ceiling of any
/// design that carries the bytes through one relay in user space.
pub fn relay_tcp(a: TcpStream, b: TcpStream) -> io::Result<(u64, u64)> {
    static POOL: std::sync::OnceLock<crate::pool::Pool> = std::sync::OnceLock::new();
    splice_both(
        a,
        b,
        POOL.get_or_init(|| crate::pool::Pool::new("egress-relay")),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A connected loopback TCP pair.
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// Two endpoints joined by `splice_both` the way the proxy and the
    /// bridge join theirs: `a` talks to `b` through the relay, which runs
    /// on its own thread and returns its byte counts when both ways ended.
    fn relayed() -> (TcpStream, TcpStream, std::thread::JoinHandle<(u64, u64)>) {
        let (a, a_far) = tcp_pair();
        let (b_far, b) = tcp_pair();
        let relay = std::thread::spawn(move || {
            let pool = crate::pool::Pool::new("test-relay");
            splice_both(a_far, b_far, &pool).unwrap()
        });
        (a, b, relay)
    }

    /// Byte `i` of a test stream seeded by `seed` (not periodic in any
    /// buffer size, so a lost, repeated or reordered chunk is caught).
    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// FNV-1a over `bytes`.
    fn checksum(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
        })
    }

    #[test]
    fn a_large_transfer_arrives_intact_both_ways_at_once() {
        let (mut a, mut b, relay) = relayed();
        let up = pattern(1, 32 << 20);
        let down = pattern(2, 24 << 20);
        let (up_sum, down_sum) = (checksum(&up), checksum(&down));
        let (up_len, down_len) = (up.len(), down.len());
        let mut a_write = a.try_clone().unwrap();
        let mut b_write = b.try_clone().unwrap();
        let w1 = std::thread::spawn(move || {
            a_write.write_all(&up).unwrap();
            a_write.shutdown(How::Write).unwrap();
        });
        let w2 = std::thread::spawn(move || {
            b_write.write_all(&down).unwrap();
            b_write.shutdown(How::Write).unwrap();
        });
        let mut at_b = Vec::new();
        let reader = std::thread::spawn(move || {
            b.read_to_end(&mut at_b).unwrap();
            at_b
        });
        let mut at_a = Vec::new();
        a.read_to_end(&mut at_a).unwrap();
        let at_b = reader.join().unwrap();
        w1.join().unwrap();
        w2.join().unwrap();
        assert_eq!((at_b.len(), checksum(&at_b)), (up_len, up_sum));
        assert_eq!((at_a.len(), checksum(&at_a)), (down_len, down_sum));
        assert_eq!(
            relay.join().unwrap(),
            (up_len as u64, down_len as u64),
            "the relay counts every byte it moved"
        );
    }

    #[test]
    fn half_close_passes_through_each_way() {
        for a_first in [true, false] {
            let (mut a, mut b, relay) = relayed();
            let (first, second) = if a_first {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            // The first side says its piece and closes its writing half...
            first.write_all(b"request").unwrap();
            first.shutdown(How::Write).unwrap();
            let mut got = Vec::new();
            second.read_to_end(&mut got).unwrap();
            assert_eq!(got, b"request", "end of file arrives after the data");
            // ...and can still read the answer, written after that.
            second.write_all(b"answer after the half-close").unwrap();
            second.shutdown(How::Write).unwrap();
            let mut got = Vec::new();
            first.read_to_end(&mut got).unwrap();
            assert_eq!(got, b"answer after the half-close");
            let (up, down) = relay.join().unwrap();
            assert_eq!(up + down, 7 + 27);
        }
    }

    #[test]
    fn a_peer_that_stops_reading_holds_the_sender_back_instead_of_buffering() {
        let (a, b, relay) = relayed();
        // `b` reads nothing: the relay may hold what fits in the sockets'
        // and its pipe's buffers, then `a` must be made to wait.
        a.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0usize;
        let mut a_w = &a;
        let mut stalls = 0;
        while stalls < 50 {
            match a_w.write(&chunk) {
                Ok(n) => {
                    sent += n;
                    stalls = 0;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    stalls += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => panic!("{e}"),
            }
            assert!(sent < 256 << 20, "256 MiB went in and nobody read them");
        }
        // The reader goes away: the relay ends, and so does the sender's
        // connection, instead of waiting forever.
        drop(b);
        a.set_nonblocking(false).unwrap();
        let mut a_r = &a;
        let mut sink = [0u8; 1024];
        loop {
            match a_r.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let (up, _) = relay.join().unwrap();
        assert!(up as usize <= sent);
    }

    #[test]
    fn end_of_file_mid_stream_ends_the_relay_with_exactly_what_was_sent() {
        // The upstream dies after part of what a client expects: the client
        // gets those bytes, then end of file, never more and never a hang.
        let (mut a, b, relay) = relayed();
        let part = pattern(3, 3 * RELAY_BUFFER + 123);
        let mut b_w = b.try_clone().unwrap();
        b_w.write_all(&part).unwrap();
        drop(b_w);
        drop(b);
        let mut got = Vec::new();
        a.read_to_end(&mut got).unwrap();
        assert_eq!(checksum(&got), checksum(&part));
        assert_eq!(got.len(), part.len());
        drop(a);
        let (up, down) = relay.join().unwrap();
        assert_eq!((up, down), (0, part.len() as u64));
    }

    #[test]
    fn relay_falls_back_to_copying_where_splice_is_refused() {
        // splice(2) into an O_APPEND file fails with EINVAL after the bytes
        // are already in the pipe: they must still arrive, in order.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let data = data.clone();
            std::thread::spawn(move || {
                a.write_all(&data).unwrap();
            })
        };
        let mut buf = Vec::new();
        let mut count = 0;
        pump(&mut b, &mut file, &mut buf, &mut count).unwrap();
        writer.join().unwrap();
        assert_eq!(count, data.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(
            buf.len(),
            RELAY_BUFFER,
            "the fallback uses the fixed buffer"
        );
    }
}
