//! Worker 0's buffers (batch-norm running statistics) relayed to every worker at each
//! evaluation point, as PyTorch DDP's `broadcast_buffers` makes every replica hold rank 0's.
//!
//! Buffers are not gradients: no strategy averages them, so each worker's running
//! statistics follow its own batches. At every evaluation point (the step sequencer's
//! [`crate::step::Action::SyncBuffers`], the last step included) worker 0 sends its buffers
//! along a spanning tree of the links the strategy already opens ([`BufferRoute`]), and every
//! worker installs them before anything evaluates or is saved: a synchronous job then holds
//! the same model on every worker, and any of them evaluates as worker 0 does.
//!
//! [`BufferRelay`] is the sans-IO state machine of one process: worker 0 hands it its
//! values ([`BufferRelay::handle_local`]); every process hands it the
//! [`FrameKind::Buffers`] frames it receives ([`BufferRelay::handle_frame`]); it answers
//! with frames to write ([`BufferRelay::poll_transmit`]) and, on workers, complete sets of
//! values to install ([`BufferRelay::poll_delivered`]). A frame carries up to
//! [`BUFFER_CHUNK_ELEMS`] values; its header's `key` is the total count, `offset` the first
//! value carried, `step` the evaluation point's step.

use std::collections::VecDeque;

use crate::strategy::{ProtocolError, Rank, StrategyKind};
use crate::wire::{encode_data_frame, FrameKind, Header};

/// Most values one buffers frame carries (64 KiB of payload: what a driver accepts for a
/// frame beside the strategy's).
pub const BUFFER_CHUNK_ELEMS: usize = 16 * 1024;

/// Most buffer values a relay accepts in one set (a guard against a hostile `key`).
pub const MAX_BUFFER_ELEMS: usize = 1 << 26;

/// Where one process's buffers frames come from and go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferRoute {
    /// The link they arrive on (`None` for worker 0, which originates them, and for
    /// processes that take no part).
    pub from: Option<Rank>,
    /// The links this process sends (or forwards) them on.
    pub to: Vec<Rank>,
    /// Whether this process installs them (every worker but worker 0).
    pub installs: bool,
}

impl BufferRoute {
    /// The route of `rank` in a job of `strategy` with `workers` workers and `servers`
    /// servers, over links the strategy opens: parameter servers relay through the first
    /// server (worker 0 -> server 0 -> every other worker); ring strategies pass them down
    /// the ring (worker 0 -> 1 -> ... -> n-1).
    pub fn of(strategy: StrategyKind, workers: usize, servers: usize, rank: Rank) -> Self {
        let none = Self {
            from: None,
            to: Vec::new(),
            installs: false,
        };
        if workers < 2 {
            return none;
        }
        if strategy.uses_servers() {
            let hub = workers;
            return match rank {
                0 if servers > 0 => Self {
                    to: vec![hub],
                    ..none
                },
                r if r == hub => Self {
                    from: Some(0),
                    to: (1..workers).collect(),
                    installs: false,
                },
                r if r < workers && servers > 0 => Self {
                    from: Some(hub),
                    to: Vec::new(),
                    installs: true,
                },
                _ => none,
            };
        }
        match rank {
            r if r >= workers => none,
            r => Self {
                from: r.checked_sub(1),
                to: if r + 1 < workers { vec![r + 1] } else { vec![] },
                installs: r > 0,
            },
        }
    }

    /// Whether this process takes any part.
    pub fn takes_part(&self) -> bool {
        self.from.is_some() || !self.to.is_empty()
    }
}

/// The values of a set being received.
#[derive(Debug)]
struct Assembly {
    step: u64,
    values: Vec<f32>,
    filled: usize,
}

/// One process's part in relaying worker 0's buffers; see the module docs.
#[derive(Debug)]
pub struct BufferRelay {
    route: BufferRoute,
    /// How many values a set holds, where this process installs them (the model's buffers).
    expected: Option<usize>,
    outgoing: VecDeque<(Rank, Vec<u8>)>,
    assembly: Option<Assembly>,
    delivered: VecDeque<(u64, Vec<f32>)>,
    /// The step of the last set received whole (sets come in step order).
    last_step: Option<u64>,
}

impl BufferRelay {
    /// A relay along `route`; `expected` is the number of buffer values of the model, which
    /// a worker that installs them must know (a relaying server need not).
    pub fn new(route: BufferRoute, expected: Option<usize>) -> Self {
        Self {
            route,
            expected,
            outgoing: VecDeque::new(),
            assembly: None,
            delivered: VecDeque::new(),
            last_step: None,
        }
    }

    /// The route this relay follows.
    pub fn route(&self) -> &BufferRoute {
        &self.route
    }

    /// Worker 0: its buffers at the evaluation point after step `step`, to send.
    pub fn handle_local(&mut self, step: u64, values: &[f32]) {
        let total = values.len() as u32;
        let mut offset = 0;
        for chunk in values.chunks(BUFFER_CHUNK_ELEMS) {
            let header = Header::data(
                FrameKind::Buffers,
                step,
                total,
                offset as u32,
                chunk.len() as u32,
            );
            let mut frame = Vec::with_capacity(crate::wire::HEADER_LEN + 4 * chunk.len());
            encode_data_frame(&mut frame, &header, chunk);
            self.queue(&frame);
            offset += chunk.len();
        }
    }

    /// A [`FrameKind::Buffers`] frame from `link` (its header and raw payload): checked,
    /// forwarded down the route, and (where this process installs them) assembled.
    pub fn handle_frame(
        &mut self,
        link: Rank,
        header: &Header,
        payload: &[u8],
    ) -> Result<(), ProtocolError> {
        let refuse = |why: &str| Err(ProtocolError::unexpected(link, header, why));
        if self.route.from != Some(link) {
            return refuse("buffers from a link they are not relayed on");
        }
        let total = header.key as usize;
        if header.kind != FrameKind::Buffers
            || payload.len() != 4 * header.length as usize
            || header.length == 0
            || header.end() > total as u64
            || total > MAX_BUFFER_ELEMS
        {
            return refuse("malformed buffers frame");
        }
        if self.route.installs {
            self.assemble(header, payload).or_else(|why| refuse(&why))?;
        }
        let mut frame = Vec::with_capacity(crate::wire::HEADER_LEN + payload.len());
        frame.extend_from_slice(&header.encode());
        frame.extend_from_slice(payload);
        self.queue(&frame);
        Ok(())
    }

    /// Adds a checked frame's values to the set being assembled; `Err` says why the frame
    /// does not fit it.
    fn assemble(&mut self, header: &Header, payload: &[u8]) -> Result<(), String> {
        let out_of_order = || Err("buffers out of order".to_string());
        let total = header.key as usize;
        if self.expected.is_some_and(|n| n != total) {
            return Err(format!(
                "buffers of {total} values where the model has {}",
                self.expected.unwrap_or(0)
            ));
        }
        if self.assembly.is_none() {
            if header.offset != 0 || self.last_step.is_some_and(|s| header.step <= s) {
                return out_of_order();
            }
            self.assembly = Some(Assembly {
                step: header.step,
                values: vec![0.0; total],
                filled: 0,
            });
        }
        let Some(a) = self.assembly.as_mut() else {
            return out_of_order();
        };
        if a.step != header.step || a.filled != header.offset as usize || a.values.len() != total {
            return out_of_order();
        }
        let dst = &mut a.values[a.filled..a.filled + header.length as usize];
        for (v, b) in dst.iter_mut().zip(payload.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        a.filled += header.length as usize;
        if a.filled == total {
            if let Some(done) = self.assembly.take() {
                self.last_step = Some(done.step);
                self.delivered.push_back((done.step, done.values));
            }
        }
        Ok(())
    }

    fn queue(&mut self, frame: &[u8]) {
        for &to in &self.route.to {
            self.outgoing.push_back((to, frame.to_vec()));
        }
    }

    /// The next frame to write and its link (in order per link).
    pub fn poll_transmit(&mut self) -> Option<(Rank, Vec<u8>)> {
        self.outgoing.pop_front()
    }

    /// The next complete set of worker 0's buffers, with the step it was sent after.
    pub fn poll_delivered(&mut self) -> Option<(u64, Vec<f32>)> {
        self.delivered.pop_front()
    }
}

#[cfg(test)]
mod tests;
