//! The bridge hands each accepted connection to the proxy itself.
//!
//! The bridge used to relay every byte: sandbox TCP -> bridge -> the proxy's
//! Unix socket -> proxy -> upstream, two relays and a socket hop more than a
//! proxy on the sandbox's own loopback. Instead, it now sends the accepted
//! TCP socket over the Unix socket (SCM_RIGHTS, unix(7)) with one marker
//! byte and lets go of it; the proxy reads the request head from that socket
//! and, once the tunnel is open, splices between it and the upstream.
//!
//! This keeps the boundary: what crosses is a socket the sandbox already
//! holds (a connection to its own loopback), never an address, and the proxy
//! still decides by the host name in the request head read from it and
//! connects only to an address it checked. Anything in the sandbox can
//! connect to the Unix socket and send anything, so a handoff is taken only
//! when it is exactly one marker byte with exactly one TCP stream socket;
//! any other descriptor is closed unused and the bytes go to the request
//! parser, which refuses the marker (it starts no HTTP request).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::io::Errno;
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketType,
};

/// The one byte a handoff carries. NUL begins no HTTP request line, so a
/// marker that arrives without a usable socket is a malformed request.
pub(crate) const MARKER: u8 = 0;

/// Sends `conn` to the proxy at the other end of `unix` (bridge side). On
/// success the proxy holds the connection; the caller drops its own copy.
/// On an error nothing was sent, so the caller may still relay over `unix`.
pub(crate) fn send(unix: &UnixStream, conn: &TcpStream) -> io::Result<()> {
    let fds = [conn.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor"));
    }
    loop {
        match net::sendmsg(
            unix,
            &[IoSlice::new(&[MARKER])],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(io::ErrorKind::WriteZero.into()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// What the first read of a Unix-socket client brought (proxy side).
pub(crate) enum First {
    /// A handoff: the sandbox's TCP connection, to serve instead.
    Conn(TcpStream),
    /// Ordinary bytes (possibly none: end of file), the start of a request
    /// head; any descriptor that came with them was closed.
    Bytes(Vec<u8>),
}

/// The first read from a Unix-socket client, with room for one descriptor.
/// Honours the socket's read timeout (the head timeout) like a plain read.
pub(crate) fn receive(unix: &UnixStream) -> io::Result<First> {
    let mut chunk = vec![0u8; 4096];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        match net::recvmsg(
            unix,
            &mut [IoSliceMut::new(&mut chunk)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(Errno::INTR) => continue,
            other => break other?,
        }
    };
    // Every descriptor received is owned here and closed unless used; the
    // kernel closes any that did not fit (MSG_CTRUNC).
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    chunk.truncate(msg.bytes);
    let whole = !msg.flags.contains(ReturnFlags::CTRUNC);
    if chunk == [MARKER] && whole && fds.len() == 1 {
        if let Some(conn) = fds.pop().and_then(tcp_stream) {
            return Ok(First::Conn(conn));
        }
    }
    Ok(First::Bytes(chunk))
}

/// `fd` as a TcpStream if it is an IPv4 or IPv6 stream socket speaking TCP
/// (what the bridge accepts), else `None` (and the descriptor is closed).
fn tcp_stream(fd: OwnedFd) -> Option<TcpStream> {
    if net::sockopt::socket_type(&fd).ok()? != SocketType::STREAM {
        return None;
    }
    if net::sockopt::socket_protocol(&fd).ok()? != Some(net::ipproto::TCP) {
        return None;
    }
    let family = net::getsockname(&fd).ok()?.address_family();
    if family != AddressFamily::INET && family != AddressFamily::INET6 {
        return None;
    }
    let conn = TcpStream::from(fd);
    // Small writes (the CONNECT answer, an echo) must not wait for Nagle.
    conn.set_nodelay(true).ok()?;
    Some(conn)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn a_handed_over_connection_arrives_usable() {
        let (mut client, accepted) = tcp_pair();
        let (bridge_end, proxy_end) = UnixStream::pair().unwrap();
        send(&bridge_end, &accepted).unwrap();
        drop(accepted);
        let First::Conn(mut conn) = receive(&proxy_end).unwrap() else {
            panic!("no connection received");
        };
        client.write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        conn.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        conn.write_all(b"back").unwrap();
        drop(conn);
        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"back", "the last holder's close ends the connection");
    }

    #[test]
    fn a_descriptor_that_is_not_a_tcp_socket_is_refused_and_closed() {
        // A sandbox can connect to the Unix socket itself and send any
        // descriptor with the marker: a pipe, a Unix socket, a file.
        let (bridge_end, proxy_end) = UnixStream::pair().unwrap();
        let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
        let (unix_a, _unix_b) = UnixStream::pair().unwrap();
        for fd in [pipe_r.as_fd(), unix_a.as_fd()] {
            let fds = [fd];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
            net::sendmsg(
                &bridge_end,
                &[IoSlice::new(&[MARKER])],
                &mut control,
                SendFlags::empty(),
            )
            .unwrap();
            match receive(&proxy_end).unwrap() {
                First::Bytes(b) => assert_eq!(b, [MARKER], "left to the parser, which refuses it"),
                First::Conn(_) => panic!("a non-TCP descriptor was taken as a connection"),
            }
        }
    }

    #[test]
    fn a_marker_with_request_bytes_or_without_a_descriptor_is_only_bytes() {
        let (mut bridge_end, proxy_end) = UnixStream::pair().unwrap();
        bridge_end.write_all(&[MARKER]).unwrap();
        assert!(matches!(receive(&proxy_end).unwrap(), First::Bytes(b) if b == [MARKER]));
        // A TCP socket sent with more than the marker is not a handoff.
        let (_client, accepted) = tcp_pair();
        let fds = [accepted.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        let bytes = b"CONNECT a.test:443 HTTP/1.1\r\n\r\n";
        net::sendmsg(
            &bridge_end,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
        assert!(matches!(receive(&proxy_end).unwrap(), First::Bytes(b) if b == bytes));
        drop(bridge_end);
        assert!(matches!(receive(&proxy_end).unwrap(), First::Bytes(b) if b.is_empty()));
    }
}
