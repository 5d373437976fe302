//! The direct path of a [`Port`]: one lossless path under `fifo` with an unbounded queue,
//! the egress of every simulation without loss, paths or finite queues, and of every
//! emulated link of the runtime. There a frame's fate is known the moment it is offered, it
//! can never be refused, lost or retransmitted, and frames leave in the order they came and
//! arrive one constant latency later (so every flow stays in order by itself): the port
//! computes the decision directly, without the queue, the loss draw or the reorder
//! buffer the general path takes each frame through. The decisions, timings and counters
//! are the general path's, bit for bit (`the_direct_path_decides_as_the_general_one`).

use super::{Decision, Direction, Fate, FrameMeta, Nanos, Port};

impl Port {
    /// Whether frames may take the direct path: an egress port of one path that never
    /// loses, a `fifo` queue without a bound (nothing is ever refused, lost, retransmitted
    /// or reordered).
    pub(super) fn direct_path_applies(&self, direction: Direction) -> bool {
        direction == Direction::Egress
            && !self.lazy
            && self.paths.len() == 1
            && self.paths.iter().all(|p| {
                p.queue.is_unbounded_fifo() && p.loss.never_loses() && p.spec.packet_bytes.is_none()
            })
    }

    /// [`Port::enqueue`] on the direct path: serialised after what the path already
    /// holds, decided at once.
    pub(super) fn enqueue_direct(&mut self, now: Nanos, token: u64, meta: FrameMeta) {
        self.clock = self.clock.max(now);
        let slot = self.count_flows.then(|| self.slot(meta.flow));
        let Some(path) = self.paths.first_mut() else {
            return;
        };
        let bytes = meta.bytes;
        let tx = path.transmission_ns(bytes);
        path.admit_timed_work(now, bytes, tx);
        let start = path.free_at.max(now);
        let done = start.saturating_add(tx);
        path.free_at = done;
        let queued = start.saturating_sub(now);
        path.counters.sent(bytes, queued);
        if let Some(counters) = slot.and_then(|s| self.flow_counters.get_mut(s)) {
            counters.sent(bytes, queued);
        }
        let at = done.saturating_add(path.spec.latency_ns);
        self.ready.push_back(Decision {
            token,
            fate: Fate::Delivered {
                at,
                retransmissions: 0,
                path: 0,
            },
            start,
            done,
            first_arrival: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::net::{NetworkProfile, QueueDiscipline};

    /// What a driver sees of a port after each step: the decisions taken, the window, the
    /// counters.
    fn observe(port: &mut Port, now: Nanos) -> (Vec<Decision>, bool, Nanos, usize) {
        let decisions = std::iter::from_fn(|| port.poll_decision(now)).collect();
        let room = (port.has_room(now), port.room_at(now));
        (decisions, room.0, room.1, port.backlog_bytes(now))
    }

    #[test]
    fn only_a_lossless_unbounded_fifo_egress_of_one_path_is_direct() {
        let plain = NetworkProfile {
            bandwidth_bps: Some(1e9),
            ..NetworkProfile::default()
        };
        assert!(Port::egress(&plain, 1, 0).direct);
        assert!(!Port::ingress(&plain, 1, 0).direct);
        let variants = [
            NetworkProfile {
                loss: 0.01,
                ..plain.clone()
            },
            NetworkProfile {
                queue_bytes: Some(1 << 20),
                ..plain.clone()
            },
            NetworkProfile {
                queue_discipline: QueueDiscipline::Prio,
                ..plain.clone()
            },
            NetworkProfile {
                paths: 2,
                ..plain.clone()
            },
        ];
        for profile in variants {
            assert!(!Port::egress(&profile, 1, 0).direct, "{profile:?}");
        }
    }

    proptest! {
        /// The direct path and the general one give the same decisions, send window and
        /// counters (total, per path, per flow) for any frames offered at any times.
        #[test]
        fn the_direct_path_decides_as_the_general_one(
            bps in prop::option::of(1e6f64..1e11),
            latency_ns in 0u64..100_000,
            window in 0usize..400_000,
            frames in prop::collection::vec((0u64..20_000, 1usize..200_000, 0u64..4, any::<bool>()), 1..60),
        ) {
            let profile = NetworkProfile {
                bandwidth_bps: bps,
                latency_ns,
                buffer_bytes: window,
                ..NetworkProfile::default()
            };
            let mut direct = Port::egress(&profile, 7, 3);
            let mut general = Port::egress(&profile, 7, 3);
            prop_assert!(direct.direct);
            general.direct = false;
            let mut now = 0;
            for (token, (gap, bytes, flow, reliable)) in frames.into_iter().enumerate() {
                now += gap;
                let meta = FrameMeta {
                    reliable,
                    ..FrameMeta::reliable(bytes, flow)
                };
                direct.enqueue(now, token as u64, meta);
                general.enqueue(now, token as u64, meta);
                prop_assert_eq!(observe(&mut direct, now), observe(&mut general, now));
                prop_assert_eq!(direct.poll_timeout(), general.poll_timeout());
            }
            prop_assert_eq!(direct.counters(), general.counters());
            prop_assert_eq!(direct.path_counters(), general.path_counters());
            for flow in 0..4 {
                prop_assert_eq!(direct.flow_counters(flow), general.flow_counters(flow));
            }
        }
    }
}
