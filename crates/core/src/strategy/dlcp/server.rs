//! The DLCP server: counts each worker's packets per key share and step, stops the sender
//! once the loss bound allows, answers probes with what is missing, and hands complete
//! shares (lost values filled in) to a P3 server, which sums them in rank order, applies
//! SGD and answers with the parameters.

use super::control::ControlQueue;
use super::geometry::{Geometry, PacketId};
use super::probe::ProbeTimers;
use super::pull::{PullFrame, PullSender};
use super::tally::{indices_of, packets_needed, Marked, PacketTally};
use super::{class_of_layer, DlcpOptions, KeyLoss, LossFill, LossStats};
use crate::pool::Pool;
use crate::strategy::{Endpoint, ProtocolError, PsServer, Rank, ServerSync, Transmit};
use crate::wire::{encode_data_frame, FrameKind, Header};

/// A missing packet this many places behind one of the same share that arrived is given
/// up for lost (as far as the bound allows), so that its slice is aggregated and pulled
/// without waiting for the whole key: TCP counts three duplicate ACKs; spraying over paths
/// of unequal delay reorders a share by a few packets (8 costs nothing in the simulator's
/// cells, where 3 took 1.7 % off a 100 + 20 Mbit/s pair of paths).
const REORDER_PACKETS: usize = 8;

/// One key's share at this server: the step being collected and each worker's packets.
struct Share {
    step: u64,
    tallies: Vec<PacketTally>,
    values: Vec<Option<Vec<f32>>>,
    complete: usize,
}

/// The server side of `--strategy dlcp`.
pub struct DlcpServer {
    inner: PsServer,
    geo: Geometry,
    index: usize,
    workers: usize,
    opts: DlcpOptions,
    layers: usize,
    shares: Vec<Share>,
    /// One packet's receive buffer per worker link: a packet's values are copied into its
    /// share only once it is counted, so a lost, late or duplicated one leaves no trace.
    scratch: Vec<Vec<f32>>,
    /// Share buffers not in use, trimmed once a step to what the last step needed.
    spare: Pool<f32>,
    /// The first key this server holds a share of: its aggregation marks a step's end.
    first_key: Option<usize>,
    /// Per worker link: Stops and Missing bitmaps to send.
    control: Vec<ControlQueue>,
    /// How many of `control`'s queues hold something: a poll looks along its links only
    /// then (a scan of 1,024 empty queues per frame was a sixth of a 1,024-worker run).
    control_pending: usize,
    stats: LossStats,
    /// Per key: values aggregated and filled in.
    key_loss: Vec<KeyLoss>,
    /// Per slice: whether it has been handed to the P3 server this step.
    handed: Vec<bool>,
    /// Per slice: packets still to come (from all workers) before it is whole.
    slice_missing: Vec<usize>,
    /// Per worker, with a pull bound: the parameters' loss-tolerant packets to send.
    pulls: Vec<PullSender>,
    /// One frame of the P3 server's, taken to be cut into packets.
    taken: Vec<u8>,
    /// With control datagrams and a pull bound: the re-probe timers of the parameters'
    /// shares (`worker * keys + key`).
    timers: Option<ProbeTimers>,
}

impl DlcpServer {
    /// Server `index` of the registry `geo` describes, handing complete shares to `inner`.
    pub fn new(
        inner: PsServer,
        geo: Geometry,
        index: usize,
        workers: usize,
        opts: DlcpOptions,
    ) -> Self {
        let keys = geo.registry().keys();
        let layers = keys.iter().map(|k| k.layer + 1).max().unwrap_or(1);
        let ppm = opts.loss_bound_ppm();
        let shares = (0..keys.len())
            .map(|key| {
                let n = geo.share_packets(key, index);
                let owned = if n > 0 { workers } else { 0 };
                Share {
                    step: 0,
                    tallies: vec![PacketTally::new(n, packets_needed(n, ppm)); owned],
                    values: vec![None; owned],
                    complete: 0,
                }
            })
            .collect();
        let first_key = (0..keys.len()).find(|&key| geo.share_packets(key, index) > 0);
        let slices = geo.registry().slices().len();
        let mut server = Self {
            inner,
            index,
            workers,
            layers,
            shares,
            handed: vec![false; slices],
            slice_missing: vec![0; slices],
            scratch: vec![vec![0.0; geo.max_packet()]; workers],
            spare: Pool::new(),
            first_key,
            control: (0..workers).map(|_| ControlQueue::default()).collect(),
            control_pending: 0,
            stats: LossStats::default(),
            key_loss: vec![KeyLoss::default(); keys.len()],
            pulls: if opts.pull_loss_bound_ppm() > 0 {
                (0..workers).map(|_| PullSender::new(&geo)).collect()
            } else {
                Vec::new()
            },
            taken: Vec::new(),
            timers: (opts.control_datagrams && opts.pull_loss_bound_ppm() > 0)
                .then(|| ProbeTimers::new(workers * keys.len(), workers)),
            opts,
            geo,
        };
        for slice in 0..slices {
            server.slice_missing[slice] = server.slice_packets(slice);
        }
        server
    }

    /// Checks a frame about a key share from `link`; answers whether it is late (of a step
    /// this server has aggregated already).
    fn check_share(&self, link: Rank, h: &Header) -> Result<bool, ProtocolError> {
        if link >= self.workers {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "a server accepts frames only from workers",
            ));
        }
        let share = self
            .shares
            .get(h.key as usize)
            .filter(|s| !s.tallies.is_empty())
            .ok_or_else(|| {
                ProtocolError::unexpected(link, h, "this server owns no share of the key")
            })?;
        if h.step > share.step {
            return Err(ProtocolError::unexpected(
                link,
                h,
                &format!("step ahead of the share's step {}", share.step),
            ));
        }
        Ok(h.step < share.step)
    }

    fn check_packet(&self, link: Rank, h: &Header) -> Result<(PacketId, bool), ProtocolError> {
        let last = h.flags.is_last_of_share();
        if last == h.flags.is_loss_tolerant() || (last && self.opts.control_datagrams) {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "a DLCP push must be a loss-tolerant packet, or the reliable last of its share where control is not sent as datagrams",
            ));
        }
        let late = self.check_share(link, h)?;
        let id = self
            .geo
            .locate(h.key as usize, h.offset as usize, h.length as usize)
            .filter(|id| self.geo.registry().owner(id.slice) == self.index)
            .ok_or_else(|| {
                ProtocolError::unexpected(link, h, "not a packet of this server's share")
            })?;
        Ok((id, late))
    }

    /// Queues a Stop (empty `words`) or a Missing for `link` about `key`'s share of `step`;
    /// a Missing replaces one still pending for that share.
    fn queue_control(&mut self, link: Rank, kind: FrameKind, step: u64, key: u32, words: Vec<u32>) {
        let mut header = Header::data(kind, step, key, 0, 0);
        header.sender = (self.workers + self.index) as u32;
        if self.opts.control_datagrams {
            header.flags = header.flags.loss_tolerant();
        }
        let Some(queue) = self.control.get_mut(link) else {
            return;
        };
        let was_empty = queue.is_empty();
        if kind == FrameKind::Missing {
            queue.push_missing(header, words);
        } else {
            queue.push_stop(header);
        }
        if was_empty && !queue.is_empty() {
            self.control_pending += 1;
        }
    }

    fn handle_packet(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let (id, late) = self.check_packet(link, h)?;
        let key = h.key as usize;
        let share = &mut self.shares[key];
        let marked = if late {
            Marked::Ignored
        } else {
            share.tallies[link].mark(id.in_share)
        };
        if marked == Marked::Ignored {
            self.stats.packets_ignored += 1;
            return Ok(());
        }
        self.stats.packets += 1;
        let elems = self.geo.share_elems(key, self.index);
        let spare = &mut self.spare;
        let values = share.values[link].get_or_insert_with(|| {
            let mut v = spare.take_for(elems);
            v.resize(elems, 0.0);
            v
        });
        values[id.share_offset..id.share_offset + id.len]
            .copy_from_slice(&self.scratch[link][..id.len]);
        let completed = marked == Marked::Completed;
        if completed {
            share.complete += 1;
        }
        let gone = share.tallies[link].write_off_before(id.in_share, REORDER_PACKETS);
        // Over TCP a Stop only cuts the sending short: with every packet in, or this one the
        // last, the worker has nothing more to send (the key's parameters end its step).
        let stop = completed
            && (self.opts.control_datagrams
                || !(share.tallies[link].is_whole() || h.flags.is_last_of_share()));
        let (step, done) = (share.step, share.complete == self.workers);
        let slices = (gone.into_iter())
            .filter_map(|i| self.geo.share_packet(key, self.index, i))
            .map(|p| p.slice);
        for slice in std::iter::once(id.slice).chain(slices.collect::<Vec<_>>()) {
            self.slice_missing[slice] = self.slice_missing[slice].saturating_sub(1);
            if self.slice_missing[slice] == 0 && !done {
                self.hand_over(slice)?;
            }
        }
        if stop {
            self.stats.stops += 1;
            self.queue_control(link, FrameKind::Stop, step, h.key, Vec::new());
        }
        if done {
            self.aggregate(key)?;
        }
        Ok(())
    }

    /// A worker's Probe: answered with the bitmap of what is missing; with control
    /// datagrams a Probe of a complete (or aggregated) share is answered with a Stop again,
    /// the one sent before may have been lost.
    fn handle_probe(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let late = self.check_share(link, h)?;
        if late || self.shares[h.key as usize].tallies[link].is_complete() {
            if self.opts.control_datagrams {
                self.queue_control(link, FrameKind::Stop, h.step, h.key, Vec::new());
            }
            return Ok(());
        }
        let words = self.shares[h.key as usize].tallies[link].missing_words();
        self.stats.probes_answered += 1;
        self.queue_control(link, FrameKind::Missing, h.step, h.key, words);
        Ok(())
    }

    /// Every worker's share of `key` is complete: hands each owned slice not yet handed
    /// over to the P3 server, lost values filled in, and starts the key's next step.
    fn aggregate(&mut self, key: usize) -> Result<(), ProtocolError> {
        let slices: Vec<usize> = self
            .geo
            .registry()
            .slices_of(key)
            .filter(|&s| self.geo.registry().owner(s) == self.index && !self.handed[s])
            .collect();
        for slice in slices {
            self.hand_over(slice)?;
        }
        let share = &mut self.shares[key];
        for v in share.values.iter_mut().filter_map(Option::take) {
            self.spare.give(v);
        }
        if self.first_key == Some(key) {
            self.spare.trim();
        }
        share.tallies.iter_mut().for_each(PacketTally::reset);
        share.complete = 0;
        share.step += 1;
        for slice in self.geo.registry().slices_of(key) {
            self.handed[slice] = false;
            self.slice_missing[slice] = self.slice_packets(slice);
        }
        Ok(())
    }

    /// Packets of `slice` still to come from all workers before it is whole.
    fn slice_packets(&self, slice: usize) -> usize {
        let owned = self.geo.registry().owner(slice) == self.index;
        if owned {
            self.geo.packets_of(slice).count() * self.workers
        } else {
            0
        }
    }

    /// Hands `slice` to the P3 server, worker by worker in rank order (so its sum is the
    /// same whatever order packets came in), lost values filled in: either every packet of
    /// every worker is in (the slice goes at once, as in P3), or the key's share is complete.
    fn hand_over(&mut self, slice: usize) -> Result<(), ProtocolError> {
        self.handed[slice] = true;
        let s = self.geo.registry().slices()[slice];
        let share = &self.shares[s.key];
        let packets: Vec<PacketId> = self.geo.packets_of(slice).collect();
        let arrived: Vec<usize> = packets
            .iter()
            .map(|p| share.tallies.iter().filter(|t| t.has(p.in_share)).count())
            .collect();
        for w in 0..self.workers {
            let (key, offset, len) = (s.key as u32, s.offset as u32, s.len as u32);
            let mut h = Header::data(FrameKind::Push, share.step, key, offset, len);
            h.sender = w as u32;
            let slot = self.inner.recv_slot(w, &h)?;
            for (p, &count) in packets.iter().zip(&arrived) {
                let dest = &mut slot[p.offset - s.offset..][..p.len];
                self.stats.entries += p.len as u64;
                self.key_loss[s.key].entries += p.len as u64;
                let got = share.values[w]
                    .as_ref()
                    .filter(|_| share.tallies[w].has(p.in_share));
                match got {
                    Some(v) => {
                        dest.copy_from_slice(&v[p.share_offset..p.share_offset + p.len]);
                        if self.opts.fill == LossFill::Rescale && count < self.workers {
                            let factor = self.workers as f32 / count as f32;
                            dest.iter_mut().for_each(|x| *x *= factor);
                        }
                    }
                    None => {
                        dest.fill(0.0);
                        self.stats.entries_filled += p.len as u64;
                        self.key_loss[s.key].filled += p.len as u64;
                    }
                }
            }
            self.inner.handle_payload(w, &h)?;
        }
        Ok(())
    }

    /// The parameters' header with the priority class of their layer (pulls are reliable).
    fn classed(&self, mut h: Header) -> Header {
        if self.opts.priority {
            let layer = self
                .geo
                .registry()
                .keys()
                .get(h.key as usize)
                .map_or(0, |k| k.layer);
            h.flags = crate::wire::Flags::class(class_of_layer(layer, self.layers));
        }
        h
    }

    fn layer(&self, key: usize) -> usize {
        self.geo.registry().keys().get(key).map_or(0, |k| k.layer)
    }

    /// Takes every parameter frame the P3 server has ready and queues its packets.
    fn take_params(&mut self) {
        let links: Vec<Rank> = (0..self.workers).collect();
        loop {
            self.taken.clear();
            let Some(w) = self.inner.poll_transmit_any(&links, &mut self.taken) else {
                return;
            };
            let mut raw = [0u8; crate::wire::HEADER_LEN];
            raw.copy_from_slice(&self.taken[..crate::wire::HEADER_LEN]);
            let Ok(h) = Header::decode(&raw, u32::MAX) else {
                continue;
            };
            let reg = self.geo.registry();
            let Some(slice) = reg.find_slice(h.key as usize, h.offset as usize, h.length as usize)
            else {
                continue;
            };
            let values: Vec<f32> = self.taken[crate::wire::HEADER_LEN..]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let layer = self.layer(h.key as usize);
            self.pulls[w].take_slice(&self.geo, slice, h.step, layer, &values);
        }
    }

    /// The next parameter packet (or probe) for the worker among `links` whose most urgent
    /// key comes first.
    fn poll_pull(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        self.take_params();
        let mut order: Vec<((usize, usize), Rank)> = links
            .iter()
            .filter_map(|&l| Some((*self.pulls.get(l)?.active.first()?, l)))
            .collect();
        order.sort_unstable();
        for (_, w) in order {
            let Some(frame) = self.pulls[w].next(&self.geo, self.index) else {
                continue;
            };
            let sender = (self.workers + self.index) as u32;
            let (h, values) = match frame {
                PullFrame::Packet(key, p) => {
                    let step = self.pulls[w].step[key];
                    let mut h = self.classed(Header::data(
                        FrameKind::Params,
                        step,
                        key as u32,
                        p.offset as u32,
                        p.len as u32,
                    ));
                    h.flags = h.flags.loss_tolerant().spray_if(self.opts.spray);
                    (h, &self.pulls[w].values[key][p.offset..p.offset + p.len])
                }
                PullFrame::Probe(key) => {
                    let step = self.pulls[w].step[key];
                    let mut h =
                        self.classed(Header::data(FrameKind::Probe, step, key as u32, 0, 0));
                    if let Some(t) = self.timers.as_mut() {
                        h.flags = h.flags.loss_tolerant();
                        t.probe_sent(w * self.shares.len() + key);
                    }
                    (h, &[][..])
                }
            };
            let mut h = h;
            h.sender = sender;
            encode_data_frame(out, &h, values);
            return Some(w);
        }
        None
    }

    /// A worker's Stop or Missing about its parameters.
    fn handle_pull_answer(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let key = h.key as usize;
        let packets = self.geo.share_packets(key, self.index);
        if self.pulls.is_empty() || link >= self.workers || packets == 0 {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "an answer about parameters this server does not send as packets",
            ));
        }
        let layer = self.layer(key);
        if h.kind == FrameKind::Stop {
            if self.pulls[link].stop(key, h.step, layer) {
                self.pull_answered(link, key);
            }
            return Ok(());
        }
        let words: Vec<u32> = self.scratch[link][..h.length as usize]
            .iter()
            .map(|w| w.to_bits())
            .collect();
        let missing =
            indices_of(&words, packets).map_err(|e| ProtocolError::unexpected(link, h, &e))?;
        if self.pulls[link].resend(key, h.step, layer, missing) {
            self.pull_answered(link, key);
        }
        Ok(())
    }

    /// Worker `w` answered the Probe of `key`'s parameters: no re-probe.
    fn pull_answered(&mut self, w: Rank, key: usize) {
        let keys = self.shares.len();
        if let Some(t) = self.timers.as_mut() {
            t.answered(w * keys + key);
        }
    }

    fn poll_control(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        if self.control_pending == 0 {
            return None;
        }
        let link = links
            .iter()
            .copied()
            .find(|&l| self.control.get(l).is_some_and(|q| !q.is_empty()))?;
        let queue = &mut self.control[link];
        let sent = queue.encode_next(out);
        if queue.is_empty() {
            self.control_pending -= 1;
        }
        sent.then_some(link)
    }
}

impl Endpoint for DlcpServer {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        self.poll_transmit_any(&[link], out).is_some()
    }

    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        if let Some(link) = self.poll_control(links, out) {
            return Some(link);
        }
        if !self.pulls.is_empty() {
            return self.poll_pull(links, out);
        }
        let start = out.len();
        let link = self.inner.poll_transmit_any(links, out)?;
        let mut raw = [0u8; crate::wire::HEADER_LEN];
        raw.copy_from_slice(&out[start..start + crate::wire::HEADER_LEN]);
        if let Ok(h) = Header::decode(&raw, u32::MAX) {
            out[start..start + crate::wire::HEADER_LEN].copy_from_slice(&self.classed(h).encode());
        }
        Some(link)
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        if let Some(link) = self.poll_control(links, out) {
            return Some(Transmit::Copied(link));
        }
        if !self.pulls.is_empty() {
            return self.poll_pull(links, out).map(Transmit::Copied);
        }
        match self.inner.poll_transmit_lent(links, out)? {
            Transmit::Lent(link, h) => {
                let h2 = self.classed(h);
                let start = out.len() - crate::wire::HEADER_LEN;
                out[start..].copy_from_slice(&h2.encode());
                Some(Transmit::Lent(link, h2))
            }
            copied => Some(copied),
        }
    }

    fn lent_payload(&self, header: &Header) -> &[f32] {
        self.inner.lent_payload(header)
    }

    fn handle_sent(&mut self, link: Rank, header: &Header) {
        self.inner.handle_sent(link, header)
    }

    fn pooled_bytes(&self) -> usize {
        self.spare.bytes() + self.inner.pooled_bytes()
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        match h.kind {
            FrameKind::Push => {
                let (id, _) = self.check_packet(link, h)?;
                Ok(&mut self.scratch[link][..id.len])
            }
            FrameKind::Probe => {
                self.check_share(link, h)?;
                Ok(&mut [])
            }
            FrameKind::Stop | FrameKind::Missing if !self.pulls.is_empty() => {
                let packets = self.geo.share_packets(h.key as usize, self.index);
                let words = if h.kind == FrameKind::Missing {
                    packets.div_ceil(32)
                } else {
                    0
                };
                if link >= self.workers || packets == 0 || h.length as usize != words {
                    return Err(ProtocolError::unexpected(
                        link,
                        h,
                        "not an answer about this server's parameters",
                    ));
                }
                let buf = &mut self.scratch[link];
                if buf.len() < words {
                    buf.resize(words, 0.0);
                }
                Ok(&mut buf[..words])
            }
            _ => Err(ProtocolError::unexpected(
                link,
                h,
                "a DLCP server expects packets and probes",
            )),
        }
    }

    fn accepts_loss(&self, link: Rank, h: &Header) -> bool {
        let control = h.kind == FrameKind::Probe
            || (matches!(h.kind, FrameKind::Stop | FrameKind::Missing) && !self.pulls.is_empty());
        let packet = h.kind == FrameKind::Push && !h.flags.is_last_of_share();
        (packet || (control && self.opts.control_datagrams)) && link < self.workers
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.timers.as_ref()?.poll_timeout()
    }

    fn handle_timeout(&mut self, now_ns: u64) {
        let keys = self.shares.len().max(1);
        let Some(timers) = self.timers.as_mut() else {
            return;
        };
        for i in timers.handle_timeout(now_ns, |i| i / keys) {
            let (w, key) = (i / keys, i % keys);
            let layer = self.layer(key);
            if let Some(pull) = self.pulls.get_mut(w) {
                pull.probe_again(key, layer);
            }
        }
    }

    fn handle_path_rtt(&mut self, link: Rank, srtt_ns: u64) {
        if let Some(t) = self.timers.as_mut() {
            t.set_srtt(link, srtt_ns);
        }
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        match h.kind {
            FrameKind::Push if h.flags.is_last_of_share() => {
                self.handle_packet(link, h)?;
                self.handle_probe(link, h)
            }
            FrameKind::Push => self.handle_packet(link, h),
            FrameKind::Probe => self.handle_probe(link, h),
            FrameKind::Stop | FrameKind::Missing => self.handle_pull_answer(link, h),
            _ => Err(ProtocolError::unexpected(
                link,
                h,
                "a DLCP server expects packets and probes",
            )),
        }
    }
}

impl ServerSync for DlcpServer {
    fn state(&self) -> (&[Vec<f32>], &[Vec<f32>]) {
        self.inner.state()
    }

    fn restore(
        &mut self,
        params: Vec<Vec<f32>>,
        velocity: Vec<Vec<f32>>,
        first_step: u64,
    ) -> Result<(), String> {
        self.inner.restore(params, velocity, first_step)?;
        self.shares.iter_mut().for_each(|s| s.step = first_step);
        Ok(())
    }

    fn poll_step_complete(&mut self) -> Option<u64> {
        self.inner.poll_step_complete()
    }

    fn values(&self, key: usize) -> &[f32] {
        self.inner.values(key)
    }

    fn updates(&self) -> u64 {
        self.inner.updates()
    }

    fn peak_early_values(&self) -> usize {
        self.inner.peak_early_values()
    }

    fn latest_step(&self) -> u64 {
        self.inner.latest_step()
    }

    fn has_pending_replies(&self) -> bool {
        self.inner.has_pending_replies()
            || self.control.iter().any(|q| !q.is_empty())
            || self.pulls.iter().any(PullSender::pending)
    }

    fn loss_stats(&self) -> Option<LossStats> {
        Some(self.stats)
    }

    fn key_loss(&self) -> Vec<KeyLoss> {
        self.key_loss.clone()
    }
}
