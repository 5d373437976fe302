//! The bounded-loss receiver's count of one sender's packets of one key share and step.

/// Packets needed of `packets` under a loss bound of `bound_ppm` parts per million:
/// `ceil((1 - p) n)`, in exact integer arithmetic.
pub fn packets_needed(packets: usize, bound_ppm: u64) -> usize {
    let lost = (packets as u128 * u128::from(bound_ppm.min(1_000_000))) / 1_000_000;
    packets - lost as usize
}

/// What marking a packet did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// Already in (a duplicate) or not a packet of the share: ignore its values.
    Ignored,
    /// Counted (before the share completed, or after: values that arrive before the
    /// share is aggregated are used).
    Counted,
    /// Counted, and this packet completed the share.
    Completed,
}

/// Which packets of a share arrived, and whether enough have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketTally {
    arrived: Vec<u32>,
    /// Packets given up for lost (see [`PacketTally::write_off_before`]).
    written_off: Vec<u32>,
    count: usize,
    given_up: usize,
    /// Every packet below this index has arrived or been given up.
    judged: usize,
    packets: usize,
    needed: usize,
}

impl PacketTally {
    /// A share of `packets` packets of which `needed` complete it.
    pub fn new(packets: usize, needed: usize) -> Self {
        Self {
            arrived: vec![0; packets.div_ceil(32)],
            written_off: vec![0; packets.div_ceil(32)],
            count: 0,
            given_up: 0,
            judged: 0,
            packets,
            needed: needed.min(packets),
        }
    }

    /// Whether enough packets are in.
    pub fn is_complete(&self) -> bool {
        self.count >= self.needed
    }

    /// Whether every packet is in.
    pub fn is_whole(&self) -> bool {
        self.count >= self.packets
    }

    /// Whether packet `i` is in.
    pub fn has(&self, i: usize) -> bool {
        self.arrived
            .get(i / 32)
            .is_some_and(|w| w & (1 << (i % 32)) != 0)
    }

    /// Whether packet `i` was given up for lost.
    fn is_written_off(&self, i: usize) -> bool {
        (self.written_off.get(i / 32)).is_some_and(|w| w & (1 << (i % 32)) != 0)
    }

    /// Packet `i` arrived (one given up for lost is ignored: its slice may be gone).
    pub fn mark(&mut self, i: usize) -> Marked {
        if i >= self.packets || self.has(i) || self.is_written_off(i) {
            return Marked::Ignored;
        }
        self.arrived[i / 32] |= 1 << (i % 32);
        self.count += 1;
        if self.count == self.needed {
            Marked::Completed
        } else {
            Marked::Counted
        }
    }

    /// Packet `latest` arrived: every packet sent `reorder` or more before it that is still
    /// missing is given up for lost, as far as the bound allows (at most `packets - needed`
    /// in all), so its slice need not wait for the share to complete. Returns the packets
    /// given up. A sender sends a share's packets in index order, so a packet that many
    /// places behind one that arrived was lost, not overtaken.
    pub fn write_off_before(&mut self, latest: usize, reorder: usize) -> Vec<usize> {
        let end = latest.saturating_sub(reorder).min(self.packets);
        let budget = self.packets - self.needed;
        let mut gone = Vec::new();
        while self.judged < end && self.given_up < budget {
            let i = self.judged;
            if !self.has(i) && !self.is_written_off(i) {
                self.written_off[i / 32] |= 1 << (i % 32);
                self.given_up += 1;
                gone.push(i);
            }
            self.judged += 1;
        }
        gone
    }

    /// The missing packets not given up, one bit each (bit `i % 32` of word `i / 32`), as
    /// a Missing frame carries them.
    pub fn missing_words(&self) -> Vec<u32> {
        let mut words: Vec<u32> = (self.arrived.iter().zip(&self.written_off))
            .map(|(a, w)| !(a | w))
            .collect();
        let tail = self.packets % 32;
        if let (Some(last), true) = (words.last_mut(), tail != 0) {
            *last &= (1u32 << tail) - 1;
        }
        words
    }

    /// Starts over for the next step.
    pub fn reset(&mut self) {
        self.arrived.fill(0);
        self.written_off.fill(0);
        self.count = 0;
        self.given_up = 0;
        self.judged = 0;
    }
}

/// The packet indices whose bits are set in `words`, refusing bits at or past `packets`.
pub fn indices_of(words: &[u32], packets: usize) -> Result<Vec<usize>, String> {
    if words.len() != packets.div_ceil(32) {
        return Err(format!(
            "a bitmap of {} words for {packets} packets",
            words.len()
        ));
    }
    let mut out = Vec::new();
    for (w, &word) in words.iter().enumerate() {
        for bit in 0..32 {
            if word & (1 << bit) != 0 {
                let i = w * 32 + bit;
                if i >= packets {
                    return Err(format!("packet {i} of a share of {packets}"));
                }
                out.push(i);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn needed_is_the_ceiling_of_the_kept_fraction() {
        assert_eq!(packets_needed(100, 10_000), 99);
        assert_eq!(packets_needed(24, 10_000), 24);
        assert_eq!(packets_needed(24, 50_000), 23);
        assert_eq!(packets_needed(7, 0), 7);
        assert_eq!(packets_needed(1, 500_000), 1);
        assert_eq!(packets_needed(2, 500_000), 1);
    }

    #[test]
    fn packets_far_behind_an_arrival_are_given_up_within_the_bound() {
        // 20 packets, 10 % bound: 18 needed, 2 may be given up.
        let mut t = PacketTally::new(20, packets_needed(20, 100_000));
        for i in [0, 2, 3, 5, 6, 7, 8] {
            t.mark(i);
        }
        assert_eq!(
            t.write_off_before(8, 3),
            vec![1, 4],
            "1 and 4 are 3 or more behind"
        );
        assert_eq!(t.mark(1), Marked::Ignored, "a packet given up stays out");
        for i in [9, 10, 12, 13, 14, 15] {
            t.mark(i);
        }
        assert!(
            t.write_off_before(15, 3).is_empty(),
            "the bound is spent: 11 is awaited"
        );
        let missing = indices_of(&t.missing_words(), 20).unwrap();
        assert_eq!(
            missing,
            vec![11, 16, 17, 18, 19],
            "given-up packets are not asked for"
        );
        t.reset();
        assert_eq!(t.mark(1), Marked::Counted, "a new step starts over");
    }

    #[test]
    fn without_a_bound_nothing_is_given_up() {
        let mut t = PacketTally::new(10, 10);
        t.mark(9);
        assert!(t.write_off_before(9, 1).is_empty());
        assert_eq!(indices_of(&t.missing_words(), 10).unwrap().len(), 9);
    }

    proptest! {
        #[test]
        fn completes_at_exactly_the_bound_and_not_before(
            packets in 1usize..300,
            ppm in 0u64..=500_000,
            seed in any::<u64>(),
        ) {
            let needed = packets_needed(packets, ppm);
            let p = ppm as f64 / 1e6;
            prop_assert_eq!(needed as f64, ((1.0 - p) * packets as f64 - 1e-9).ceil().max(0.0));
            let mut order: Vec<usize> = (0..packets).collect();
            let mut rng = crate::net::SplitMix64::new(seed);
            for i in (1..order.len()).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            let mut t = PacketTally::new(packets, needed);
            for (n, &i) in order.iter().enumerate() {
                prop_assert_eq!(t.is_complete(), n >= needed);
                let m = t.mark(i);
                prop_assert_eq!(m, if n + 1 == needed { Marked::Completed } else { Marked::Counted });
                prop_assert_eq!(t.mark(i), Marked::Ignored);
            }
            prop_assert!(t.is_complete());
        }

        #[test]
        fn the_missing_bitmap_names_exactly_what_did_not_arrive(
            arrived in proptest::collection::vec(any::<bool>(), 1..200),
        ) {
            let packets = arrived.len();
            let mut t = PacketTally::new(packets, packets);
            for (i, &a) in arrived.iter().enumerate() {
                if a {
                    t.mark(i);
                }
            }
            let missing = indices_of(&t.missing_words(), packets).unwrap();
            let want: Vec<usize> = (0..packets).filter(|&i| !arrived[i]).collect();
            prop_assert_eq!(missing, want);
        }
    }

    #[test]
    fn bitmaps_out_of_range_are_refused() {
        assert!(indices_of(&[1 << 5], 5).is_err());
        assert!(indices_of(&[0, 0], 5).is_err());
        assert_eq!(indices_of(&[0b10001], 5), Ok(vec![0, 4]));
    }
}
