//! A wake-up timer with nanosecond resolution for the communication loop.
//!
//! `epoll_wait` (under mio) takes a timeout in whole milliseconds, which is too coarse for
//! an emulated link: a send window holding 0.4 ms of traffic would leave the link idle for
//! most of every millisecond. A Linux `timerfd` registered with the poll wakes the loop at
//! the exact release time instead.
//!
//! Setting a timer is a system call that costs microseconds on a virtual machine, and a loop
//! that paces datagrams waits thousands of times a second, mostly for a deadline no sooner
//! than the one already set. So the timer keeps an earlier deadline that has not yet come:
//! the loop then wakes early, finds nothing due and arms again.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use rustix::time::{
    clock_gettime, timerfd_create, timerfd_settime, ClockId, Itimerspec, TimerfdClockId,
    TimerfdFlags, TimerfdTimerFlags, Timespec,
};

/// A one-shot timer that makes its poll token readable when it expires.
pub struct PreciseTimer {
    fd: OwnedFd,
    /// The deadline set and not yet cleared, on the monotonic clock.
    armed: Cell<Option<Duration>>,
}

impl PreciseTimer {
    /// A disarmed timer registered with `registry` under `token`.
    pub fn new(registry: &Registry, token: Token) -> io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(Self {
            fd,
            armed: Cell::new(None),
        })
    }

    /// Expires once, no later than `after` from now (a zero duration expires at once): a
    /// deadline already set, still to come and no later than this one is kept.
    pub fn arm(&self, after: Duration) -> io::Result<()> {
        let now = monotonic_now();
        // A zero it_value would disarm the timer: one nanosecond past now is "now".
        let deadline = now.saturating_add(after.max(Duration::from_nanos(1)));
        if (self.armed.get()).is_some_and(|armed| armed > now && armed <= deadline) {
            return Ok(());
        }
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: i64::try_from(deadline.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(deadline.subsec_nanos()),
            },
        };
        timerfd_settime(&self.fd, TimerfdTimerFlags::ABSTIME, &spec)?;
        self.armed.set(Some(deadline));
        Ok(())
    }

    /// Consumes an expiry so that the next one signals the poll again.
    pub fn clear(&self) {
        let mut buf = [0u8; 8];
        // Nothing to read (not expired) is fine.
        let _ = rustix::io::read(&self.fd, &mut buf);
        self.armed.set(None);
    }
}

/// The monotonic clock's time, the clock the timer counts on.
fn monotonic_now() -> Duration {
    let t = clock_gettime(ClockId::Monotonic);
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(t.tv_nsec).unwrap_or(0);
    Duration::new(secs, nanos)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use mio::{Events, Poll};

    use super::*;

    /// Polls until the timer's token is readable; how long that took.
    fn until_expired(poll: &mut Poll, token: Token) -> io::Result<Duration> {
        let start = Instant::now();
        let mut events = Events::with_capacity(4);
        while start.elapsed() < Duration::from_secs(30) {
            poll.poll(&mut events, Some(Duration::from_secs(1)))?;
            if events.iter().any(|e| e.token() == token) {
                return Ok(start.elapsed());
            }
        }
        Err(io::Error::other("the timer never expired"))
    }

    #[test]
    fn an_earlier_deadline_replaces_a_later_one_and_a_later_one_waits() -> io::Result<()> {
        let mut poll = Poll::new()?;
        let token = Token(7);
        let timer = PreciseTimer::new(poll.registry(), token)?;
        timer.arm(Duration::from_secs(3600))?;
        timer.arm(Duration::from_millis(2))?;
        timer.arm(Duration::from_secs(7200))?;
        let waited = until_expired(&mut poll, token)?;
        assert!(waited < Duration::from_secs(10), "waited {waited:?}");
        timer.clear();
        // Cleared, the timer takes any deadline again.
        timer.arm(Duration::from_millis(1))?;
        until_expired(&mut poll, token)?;
        Ok(())
    }
}
