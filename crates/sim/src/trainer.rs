//! A worker's training loop as a sans-IO state machine, following the runtime's worker loop:
//! forward layer by layer, backward from the last layer handing over each layer's gradients,
//! then waiting for the step's synchronisation. Compute is sequential; the driver times each
//! [`Action::Compute`] and reports it back with [`Trainer::compute_done`].
//!
//! With forward overlap (parameter servers with overlap) layer `k` of the next forward waits
//! only for layer `k`'s fresh values, and the step begins (`begin_step`) after the forward
//! once the last step's StepDone has arrived; otherwise the step begins before the forward
//! and the worker waits for StepDone after backward.

use std::ops::Range;
use std::rc::Rc;

use syncopate_core::strategy::WorkerEvent;

/// What the driver should do next for this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Call `begin_step(step)`.
    Begin(u64),
    /// Run layer `layer`'s forward (or backward) and call back when done.
    Compute {
        /// Layer index.
        layer: usize,
        /// Backward rather than forward.
        backward: bool,
    },
    /// Hand over the gradients of every key of `layer`.
    Gradients(usize),
    /// Call `handle_backward_done`.
    BackwardDone,
    /// Nothing until an event arrives or the compute finishes.
    Idle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Forward(usize),
    Backward(usize),
    Gradients(usize),
    AwaitStepDone,
    Finished,
}

/// One worker's loop.
#[derive(Debug, Clone)]
pub(crate) struct Trainer {
    steps: u64,
    forward_overlap: bool,
    layer_keys: Rc<[Range<usize>]>,
    step: u64,
    phase: Phase,
    busy: bool,
    have: Vec<bool>,
    step_done: bool,
    steps_done: u64,
}

impl Trainer {
    /// A worker running `steps` steps of a model whose layers own `layer_keys`.
    pub fn new(steps: u64, forward_overlap: bool, layer_keys: Rc<[Range<usize>]>) -> Self {
        let keys = layer_keys.iter().map(|r| r.end).max().unwrap_or(0);
        Self {
            steps,
            forward_overlap,
            layer_keys,
            step: 0,
            phase: Phase::Start,
            busy: false,
            have: vec![true; keys],
            step_done: true,
            steps_done: 0,
        }
    }

    /// The step being run (or `steps` when finished).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// StepDone events received.
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// Whether every step has run and been synchronised.
    pub fn finished(&self) -> bool {
        self.phase == Phase::Finished && self.steps_done == self.steps
    }

    /// Where the worker stands, for stall reports.
    pub fn describe(&self) -> String {
        format!(
            "step {} {:?}{}, {} StepDone received",
            self.step,
            self.phase,
            if self.busy { " (computing)" } else { "" },
            self.steps_done
        )
    }

    /// The layer being computed finished.
    pub fn compute_done(&mut self) {
        self.busy = false;
    }

    /// An event from the strategy.
    pub fn on_event(&mut self, ev: WorkerEvent) {
        match ev {
            WorkerEvent::ParamsReady(k) => {
                if let Some(h) = self.have.get_mut(k) {
                    *h = true;
                }
            }
            WorkerEvent::GradReady(_) => {}
            WorkerEvent::StepDone => {
                self.step_done = true;
                self.steps_done += 1;
            }
        }
    }

    /// The next thing to do.
    pub fn next(&mut self) -> Action {
        let layers = self.layer_keys.len();
        loop {
            if self.busy {
                return Action::Idle;
            }
            match self.phase {
                Phase::Start if self.step == self.steps => self.phase = Phase::Finished,
                Phase::Start => {
                    self.phase = Phase::Forward(0);
                    if !self.forward_overlap {
                        self.step_done = false;
                        return Action::Begin(self.step);
                    }
                }
                Phase::Forward(k) if k == layers => {
                    if !self.forward_overlap {
                        self.phase = Phase::Backward(layers);
                        continue;
                    }
                    if !self.step_done {
                        return Action::Idle;
                    }
                    // Every value of the last step is in: this step begins.
                    self.phase = Phase::Backward(layers);
                    self.step_done = false;
                    self.have.iter_mut().for_each(|h| *h = false);
                    return Action::Begin(self.step);
                }
                Phase::Forward(k) => {
                    let ready = || self.have[self.layer_keys[k].clone()].iter().all(|&h| h);
                    if self.forward_overlap && !ready() {
                        return Action::Idle;
                    }
                    self.phase = Phase::Forward(k + 1);
                    self.busy = true;
                    return Action::Compute {
                        layer: k,
                        backward: false,
                    };
                }
                Phase::Backward(0) => {
                    self.phase = if self.forward_overlap {
                        self.step += 1;
                        Phase::Start
                    } else {
                        Phase::AwaitStepDone
                    };
                    return Action::BackwardDone;
                }
                Phase::Backward(k) => {
                    self.phase = Phase::Gradients(k - 1);
                    self.busy = true;
                    return Action::Compute {
                        layer: k - 1,
                        backward: true,
                    };
                }
                Phase::Gradients(k) => {
                    self.phase = Phase::Backward(k);
                    return Action::Gradients(k);
                }
                Phase::AwaitStepDone if self.step_done => {
                    self.step += 1;
                    self.phase = Phase::Start;
                }
                Phase::AwaitStepDone | Phase::Finished => return Action::Idle,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_until_idle(t: &mut Trainer) -> Vec<Action> {
        let mut out = Vec::new();
        loop {
            match t.next() {
                Action::Idle => return out,
                a => {
                    if matches!(a, Action::Compute { .. }) {
                        t.compute_done();
                    }
                    out.push(a);
                }
            }
        }
    }

    /// Two layers, the second owning key 0.
    fn layers() -> Rc<[Range<usize>]> {
        vec![0..0, 0..1].into()
    }

    #[test]
    fn forward_overlap_waits_for_each_layers_values_then_for_step_done() {
        let mut t = Trainer::new(2, true, layers());
        let fwd = |layer| Action::Compute {
            layer,
            backward: false,
        };
        let bwd = |layer| Action::Compute {
            layer,
            backward: true,
        };
        assert_eq!(
            run_until_idle(&mut t),
            vec![
                fwd(0),
                fwd(1),
                Action::Begin(0),
                bwd(1),
                Action::Gradients(1),
                bwd(0),
                Action::Gradients(0),
                Action::BackwardDone,
                fwd(0)
            ]
        );
        // Layer 1 of step 1 needs key 0.
        t.on_event(WorkerEvent::ParamsReady(0));
        assert_eq!(run_until_idle(&mut t), vec![fwd(1)]);
        t.on_event(WorkerEvent::StepDone);
        assert_eq!(run_until_idle(&mut t)[0], Action::Begin(1));
        assert!(!t.finished());
        t.on_event(WorkerEvent::StepDone);
        assert!(t.finished(), "{}", t.describe());
    }

    #[test]
    fn without_forward_overlap_the_step_begins_first_and_ends_at_step_done() {
        let mut t = Trainer::new(1, false, layers());
        let acts = run_until_idle(&mut t);
        assert_eq!(acts[0], Action::Begin(0));
        assert_eq!(acts.last(), Some(&Action::BackwardDone));
        t.on_event(WorkerEvent::StepDone);
        assert_eq!(run_until_idle(&mut t), vec![]);
        assert!(t.finished());
    }
}
