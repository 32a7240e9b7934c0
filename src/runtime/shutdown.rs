//! Shutdown: the signals that start it, and the `quit` channel every blocking loop checks
//! (the ripgrep/crossbeam pattern: the first signal drops the one sender).

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread;
use std::time::Duration;

/// Whether `quit` is disconnected: the process is shutting down.
pub fn is_quitting(quit: &Receiver<()>) -> bool {
    matches!(quit.try_recv(), Err(TryRecvError::Disconnected))
}

/// Waits up to `d`; true when `quit` fired or its sender is gone.
pub fn quits_within(quit: &Receiver<()>, d: Duration) -> bool {
    !matches!(quit.recv_timeout(d), Err(RecvTimeoutError::Timeout))
}

/// First SIGTERM/SIGINT: drop `quit_tx` (graceful). Second: exit at once.
pub fn listen_for_signals(quit_tx: Sender<()>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    thread::Builder::new().name("signals".into()).spawn(move || {
        let mut quit_tx = Some(quit_tx);
        for sig in signals.forever() {
            if let Some(tx) = quit_tx.take() {
                quit_once_said(tx, || {
                    log::info!(target: "controller", signal = sig; "signal received; shutting down (send again to exit at once)");
                });
            } else {
                log::warn!(target: "controller", signal = sig; "second signal; exiting now");
                log::logger().flush();
                std::process::exit(130);
            }
        }
    })?;
    Ok(())
}

/// Says why the process quits before dropping `quit_tx` wakes every loop into its shutdown lines.
fn quit_once_said(quit_tx: Sender<()>, say: impl FnOnce()) {
    say();
    drop(quit_tx);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signal_is_said_before_anything_wakes_to_shut_down() {
        let (tx, quit) = crossbeam_channel::bounded::<()>(0);
        let mut quitting_when_said = None;
        quit_once_said(tx, || quitting_when_said = Some(is_quitting(&quit)));
        assert_eq!(quitting_when_said, Some(false));
        assert!(is_quitting(&quit));
    }
}
