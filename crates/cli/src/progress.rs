//! Progress output for long work (an indicatif bar on a terminal, periodic lines otherwise).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use syncopate_train::engine::StepOutput;
use syncopate_train::trainer::{Evaluation, Observer};

/// Shows steps, loss and throughput while training, and each epoch's test accuracy.
pub struct TrainProgress {
    bar: ProgressBar,
    loss: f32,
    quiet: bool,
}

impl TrainProgress {
    /// A bar for `total` steps (hidden when `quiet`).
    pub fn new(total: u64, quiet: bool) -> Self {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4))
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} steps  {msg}  eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Self {
            bar,
            loss: f32::NAN,
            quiet,
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Observer for TrainProgress {
    fn on_start(&mut self, total_steps: u64) {
        self.bar.set_length(total_steps);
        eprintln!("training {total_steps} steps");
    }

    fn on_step(&mut self, step: u64, _total: u64, out: &StepOutput, samples_per_sec: f64) {
        // Exponential moving average: the bar shows a readable, not a jumpy, loss.
        self.loss = if self.loss.is_nan() {
            out.loss
        } else {
            0.9 * self.loss + 0.1 * out.loss
        };
        self.bar.set_position(step);
        self.bar.set_message(format!(
            "loss {:.4}  {:.0} samples/s",
            self.loss, samples_per_sec
        ));
    }

    fn on_eval(&mut self, epoch: u64, eval: &Evaluation) {
        self.line(format!(
            "epoch {epoch}: test accuracy {:.2} %  test loss {:.4}  ({} samples)",
            eval.accuracy * 100.0,
            eval.loss,
            eval.samples
        ));
    }

    fn on_resume(&mut self, steps_done: u64) {
        self.bar.set_position(steps_done);
        eprintln!("resuming from the checkpoint after step {steps_done}");
    }

    fn on_checkpoint(&mut self, steps_done: u64) {
        self.line(format!("checkpoint after step {steps_done} written"));
    }
}

impl TrainProgress {
    /// A line above the bar (or on its own when quiet).
    fn line(&self, line: String) {
        if self.quiet {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

/// For workers other than rank 0: only says when training starts.
pub struct RankNotices {
    /// This process's rank.
    pub rank: usize,
}

impl Observer for RankNotices {
    fn on_start(&mut self, total_steps: u64) {
        eprintln!(
            "rank {}: joined the job, training {total_steps} steps",
            self.rank
        );
    }
}
