//! The loop's rounds. Each keeps the endpoint's call order (see
//! [`syncopate_core::strategy`]): commands, then the endpoint's timer
//! ([`Endpoint::poll_timeout`], armed on the same nanosecond `timerfd` as the frame
//! releases, on the loop's clock: nanoseconds since the loop was created), then transmits
//! (frames handed to the emulated interface, frames due written) until the endpoint has no
//! more, then the hooks drain events; then the loop waits for I/O, a command or the next
//! deadline, reads what arrived, and goes round again. A due timer is handed to
//! [`Endpoint::handle_timeout`] at the top of the next round.
//!
//! Finishing: first drain every frame the endpoint still has, then say goodbye, then return
//! once our goodbyes are written and every peer's goodbye has arrived. A link is not read
//! past its goodbye, so the loop can run again (another endpoint, the next round) over the
//! same links without mixing rounds.

use std::io;
use std::time::Duration;

use mio::Events;
use syncopate_core::net::Port;
use syncopate_core::strategy::Endpoint;

use super::emulation::Gate;
use super::reader::ReadState;
use super::{CommError, CommLoop, Flow, Hooks, LinkStatus, TIMER, WAKER};

impl CommLoop {
    /// Runs until the hooks say [`Flow::Finish`] (then says goodbye and flushes) or an error.
    /// On an error every peer is sent an Abort frame carrying it.
    pub fn run<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        match self.run_inner(endpoint, hooks) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.abort_all(endpoint, &e.to_string());
                Err(e)
            }
        }
    }

    fn run_inner<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        let mut events = Events::with_capacity(256);
        self.start(endpoint, hooks)?;
        let mut finishing = false;
        let mut goodbye_sent = false;
        loop {
            if !finishing && hooks.on_commands(endpoint)? == Flow::Finish {
                finishing = true;
            }
            self.fire_timeout(endpoint);
            finishing = self.transmit(endpoint, hooks, finishing)?;
            let drained = self.is_drained();
            if finishing && drained {
                if !goodbye_sent {
                    self.say_goodbye();
                    goodbye_sent = true;
                    continue;
                }
                if self.links.iter().all(|l| l.goodbye_received) {
                    return Ok(());
                }
            }
            let deadline = endpoint.poll_timeout();
            self.wait(&mut events, deadline)?;
            self.handle_events(&events, endpoint, hooks)?;
            self.publish_pools(endpoint);
            if !finishing && hooks.on_progress(endpoint, self.status())? == Flow::Finish {
                finishing = true;
            }
        }
    }

    /// Readies the links for a run: no goodbyes yet, and the frames of this run that already
    /// wait behind the last run's goodbye, read but not parsed (with no readiness event to
    /// come for them), are read.
    fn start<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        for l in &mut self.links {
            l.goodbye_received = false;
            l.goodbye_sent = false;
        }
        for i in 0..self.links.len() {
            self.read_link(i, endpoint, hooks)?;
        }
        self.read_datagrams(None, endpoint)
    }

    /// Sends the datagrams the pacers let go, and the feedback due.
    fn pump_datagrams(&mut self) {
        let now_ns = self.now_ns();
        if let Some(d) = self.datagram.as_mut() {
            d.pump(now_ns);
        }
    }

    /// Moves the datagrams the pacers let go into their batches, and sends the batches
    /// that are full and the feedback that is due.
    fn batch_datagrams(&mut self) {
        let now_ns = self.now_ns();
        if let Some(d) = self.datagram.as_mut() {
            d.batch_due(now_ns);
        }
    }

    /// Whether nothing waits to be written, on any link or as a datagram.
    fn is_drained(&self) -> bool {
        let datagrams = self.datagram.as_ref();
        (self.links.iter().enumerate())
            .all(|(i, l)| l.is_drained() && datagrams.is_none_or(|d| d.is_drained(i)))
    }

    /// Reads the datagrams waiting on path `path`'s socket (`None`: every path's) and sends
    /// what the pacers allow.
    pub(super) fn read_datagrams<E: Endpoint + ?Sized>(
        &mut self,
        path: Option<usize>,
        endpoint: &mut E,
    ) -> Result<(), CommError> {
        let origin = self.origin;
        let Some(d) = self.datagram.as_mut() else {
            return Ok(());
        };
        let paths = match path {
            Some(j) => j..j + 1,
            None => 0..d.paths(),
        };
        for j in paths {
            d.receive(j, endpoint, origin).map_err(CommError::Local)?;
        }
        let now_ns = super::ns_since(origin);
        // A peer whose datagrams arrive is alive, however long its TCP link stays silent
        // (its heartbeats may wait behind a queue the datagrams fill).
        for i in d.take_heard() {
            self.liveness.handle_received(i, now_ns);
        }
        d.pump(now_ns);
        Ok(())
    }

    /// Reads on from the datagram sockets whose last read ran out of budget.
    fn read_datagram_backlog<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
    ) -> Result<(), CommError> {
        if !(self.datagram.as_ref()).is_some_and(|d| d.has_backlog()) {
            return Ok(());
        }
        let backlogged = self.datagram.as_ref().map(|d| d.backlogged());
        for j in backlogged.unwrap_or_default() {
            self.read_datagrams(Some(j), endpoint)?;
        }
        Ok(())
    }

    /// Hands the endpoint's frames to the interface and writes what is due, until the
    /// endpoint hands over no more: transmitting can complete a step (the last frame handed
    /// over or written), and the hooks may then start the next one, whose frames go out now,
    /// not after a wait that nothing would end (every peer may be waiting for them). Returns
    /// whether the loop is finishing (`finishing`, or the hooks said so).
    fn transmit<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
        mut finishing: bool,
    ) -> Result<bool, CommError> {
        let now_ns = self.now_ns();
        loop {
            self.queue_control(hooks)?;
            // Datagrams the pacer lets go join their batch before the endpoint is asked for
            // more (a link is offered again once its datagrams are in a batch), the ones it
            // hands over now join it too if the pacer allows, and the batch leaves as one.
            self.batch_datagrams();
            let handed = self.fill(endpoint);
            self.pump_datagrams();
            self.release_ingress(endpoint, hooks)?;
            for i in 0..self.links.len() {
                if let Err(e) = self.flush(i, endpoint, hooks) {
                    // A peer that gave up may have said why just before closing: its Abort
                    // is the better error.
                    return Err(match self.read_link(i, endpoint, hooks) {
                        Err(aborted @ CommError::Aborted { .. }) => aborted,
                        _ => e,
                    });
                }
                self.check_liveness(i, now_ns, hooks)?;
            }
            if !finishing && hooks.on_progress(endpoint, self.status())? == Flow::Finish {
                finishing = true;
            }
            if handed == 0 {
                return Ok(finishing);
            }
        }
    }

    /// Reads the links that the wait found readable (or closed, or failed).
    fn handle_events<E: Endpoint + ?Sized>(
        &mut self,
        events: &Events,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        // Datagrams first (a backlog included): a Probe read from a TCP link must find the
        // packets sent before it already read, not waiting in the datagram socket.
        self.read_datagram_backlog(endpoint)?;
        for ev in events.iter() {
            if let Some(j) = self.datagram.as_ref().and_then(|d| d.socket_of(ev.token())) {
                self.read_datagrams(Some(j), endpoint)?;
            }
        }
        for ev in events.iter() {
            if ev.token() == WAKER {
                continue;
            }
            if ev.token() == TIMER {
                self.timer.clear();
                continue;
            }
            if (self.datagram.as_ref()).is_some_and(|d| d.socket_of(ev.token()).is_some()) {
                continue;
            }
            let i = ev.token().0;
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                self.read_link(i, endpoint, hooks)?;
            }
        }
        Ok(())
    }

    /// Waits for I/O, a command or the next deadline; only looks while a datagram socket
    /// holds a backlog (see [`Self::read_datagram_backlog`]). Within `busy_poll` of the last byte
    /// moved it only looks (a zero-timeout poll, then a yield): a process that has just
    /// sent or received is likely to be answered within microseconds, and waking a sleeping
    /// thread costs more than that (tens of microseconds on a virtual machine).
    /// `endpoint_deadline` is the endpoint's own timer ([`Endpoint::poll_timeout`]).
    fn wait(
        &mut self,
        events: &mut Events,
        endpoint_deadline: Option<u64>,
    ) -> Result<(), CommError> {
        let busy_ns = u64::try_from(self.options.busy_poll.as_nanos()).unwrap_or(u64::MAX);
        let backlog = (self.datagram.as_ref()).is_some_and(|d| d.has_backlog());
        let busy = backlog
            || busy_ns > 0
                && (self.liveness.last_activity())
                    .is_some_and(|t| self.now_ns().saturating_sub(t) < busy_ns);
        let timeout = if busy {
            Duration::ZERO
        } else {
            let mut timeout = self.next_timeout();
            if let Some(at) = endpoint_deadline {
                timeout = timeout.min(Duration::from_nanos(at.saturating_sub(self.now_ns())));
            }
            // Every deadline (frame releases, the endpoint's timer) goes to the precise
            // timer; the poll's own timeout is whole milliseconds and only a backstop.
            self.timer
                .arm(timeout)
                .map_err(|e| CommError::Local(format!("arming the timer failed: {e}")))?;
            timeout.max(Duration::from_millis(50))
        };
        if let Err(e) = self.poll.poll(events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(CommError::Local(format!("poll failed: {e}")));
            }
        }
        if busy && events.is_empty() {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Calls the endpoint's [`Endpoint::handle_timeout`] if the time it asked for has come.
    fn fire_timeout<E: Endpoint + ?Sized>(&self, endpoint: &mut E) {
        let now_ns = self.now_ns();
        if endpoint.poll_timeout().is_some_and(|at| at <= now_ns) {
            endpoint.handle_timeout(now_ns);
        }
    }

    fn status(&self) -> LinkStatus {
        LinkStatus {
            goodbyes: self.links.iter().filter(|l| l.goodbye_received).count(),
            links: self.links.len(),
            first_goodbye: (self.links.iter())
                .find(|l| l.goodbye_received)
                .map(|l| l.peer),
        }
    }

    fn next_timeout(&self) -> Duration {
        let now_ns = self.now_ns();
        let heartbeat = Duration::from_nanos(self.options.liveness.heartbeat_ns);
        let mut t = heartbeat.min(Duration::from_millis(100));
        for l in &self.links {
            if let Some((release, _)) = l.scheduled.front() {
                if l.writing.is_empty() {
                    t = t.min(Duration::from_nanos(release.saturating_sub(now_ns)));
                }
            }
        }
        if self.window_full {
            let room = self.egress.room_at(now_ns);
            t = t.min(Duration::from_nanos(room.saturating_sub(now_ns)));
        }
        let ingress = self.ingress.as_ref().and_then(Port::poll_timeout);
        let held = self.links.iter().filter_map(|l| match l.read {
            ReadState::Data {
                gate: Gate::DueAt(at),
                ..
            } => Some(at),
            _ => None,
        });
        let datagram = self.datagram.as_ref().and_then(|d| d.next_deadline(now_ns));
        let port_times = (self.egress.poll_timeout().into_iter())
            .chain(ingress)
            .chain(datagram);
        if let Some(at) = port_times.chain(held).min() {
            t = t.min(Duration::from_nanos(at.saturating_sub(now_ns)));
        }
        t
    }
}
