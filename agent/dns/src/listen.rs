//! The DNS server's sockets: UDP and TCP on one address, bound with
//! IP_FREEBIND, because the address is the pod bridge's gateway, which the
//! bridge CNI plugin only configures with the node's first pod.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::net::{TcpListener, UdpSocket};

/// Pending TCP connections the kernel queues for us.
const BACKLOG: i32 = 1024;

/// How often to look for a port free on both UDP and TCP when `addr` asks
/// for any port (port 0): the UDP port chosen may be taken on TCP.
const ANY_PORT_ATTEMPTS: usize = 16;

/// A socket could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("binding {protocol} {addr}: {source}")]
pub struct Error {
    pub protocol: &'static str,
    pub addr: SocketAddr,
    #[source]
    pub source: io::Error,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// UDP and TCP sockets on `addr` (the same port on both, also when `addr`
/// has port 0), usable before the address exists on the node.
///
/// # Errors
/// The address is taken, or the process may not bind it (ports below 1024
/// need CAP_NET_BIND_SERVICE).
pub fn bind(addr: SocketAddr) -> Result<(UdpSocket, TcpListener)> {
    if addr.port() != 0 {
        return Ok((udp(addr)?, tcp(addr)?));
    }
    let mut last = None;
    for _ in 0..ANY_PORT_ATTEMPTS {
        let udp = udp(addr)?;
        let port = udp.local_addr().map_err(|source| Error {
            protocol: "UDP",
            addr,
            source,
        })?;
        match tcp(port) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if e.source.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error {
        protocol: "TCP",
        addr,
        source: io::ErrorKind::AddrInUse.into(),
    }))
}

fn udp(addr: SocketAddr) -> Result<UdpSocket> {
    let bind = || {
        let socket = socket(addr, Type::DGRAM, Protocol::UDP)?;
        socket.bind(&SockAddr::from(addr))?;
        UdpSocket::from_std(socket.into())
    };
    bind().map_err(|source| Error {
        protocol: "UDP",
        addr,
        source,
    })
}

fn tcp(addr: SocketAddr) -> Result<TcpListener> {
    let bind = || {
        let socket = socket(addr, Type::STREAM, Protocol::TCP)?;
        // A restarted agent rebinds while the old connections sit in
        // TIME_WAIT.
        socket.set_reuse_address(true)?;
        socket.bind(&SockAddr::from(addr))?;
        socket.listen(BACKLOG)?;
        TcpListener::from_std(socket.into())
    };
    bind().map_err(|source| Error {
        protocol: "TCP",
        addr,
        source,
    })
}

fn socket(addr: SocketAddr, ty: Type, protocol: Protocol) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), ty, Some(protocol))?;
    match addr {
        SocketAddr::V4(_) => socket.set_freebind_v4(true)?,
        SocketAddr::V6(_) => {
            // An IPv6 socket on [::] must not also take the IPv4 port.
            socket.set_only_v6(true)?;
            socket.set_freebind_v6(true)?;
        }
    }
    socket.set_nonblocking(true)?;
    Ok(socket)
}
