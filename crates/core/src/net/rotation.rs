//! Fairness among a host's links: the order in which a driver offers its links to the
//! endpoint's scheduler, and how many bytes one link may hold when the network has no
//! bandwidth to pace it. One rule for both drivers.
//!
//! The scheduler picks the most urgent frame among the links it is offered and breaks ties
//! by the order it is given them; the driver rotates that order so that no link always
//! wins a tie. The order moves on with each frame sent, never with a poll that sent
//! nothing: a driver that polls in vain more often (the runtime after every wake-up, the
//! simulator's exhaustive polling) keeps the same order as one that polls less, which
//! matters where frames wait for two links at once.

use super::NetworkProfile;

/// Where a host's link rotation stands: how many frames the host has sent (a count that
/// wraps; only its remainder by the number of links offered matters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rotation {
    sent: usize,
}

impl Rotation {
    /// A rotation that starts with the first link.
    pub fn new() -> Self {
        Self::default()
    }

    /// The index of the link to offer first among `links` of them (0 when there are none).
    pub fn first(&self, links: usize) -> usize {
        self.sent.checked_rem(links).unwrap_or(0)
    }

    /// The current order of `links` (every link once), as a window of `twice`, which holds
    /// the links and then the same links again (so that the order is a sub-slice, with no
    /// copy). A `twice` of odd length has its last element ignored.
    pub fn window<'a, T>(&self, twice: &'a [T]) -> &'a [T] {
        let links = twice.len() / 2;
        let first = self.first(links);
        twice.get(first..first + links).unwrap_or_default()
    }

    /// Puts `links` in the current order, in place (the first one to offer in front).
    pub fn arrange<T>(&self, links: &mut [T]) {
        let first = self.first(links.len());
        links.rotate_left(first);
    }

    /// A frame was sent: the next offer starts one link further on.
    pub fn sent(&mut self) {
        self.sent = self.sent.wrapping_add(1);
    }
}

/// How many bytes one link may hold before its frames are written out when the network has
/// no bandwidth limit: a send window's worth, as a socket's own buffer back-pressures its
/// sender. With a bandwidth the emulated interface's window paces every link together, and
/// a link holds what the interface admits.
///
/// Only a driver with real sockets needs it: the simulator's frames never wait between the
/// interface and the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkCap {
    /// The bytes a link may hold (`None`: no limit of its own).
    limit: Option<usize>,
}

impl LinkCap {
    /// The cap of a host on `profile`'s network.
    pub fn new(profile: &NetworkProfile) -> Self {
        Self {
            limit: (profile.bandwidth_bps.is_none()).then_some(profile.buffer_bytes),
        }
    }

    /// Whether a link holding `queued` bytes not yet written may be offered another frame.
    pub fn admits(&self, queued: usize) -> bool {
        self.limit.is_none_or(|limit| queued < limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_fresh_rotation_starts_with_the_first_link() {
        let r = Rotation::new();
        assert_eq!(r.first(3), 0);
        assert_eq!(r.window(&[7, 8, 9, 7, 8, 9]), &[7, 8, 9]);
        let mut links = [7, 8, 9];
        r.arrange(&mut links);
        assert_eq!(links, [7, 8, 9]);
    }

    #[test]
    fn no_links_offer_nothing() {
        let mut r = Rotation::new();
        r.sent();
        assert_eq!(r.first(0), 0);
        assert!(r.window::<u32>(&[]).is_empty());
        r.arrange::<u32>(&mut []);
    }

    #[test]
    fn only_a_frame_sent_moves_the_order_on() {
        let mut r = Rotation::new();
        let twice = [1, 2, 3, 1, 2, 3];
        assert_eq!(r.window(&twice), &[1, 2, 3]);
        r.sent();
        assert_eq!(r.window(&twice), &[2, 3, 1]);
        r.sent();
        r.sent();
        assert_eq!(r.window(&twice), &[1, 2, 3]);
    }

    #[test]
    fn the_cap_holds_only_without_a_bandwidth() {
        let mut profile = NetworkProfile {
            buffer_bytes: 1000,
            ..NetworkProfile::default()
        };
        let cap = LinkCap::new(&profile);
        assert!(cap.admits(999));
        assert!(!cap.admits(1000));
        profile.bandwidth_bps = Some(1e9);
        let cap = LinkCap::new(&profile);
        assert!(cap.admits(usize::MAX));
    }

    proptest! {
        /// The doubled list's window and the in-place arrangement give the same order, a
        /// rotation of the links, whatever was sent.
        #[test]
        fn window_and_arrange_agree(sent in any::<usize>(), links in 1usize..40) {
            let r = Rotation { sent };
            let list: Vec<usize> = (0..links).collect();
            let twice: Vec<usize> = list.iter().chain(&list).copied().collect();
            let mut arranged = list.clone();
            r.arrange(&mut arranged);
            prop_assert_eq!(r.window(&twice), &arranged[..]);
            prop_assert_eq!(arranged[0], r.first(links));
            prop_assert!(r.first(links) < links);
        }

        /// Over any `links` frames sent in a row, every link is offered first exactly once.
        #[test]
        fn every_link_leads_once_a_round(start in 0..usize::MAX / 2, links in 1usize..40) {
            let mut r = Rotation { sent: start };
            let mut led = vec![0u32; links];
            for _ in 0..links {
                led[r.first(links)] += 1;
                r.sent();
            }
            prop_assert!(led.iter().all(|&n| n == 1));
        }
    }
}
