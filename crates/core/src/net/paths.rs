//! The paths between two hosts, each its own queue, serialiser and loss process, and the
//! choice of a path for a frame: per flow by hash (ECMP) or per frame (spraying).

use super::counters::NetCounters;
use super::loss::LossProcess;
use super::profile::{NetworkProfile, PathSpec};
use super::queue::FrameQueue;
use super::rng::{hash, SplitMix64};
use super::window::Backlog;
use super::{transmission_ns, FrameMeta, Nanos};

/// One path as a port sees it. Laid out in the order of use (`repr(C)`, from a cache
/// line's start): the send window reads `work_until`, a frame updates the serialiser's
/// times and the counters' first fields on that line, and reads its rate and latency on
/// the next; the queue and the loss process come after (a frame on the direct path of a
/// simulated host touches two lines, not four).
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub(crate) struct Path<T> {
    /// When everything admitted so far would be serialised, back to back.
    pub work_until: Nanos,
    /// When the serialiser finishes the frame it has started.
    pub free_at: Nanos,
    /// Bytes admitted so far (spraying's tie-break).
    pub bytes_offered: u64,
    /// What went through this path (kept beside its state: counted at every dispatch).
    pub counters: NetCounters,
    /// Bandwidth, latency and loss.
    pub spec: PathSpec,
    /// Frames waiting for (or in) serialisation.
    pub queue: FrameQueue<T>,
    /// Decides losses.
    pub loss: LossProcess,
}

impl<T> Path<T> {
    /// Path `index` of `profile` with the loss stream of `rng_parts` + index.
    pub fn new(profile: &NetworkProfile, spec: PathSpec, rng: SplitMix64) -> Self {
        Self {
            spec,
            queue: FrameQueue::new(
                profile.queue_discipline,
                profile.queue_bytes,
                profile.drop_threshold,
            ),
            loss: LossProcess::new(&spec, rng),
            free_at: 0,
            work_until: 0,
            bytes_offered: 0,
            counters: NetCounters::default(),
        }
    }

    /// Nanoseconds `bytes` take on this path.
    pub fn transmission_ns(&self, bytes: usize) -> Nanos {
        transmission_ns(self.spec.bandwidth_bps, bytes)
    }

    /// When a frame of `bytes` (`tx` ns here) that arrived whole at `arrived` began arriving
    /// at an ingress port that forwards bits as they come (cut-through): one serialisation
    /// earlier at most, less where its sender's NIC (`arrival_bps`) is faster. So an idle
    /// port delivers it as its last bit comes in, not one more serialisation later.
    pub fn first_bit_at(
        &self,
        arrival_bps: Option<f64>,
        arrived: Nanos,
        tx: Nanos,
        bytes: usize,
    ) -> Nanos {
        arrived.saturating_sub(self.arriving_ns(arrival_bps, tx, bytes))
    }

    /// The inverse of [`Path::first_bit_at`]: when a frame of `bytes` (`tx` ns here) must
    /// arrive whole for its first bit to have come in at `first_bit`.
    pub fn whole_arrival(
        &self,
        arrival_bps: Option<f64>,
        first_bit: Nanos,
        tx: Nanos,
        bytes: usize,
    ) -> Nanos {
        first_bit.saturating_add(self.arriving_ns(arrival_bps, tx, bytes))
    }

    /// How long a frame of `bytes` (`tx` ns here) takes to come in from its sender's NIC
    /// (`arrival_bps`): no longer than its serialisation here.
    fn arriving_ns(&self, arrival_bps: Option<f64>, tx: Nanos, bytes: usize) -> Nanos {
        match (arrival_bps, self.spec.bandwidth_bps) {
            (Some(up), Some(own)) if up > own => tx.min(transmission_ns(Some(up), bytes)),
            _ => tx,
        }
    }

    /// How much of the serialiser's time after `now` goes to the host's own TCP bytes that
    /// Linux would still keep in the sockets: TCP small queues let only the path's own share
    /// ([`FrameQueue::own_share`]) into the qdisc, so a datagram or control frame arriving
    /// at `now` waits behind that share, not behind the whole of a large write. Only where
    /// frames cross as packets (`--mtu`): without them a frame is indivisible.
    pub fn own_tcp_in_socket_ns(&self, now: Nanos) -> Nanos {
        let (Some(share), Some(_)) = (self.queue.own_share(), self.spec.packet_bytes) else {
            return 0;
        };
        let unsent_ns: Nanos = (self.queue.own_serialising_after(now))
            .map(|(done, bytes)| done.saturating_sub(now).min(self.transmission_ns(bytes)))
            .sum();
        unsent_ns.saturating_sub(self.transmission_ns(share))
    }

    /// Accounts work of `bytes` admitted at `now`.
    pub fn admit_work(&mut self, now: Nanos, bytes: usize) {
        let tx = self.transmission_ns(bytes);
        self.admit_timed_work(now, bytes, tx);
    }

    /// [`Path::admit_work`] given the `tx` ns the bytes take on this path (a caller that
    /// needs them too computes them once).
    pub fn admit_timed_work(&mut self, now: Nanos, bytes: usize, tx: Nanos) {
        self.work_until = self.work_until.max(now).saturating_add(tx);
        self.bytes_offered = self.bytes_offered.saturating_add(bytes as u64);
    }

    /// Its offered work, for the send window.
    pub fn backlog(&self) -> Backlog {
        Backlog {
            bandwidth_bps: self.spec.bandwidth_bps,
            busy_until: self.work_until,
        }
    }
}

/// The path a frame offered at `now` takes: the one its sender chose, if it did (a datagram
/// link's); a reliable (TCP) flow the first path, as a connection to a host's first address
/// does; another flow by hash of its flow (salted by the job's seed) unless it sprays, then
/// the path where it would finish first, ties to the path that has carried the fewest
/// bytes, then the lowest index.
pub(crate) fn choose<T>(paths: &[Path<T>], meta: &FrameMeta, salt: u64, now: Nanos) -> usize {
    let k = paths.len();
    if let Some(path) = meta.path {
        return path % k.max(1);
    }
    if k <= 1 || (meta.reliable && !meta.spray) {
        return 0;
    }
    if !meta.spray {
        return (hash(&[salt, meta.flow]) % k as u64) as usize;
    }
    let finish = |p: &Path<T>| {
        let tx = p.transmission_ns(meta.bytes);
        p.work_until.max(now).saturating_add(tx)
    };
    (0..k)
        .min_by_key(|&i| (finish(&paths[i]), paths[i].bytes_offered, i))
        .unwrap_or(0)
}
