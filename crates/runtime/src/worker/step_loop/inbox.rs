//! The messages of the communication thread: strategy events handed to the engine and
//! the sequencer, worker 0's relayed buffers kept for their evaluation point, the
//! strategy's state for a checkpoint, and the bytes sent so far.

use syncopate_core::step::StepSequencer;
use syncopate_core::strategy::WorkerEvent;
use syncopate_train::engine::LayerwiseEngine;

use super::StepLoop;
use crate::error::RunError;
use crate::worker::comm_thread::{FromComm, ToComm};

impl<E: LayerwiseEngine> StepLoop<'_, E> {
    /// The strategy's own state, from the communication thread (asked between steps, once
    /// every value of the step is in, so no strategy event can come first; relayed buffers
    /// can, and are kept).
    pub(super) fn sync_state(&mut self) -> Result<Vec<Vec<f32>>, RunError> {
        self.comm.send(ToComm::SyncState)?;
        loop {
            match self.comm.recv()? {
                FromComm::SyncState(state) => return Ok(state),
                FromComm::Buffers(step, values) => self.relayed = Some((step, values)),
                FromComm::Event(event, _) => {
                    return Err(RunError::Local(format!(
                        "the strategy's {event:?} came while its state was read between steps"
                    )))
                }
                FromComm::Failed => unreachable!("recv turns failures into errors"),
            }
        }
    }

    /// Takes the next message of the communication thread: a strategy event goes to the
    /// engine and the sequencer, relayed buffers are kept for their evaluation point.
    pub(super) fn receive(&mut self, seq: &mut StepSequencer) -> Result<(), RunError> {
        let (event, values) = match self.comm.recv()? {
            FromComm::Event(event, values) => (event, values),
            FromComm::Buffers(step, values) => {
                self.relayed = Some((step, values));
                return Ok(());
            }
            FromComm::SyncState(_) => {
                return Err(RunError::Local(
                    "the strategy's state came unasked for".into(),
                ))
            }
            FromComm::Failed => unreachable!("recv turns failures into errors"),
        };
        if let WorkerEvent::ParamsReady(key) | WorkerEvent::GradReady(key) = event {
            let now = self.record.clock_ns();
            self.tensors.completed(key, now);
        }
        match event {
            WorkerEvent::ParamsReady(key) => self.engine.set_param(key, values)?,
            WorkerEvent::GradReady(key) => {
                if let Some(g) = self.grads.get_mut(key) {
                    *g = values;
                }
            }
            WorkerEvent::StepDone => {}
        }
        seq.handle_event(event);
        Ok(())
    }

    /// Bytes this worker has sent on all its links so far (this process).
    pub(super) fn sent_so_far(&self) -> u64 {
        self.comm
            .traffic
            .sent
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}
