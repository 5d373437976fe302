//! Schedulers: which queued slice goes next on a link.
//!
//! A scheduler only orders; the driver decides *when* a link can take another frame (its
//! bounded in-flight window), so a slice enqueued later can overtake queued ones at the next
//! frame boundary when the scheduler says so.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// A unit of work waiting for a link: a slice (or ring segment) with its ordering data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pending {
    /// Index of the slice (or segment) in the owner's table.
    pub item: usize,
    /// Priority: smaller goes first under priority scheduling (layer index from the input).
    pub priority: i64,
    /// Tie-breaker within a priority (slice sequence within the key).
    pub sequence: u64,
}

/// Which scheduler a job uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerKind {
    /// Order of readiness (MXNet KVStore's behaviour: the baseline).
    #[default]
    Fifo,
}

/// Orders the work waiting for one link.
pub trait Scheduler: Send {
    /// Adds ready work.
    fn push(&mut self, p: Pending);
    /// Takes the next item to transmit.
    fn pop(&mut self) -> Option<Pending>;
    /// Items waiting.
    fn len(&self) -> usize;
    /// Whether nothing waits.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// First in, first out.
#[derive(Debug, Default)]
pub struct Fifo {
    queue: VecDeque<Pending>,
}

impl Scheduler for Fifo {
    fn push(&mut self, p: Pending) {
        self.queue.push_back(p);
    }
    fn pop(&mut self) -> Option<Pending> {
        self.queue.pop_front()
    }
    fn len(&self) -> usize {
        self.queue.len()
    }
}

/// A new scheduler of the given kind.
pub fn new_scheduler(kind: SchedulerKind) -> Box<dyn Scheduler> {
    match kind {
        SchedulerKind::Fifo => Box::new(Fifo::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_keeps_readiness_order() {
        let mut s = new_scheduler(SchedulerKind::Fifo);
        for (i, prio) in [(0, 5), (1, 1), (2, 3)] {
            s.push(Pending {
                item: i,
                priority: prio,
                sequence: 0,
            });
        }
        let order: Vec<usize> = std::iter::from_fn(|| s.pop()).map(|p| p.item).collect();
        assert_eq!(order, vec![0, 1, 2]);
        assert!(s.is_empty());
    }
}
