//! Progress bars (indicatif) on stderr, drawn only when stderr is a
//! terminal: `load`, `gen` and bench's model generation.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-count bar labelled `label`, hidden unless stderr is a terminal.
pub fn bar(label: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{prefix}: [{bar:24}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_owned());
    pb
}

/// Show `(done, total)` on `pb`.
pub fn update(pb: &ProgressBar, done: u64, total: u64) {
    if pb.length() != Some(total) {
        pb.set_length(total);
    }
    pb.set_position(done);
}
