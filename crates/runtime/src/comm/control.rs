//! What keeps the links alive and ends them. A link that moves no bytes for a while gets a
//! heartbeat, and a peer that stays silent past the deadline (core's [`Liveness`] rules)
//! is lost. A peer that closes without saying goodbye, sends a malformed or unexpected
//! frame, aborts, or stays silent ends the loop with an error that names it; the others are
//! told through an Abort frame. Goodbyes end a run; frames the hooks relay (worker 0's
//! buffers) go out beside the strategy's.
//!
//! [`Liveness`]: syncopate_core::liveness::Liveness

use std::io::{self, Read};
use std::time::{Duration, Instant};

use syncopate_core::strategy::{Endpoint, ProtocolError};
use syncopate_core::wire::{FrameKind, Header};

use super::writer::{unwritten, write_all_until};
use super::{lost, protocol, CommError, CommLoop, Hooks, LinkState};

impl CommLoop {
    /// Queues the frames the hooks want written beside the strategy's on their links.
    pub(super) fn queue_control<E: ?Sized>(
        &mut self,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        while let Some((peer, frame)) = hooks.poll_control() {
            let link = self.links.iter_mut().find(|l| l.peer == peer);
            let link = link.ok_or_else(|| {
                CommError::Local(format!(
                    "no link to {} for a relayed frame",
                    hooks.describe(peer)
                ))
            })?;
            link.control.push_back(frame);
        }
        Ok(())
    }

    /// Queues a heartbeat on link `i` if it is due (the link idle, nothing sent for a while).
    pub(super) fn queue_heartbeat(&mut self, i: usize, now_ns: u64) {
        let link = &mut self.links[i];
        if link.closed {
            return;
        }
        let idle = link.writing.is_empty() && link.control.is_empty() && !link.goodbye_sent;
        if self.liveness.heartbeat_due(i, now_ns, idle) {
            link.control
                .push_back(Header::control(FrameKind::Heartbeat, 0).encode().to_vec());
        }
    }

    pub(super) fn check_liveness<E: ?Sized>(
        &self,
        i: usize,
        now_ns: u64,
        hooks: &dyn Hooks<E>,
    ) -> Result<(), CommError> {
        let link = &self.links[i];
        let watched = !link.closed && !link.goodbye_received;
        (self.liveness)
            .check_link(i, now_ns, watched, !link.writing.is_empty())
            .map_err(|reason| lost(hooks, link.peer, &reason.to_string()))
    }

    /// Queues a goodbye on every link: this process sends nothing more this run.
    pub(super) fn say_goodbye(&mut self) {
        for l in &mut self.links {
            l.control
                .push_back(Header::control(FrameKind::Goodbye, 0).encode().to_vec());
            l.goodbye_sent = true;
        }
    }

    /// Best effort: tells every peer why this process gives up (finishing a partly written
    /// frame first, so the abort arrives on a frame boundary), within a short deadline.
    pub(super) fn abort_all<E: Endpoint + ?Sized>(&mut self, endpoint: &E, reason: &str) {
        let payload = reason.as_bytes();
        let len = payload.len().min(4096);
        let header = Header::control(FrameKind::Abort, len as u32).encode();
        let body = &payload[..len];
        let deadline = Instant::now() + Duration::from_millis(500);
        for l in &mut self.links {
            l.awaiting.clear();
            l.scheduled.clear();
            if l.closed {
                continue;
            }
            // Only the first frame being written may be partly written; the rest go unsent,
            // and the numbers their tags took go to the abort.
            let first = l.writing.pop_front();
            let pos = std::mem::take(&mut l.written);
            let unsent = l.writing.len() as u64;
            l.writing.clear();
            if let Some(mac) = &mut l.mac {
                mac.seal.unseal(unsent);
            }
            if let Some(current) = first {
                let rest: Vec<u8> = unwritten(current.parts(endpoint), pos)
                    .collect::<Vec<_>>()
                    .concat();
                if !write_all_until(&mut l.stream, &rest, deadline) {
                    continue;
                }
            }
            let mut frame = [&header[..], body].concat();
            if let Some(mac) = &mut l.mac {
                frame.extend_from_slice(&mac.seal.seal(&header, &[body]));
            }
            if write_all_until(&mut l.stream, &frame, deadline) {
                let _ = l.stream.shutdown(std::net::Shutdown::Write);
            }
        }
        // Read and drop what the peers still send for a moment, so that closing does not
        // reset connections whose peers have not yet read the abort.
        let mut sink = vec![0u8; 64 * 1024];
        let drain_until = Instant::now() + Duration::from_millis(200);
        let mut open: Vec<usize> = (0..self.links.len()).collect();
        while !open.is_empty() && Instant::now() < drain_until {
            open.retain(|&i| match self.links[i].stream.read(&mut sink) {
                Ok(0) => false,
                Ok(_) => true,
                Err(e) => {
                    e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted
                }
            });
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Acts on a control frame read whole (and checked) from `link`.
pub(super) fn handle_control<E: ?Sized>(
    link: &mut LinkState,
    header: &Header,
    payload: &[u8],
    hooks: &mut dyn Hooks<E>,
) -> Result<(), CommError> {
    match header.kind {
        FrameKind::Buffers => {
            let relayed = match hooks.extras() {
                Some(x) => x.buffers.handle_frame(link.peer, header, payload),
                None => Err(ProtocolError::Unexpected {
                    from: link.peer,
                    reason: format!("buffers of step {} on a link that relays none", header.step),
                }),
            };
            relayed.map_err(|e| protocol(&*hooks, link.peer, e))
        }
        FrameKind::Goodbye => {
            link.goodbye_received = true;
            Ok(())
        }
        FrameKind::Abort => Err(CommError::Aborted {
            peer: hooks.describe(link.peer),
            step: hooks.step(),
            reason: String::from_utf8_lossy(payload).into_owned(),
        }),
        other => Err(CommError::Protocol {
            peer: hooks.describe(link.peer),
            step: hooks.step(),
            error: ProtocolError::Unexpected {
                from: link.peer,
                reason: format!("{other:?} frame during training"),
            },
        }),
    }
}
