//! The datagram sockets' system calls, batched where the kernel can: a run of equal-sized
//! datagrams to one address leaves in one `sendmsg` with UDP segmentation offload (GSO,
//! `UDP_SEGMENT`: the kernel cuts the buffer into datagrams), and one `recvmsg` reads a run
//! that the kernel coalesced (GRO, `UDP_GRO`: on loopback a GSO send arrives whole), with
//! the kernel's receive time of each (`SO_TIMESTAMPNS`), so that the delay the rate
//! controller sees is the network's, not the time this thread waited to be scheduled.
//!
//! Each offload is turned on where the kernel takes it and skipped where it does not (one
//! datagram per call, the loop's clock for arrivals): the bytes on the wire are the same.
//! Each send carries its own DSCP (an `IP_TOS` or `IPV6_TCLASS` control message, the whole
//! byte: DSCP and the ECN bits, zero), so datagrams of different priority classes need no
//! socket option between them.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};

/// `UDP_SEGMENT` (linux/udp.h): the segment size of a GSO send.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): coalesced receives, and the segment size of one.
const UDP_GRO: libc::c_int = 104;
/// The most datagrams the kernel cuts one GSO send into (`UDP_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: usize = 64;
/// The most bytes of one send or receive: a UDP payload's limit (IPv4).
pub const MAX_BATCH_BYTES: usize = 65_507;
/// Room for the control messages of one receive (a timestamp and a segment size).
const CONTROL_BYTES: usize = 128;
/// The counters `SO_MEMINFO` reports (`SK_MEMINFO_VARS`); the drop count is the last.
const MEMINFO_VARS: usize = libc::SK_MEMINFO_DROPS as usize + 1;

/// What the kernel took of the offloads, for one socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Offloads {
    /// GSO sends.
    pub gso: bool,
    /// GRO receives.
    pub gro: bool,
    /// Kernel receive timestamps.
    pub timestamps: bool,
}

/// Turns on GRO and kernel receive timestamps on `fd` where the kernel takes them, and
/// probes GSO (its option read back).
pub fn enable_offloads(fd: &impl AsRawFd) -> Offloads {
    let fd = fd.as_raw_fd();
    let on: libc::c_int = 1;
    Offloads {
        gro: set_int(fd, libc::SOL_UDP, UDP_GRO, on),
        timestamps: set_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, on),
        gso: get_int(fd, libc::SOL_UDP, UDP_SEGMENT).is_some(),
    }
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> bool {
    let len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` outlives the call and `len` is its size.
    let rc = unsafe { libc::setsockopt(fd, level, name, (&raw const value).cast(), len) };
    rc == 0
}

fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` outlive the call; `len` is `value`'s size.
    let rc = unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &mut len) };
    (rc == 0).then_some(value)
}

/// Datagrams the kernel dropped on arrival at `fd` for want of receive-buffer room
/// (`SO_MEMINFO`'s drop count); `None` where the kernel does not say.
pub fn receive_buffer_drops(fd: &impl AsRawFd) -> Option<u64> {
    let mut info = [0u32; MEMINFO_VARS];
    let mut len = size_of::<[u32; MEMINFO_VARS]>() as libc::socklen_t;
    // SAFETY: `info` and `len` outlive the call; `len` is `info`'s size in bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let drops = info.get(libc::SK_MEMINFO_DROPS as usize)?;
    (rc == 0 && len as usize > libc::SK_MEMINFO_DROPS as usize * 4).then_some(u64::from(*drops))
}

/// One receive: `len` bytes from `from`; with GRO a run of datagrams of `segment` bytes
/// each (the last may be shorter), else one datagram (`segment == len`); `truncated` when
/// the datagram was longer than the buffer; the kernel's receive time (nanoseconds of the
/// real-time clock) where it gave one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes read.
    pub len: usize,
    /// Bytes of each datagram but the last.
    pub segment: usize,
    /// The sender's address.
    pub from: SocketAddr,
    /// Whether the kernel cut the datagram to the buffer.
    pub truncated: bool,
    /// When the kernel received it, in nanoseconds since the Unix epoch.
    pub kernel_ns: Option<u128>,
    /// The IPv4 TOS byte it arrived with, where the socket asked for it (`IP_RECVTOS`).
    pub tos: Option<u8>,
}

/// Reads one datagram (or GRO run) from `fd` into `buf` without blocking.
pub fn recv(fd: &impl AsRawFd, buf: &mut [u8]) -> io::Result<Received> {
    // SAFETY: all-zero is a valid `sockaddr_storage`, `msghdr` and `iovec`.
    let mut name: libc::sockaddr_storage = unsafe { zeroed() };
    let mut control = [0u64; CONTROL_BYTES / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&raw mut name).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = CONTROL_BYTES as _;
    // SAFETY: every pointer in `msg` points at a live buffer of the length it is given.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &raw mut msg, libc::MSG_DONTWAIT) };
    let len = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let from = socket_addr(&name)
        .ok_or_else(|| io::Error::other("a datagram from an address of unknown family"))?;
    let mut got = Received {
        len,
        segment: len,
        from,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        kernel_ns: None,
        tos: None,
    };
    // SAFETY: `msg` was filled by the kernel; the CMSG macros stay within its control buffer.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        while let Some(c) = cmsg.as_ref() {
            let data = libc::CMSG_DATA(cmsg);
            match (c.cmsg_level, c.cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                    let ts = data.cast::<libc::timespec>().read_unaligned();
                    let (s, ns) = (u128::try_from(ts.tv_sec), u128::try_from(ts.tv_nsec));
                    got.kernel_ns = s.ok().zip(ns.ok()).map(|(s, ns)| s * 1_000_000_000 + ns);
                }
                (libc::IPPROTO_IP, libc::IP_TOS) => got.tos = Some(data.read()),
                (libc::SOL_UDP, UDP_GRO) => {
                    let size = data.cast::<libc::c_int>().read_unaligned();
                    if let Ok(size @ 1..) = usize::try_from(size) {
                        got.segment = size.min(len.max(1));
                    }
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
        }
    }
    Ok(got)
}

/// Sends `bytes` to `to` from `fd` without blocking, with the DSCP `dscp`: one datagram,
/// or with `segment` (GSO) datagrams of `segment` bytes each, the last the rest.
pub fn send(
    fd: &impl AsRawFd,
    bytes: &[u8],
    segment: Option<u16>,
    to: SocketAddr,
    dscp: u8,
) -> io::Result<usize> {
    let (mut name, name_len) = sockaddr_of(to);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let mut control = [0u64; CONTROL_BYTES / 8];
    // SAFETY: all-zero is a valid `msghdr`.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&raw mut name).cast();
    msg.msg_namelen = name_len;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    let (level, name) = match to {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_TOS),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
    };
    let tos = libc::c_int::from(dscp) << 2;
    let segment = segment.filter(|s| usize::from(*s) < bytes.len());
    // SAFETY: the control buffer has room for an `int` message and a `u16` message
    // (CMSG_SPACE(4) + CMSG_SPACE(2) <= 128); the CMSG macros stay within it.
    unsafe {
        let int_space = libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize;
        let u16_space = libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = (int_space + segment.map_or(0, |_| u16_space)) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        (*cmsg).cmsg_level = level;
        (*cmsg).cmsg_type = name;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as _;
        libc::CMSG_DATA(cmsg)
            .cast::<libc::c_int>()
            .write_unaligned(tos);
        if let Some(size) = segment {
            let cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
            libc::CMSG_DATA(cmsg).cast::<u16>().write_unaligned(size);
        }
    }
    // SAFETY: every pointer in `msg` points at a live buffer of the length it is given.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &raw const msg, libc::MSG_DONTWAIT) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `addr` as the kernel reads it, and its length.
fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid `sockaddr_storage`; each arm writes a smaller sockaddr
    // into its start, which `sockaddr_storage` is sized and aligned for.
    unsafe {
        let mut storage: libc::sockaddr_storage = zeroed();
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = (&raw mut storage).cast::<libc::sockaddr_in>();
                (*sin).sin_family = libc::AF_INET as libc::sa_family_t;
                (*sin).sin_port = a.port().to_be();
                (*sin).sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = (&raw mut storage).cast::<libc::sockaddr_in6>();
                (*sin6).sin6_family = libc::AF_INET6 as libc::sa_family_t;
                (*sin6).sin6_port = a.port().to_be();
                (*sin6).sin6_addr.s6_addr = a.ip().octets();
                (*sin6).sin6_flowinfo = a.flowinfo();
                (*sin6).sin6_scope_id = a.scope_id();
                size_of::<libc::sockaddr_in6>()
            }
        };
        (storage, len as libc::socklen_t)
    }
}

/// The address the kernel wrote into `storage` (IPv4 or IPv6).
fn socket_addr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the family says which sockaddr the kernel wrote at the storage's start.
    unsafe {
        match libc::c_int::from(storage.ss_family) {
            libc::AF_INET => {
                let sin = &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)).into())
            }
            libc::AF_INET6 => {
                let sin6 =
                    &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                let port = u16::from_be(sin6.sin6_port);
                Some(SocketAddrV6::new(ip, port, sin6.sin6_flowinfo, sin6.sin6_scope_id).into())
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    fn pair() -> (UdpSocket, UdpSocket, Offloads) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let offloads = enable_offloads(&b);
        (a, b, offloads)
    }

    #[test]
    fn a_gso_send_arrives_as_its_datagrams_with_a_kernel_time() {
        let (a, b, offloads) = pair();
        let to = b.local_addr().unwrap();
        let bytes: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let segment = offloads.gso.then_some(300);
        assert!(set_int(
            b.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_RECVTOS,
            1
        ));
        assert_eq!(send(&a, &bytes, segment, to, 46).unwrap(), 1000);
        let mut buf = vec![0; MAX_BATCH_BYTES];
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        while got.len() < bytes.len() {
            let r = recv(&b, &mut buf).unwrap();
            assert_eq!(r.from, a.local_addr().unwrap());
            assert!(!r.truncated);
            assert_eq!(r.kernel_ns.is_some(), offloads.timestamps);
            assert_eq!(r.tos, Some(46 << 2), "every datagram keeps its DSCP");
            for datagram in buf[..r.len].chunks(r.segment) {
                sizes.push(datagram.len());
            }
            got.extend_from_slice(&buf[..r.len]);
        }
        assert_eq!(got, bytes);
        if offloads.gso {
            assert_eq!(sizes, [300, 300, 300, 100], "the kernel cut the send");
        }
        let e = recv(&b, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn a_datagram_longer_than_the_buffer_is_reported_cut() {
        let (a, b, _) = pair();
        send(&a, &[7; 100], None, b.local_addr().unwrap(), 0).unwrap();
        let mut buf = [0; 10];
        let r = recv(&b, &mut buf).unwrap();
        assert!(r.truncated);
        assert_eq!(r.len, 10);
    }

    #[test]
    fn addresses_survive_the_round_trip_through_the_kernel_form() {
        for addr in ["127.0.0.1:9", "[::1]:443", "[fe80::1%2]:7"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let (storage, _) = sockaddr_of(addr);
            assert_eq!(socket_addr(&storage), Some(addr));
        }
    }

    #[test]
    fn the_drop_count_is_read() {
        let (_, b, _) = pair();
        assert_eq!(receive_buffer_drops(&b), Some(0));
    }
}
