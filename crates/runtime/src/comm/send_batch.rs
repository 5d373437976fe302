//! The sending side of the datagram path: the sockets (one per path) and the writes of the
//! batches the links seal ([`syncopate_core::datagram::Sealed`]), one GSO write per run
//! where the kernel has the offload ([`super::udp_io`]). A batch the socket refuses for
//! lack of buffer space waits, sealed, for a retry and holds its link back.

use std::io;
use std::net::SocketAddr;

use syncopate_core::datagram::{Sealed, SendLimits};

use super::udp_io::{self, Offloads, MAX_BATCH_BYTES, MAX_SEGMENTS};

/// One path's socket and the offloads its kernel took.
pub(super) struct PathSocket {
    pub(super) socket: mio::net::UdpSocket,
    pub(super) offloads: Offloads,
}

impl PathSocket {
    /// What one write to this socket may carry.
    pub(super) fn limits(&self) -> SendLimits {
        if !self.offloads.gso {
            return SendLimits::ONE_BY_ONE;
        }
        SendLimits {
            gso: true,
            max_segments: MAX_SEGMENTS,
            max_bytes: MAX_BATCH_BYTES,
        }
    }
}

/// How long to wait before retrying a send the socket refused for lack of buffer space.
const RETRY_NS: u64 = 100_000;

/// A batch the socket refused: its link, destination and the runs still to write.
struct Held {
    link: usize,
    to: SocketAddr,
    sealed: Sealed,
    next_run: usize,
}

/// The sockets and the batch waiting for a retry.
pub(super) struct Outbox {
    sockets: Vec<PathSocket>,
    held: Option<Held>,
    /// When a refused batch is retried (meaningful while one is held).
    retry_at: u64,
    /// Datagrams the local kernel refused to send (a full local queue, an unreachable
    /// peer): lost, as the network would lose them.
    send_failures: u64,
}

impl Outbox {
    /// The outbox of `sockets`, one per path.
    pub(super) fn new(sockets: Vec<PathSocket>) -> Self {
        Self {
            sockets,
            held: None,
            retry_at: 0,
            send_failures: 0,
        }
    }

    /// The number of paths.
    pub(super) fn paths(&self) -> usize {
        self.sockets.len()
    }

    /// Path `j`'s socket.
    pub(super) fn socket(&self, j: usize) -> Option<&PathSocket> {
        self.sockets.get(j)
    }

    /// What one write on path `j` may carry.
    pub(super) fn limits(&self, j: usize) -> SendLimits {
        self.socket(j)
            .map_or(SendLimits::ONE_BY_ONE, PathSocket::limits)
    }

    /// Whether a refused batch of link `i` waits for a retry.
    pub(super) fn holds(&self, i: usize) -> bool {
        self.held.as_ref().is_some_and(|h| h.link == i)
    }

    /// When the refused batch is retried (`None`: none waits).
    pub(super) fn retry_at(&self) -> Option<u64> {
        self.held.as_ref().map(|_| self.retry_at)
    }

    /// Datagrams the local kernel refused so far.
    pub(super) fn send_failures(&self) -> u64 {
        self.send_failures
    }

    /// Retries the refused batch if its time has come; `true` once none waits.
    pub(super) fn retry(&mut self, now_ns: u64) -> bool {
        let Some(mut held) = self.held.take() else {
            return true;
        };
        if self.retry_at > now_ns {
            self.held = Some(held);
            return false;
        }
        match self.write(&held.sealed, held.next_run, held.to) {
            Ok(()) => true,
            Err(next_run) => {
                held.next_run = next_run;
                self.hold(held, now_ns);
                false
            }
        }
    }

    /// Writes `sealed`, link `link`'s batch, to `to`; `false` where the socket refused it
    /// (what is left is kept for a retry, and `sealed` is left empty).
    pub(super) fn send(
        &mut self,
        link: usize,
        sealed: &mut Sealed,
        to: SocketAddr,
        now_ns: u64,
    ) -> bool {
        match self.write(sealed, 0, to) {
            Ok(()) => true,
            Err(next_run) => {
                let sealed = std::mem::take(sealed);
                self.hold(
                    Held {
                        link,
                        to,
                        sealed,
                        next_run,
                    },
                    now_ns,
                );
                false
            }
        }
    }

    /// Keeps `held` for a retry after [`RETRY_NS`].
    fn hold(&mut self, held: Held, now_ns: u64) {
        self.retry_at = now_ns.saturating_add(RETRY_NS);
        self.held = Some(held);
    }

    /// Writes `sealed`'s runs from `first` on; `Err(k)` where the socket refused run `k`
    /// for lack of buffer space.
    fn write(&mut self, sealed: &Sealed, first: usize, to: SocketAddr) -> Result<(), usize> {
        let Some(socket) = self.sockets.get(sealed.path) else {
            return Ok(());
        };
        for (k, run) in sealed.runs.iter().enumerate().skip(first) {
            let bytes = sealed.run_bytes(run);
            let gso = (run.count > 1).then(|| u16::try_from(run.segment).unwrap_or(u16::MAX));
            match udp_io::send(&socket.socket, bytes, gso, to, run.dscp) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(k),
                Err(e) => {
                    tracing::debug!("{} datagram(s) to {to} were not sent: {e}", run.count);
                    self.send_failures += run.count as u64;
                }
            }
        }
        Ok(())
    }
}
