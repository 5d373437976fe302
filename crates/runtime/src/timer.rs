//! A wake-up timer with nanosecond resolution for the communication loop.
//!
//! `epoll_wait` (under mio) takes a timeout in whole milliseconds, which is too coarse for
//! an emulated link: a send window holding 0.4 ms of traffic would leave the link idle for
//! most of every millisecond. A Linux `timerfd` registered with the poll wakes the loop at
//! the exact release time instead.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

/// A one-shot timer that makes its poll token readable when it expires.
pub struct PreciseTimer {
    fd: OwnedFd,
}

impl PreciseTimer {
    /// A disarmed timer registered with `registry` under `token`.
    pub fn new(registry: &Registry, token: Token) -> io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(Self { fd })
    }

    /// Expires once, `after` from now (a zero duration expires at once).
    pub fn arm(&self, after: Duration) -> io::Result<()> {
        // A zero it_value would disarm the timer: one nanosecond is "now".
        let after = after.max(Duration::from_nanos(1));
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: after.as_secs() as i64,
                tv_nsec: i64::from(after.subsec_nanos()),
            },
        };
        timerfd_settime(&self.fd, TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }

    /// Consumes an expiry so that the next one signals the poll again.
    pub fn clear(&self) {
        let mut buf = [0u8; 8];
        // Nothing to read (not expired) is fine.
        let _ = rustix::io::read(&self.fd, &mut buf);
    }
}
