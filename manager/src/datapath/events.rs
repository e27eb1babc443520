//! Reading the `events` ring buffer on a dedicated thread into a broadcast channel.
//!
//! A plain thread with poll(2) rather than tokio's `AsyncFd`: the datapath is opened before (and
//! independently of) any runtime, and one blocking reader costs nothing per event subscriber.

use super::types::DropEvent;
use aya::maps::{MapData, RingBuf};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use tokio::sync::broadcast;

/// Poll timeout: how long Drop may wait for the thread to notice the stop flag.
const POLL_MS: i32 = 100;

pub(crate) struct EventReader {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EventReader {
    pub(crate) fn spawn(
        mut ring: RingBuf<MapData>,
        tx: broadcast::Sender<DropEvent>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("weft-dp-events".into())
            .spawn(move || {
                let fd = ring.as_raw_fd();
                while !flag.load(Ordering::Relaxed) {
                    let mut pfd = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd that outlives the call.
                    let n = unsafe { libc::poll(&raw mut pfd, 1, POLL_MS) };
                    if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                        tracing::error!(error = %std::io::Error::last_os_error(), "polling the events ring buffer");
                        return;
                    }
                    while let Some(item) = ring.next() {
                        if let Some(raw) = weft_ebpf::DropEvent::from_bytes(&item) {
                            // No subscriber is fine: events are best effort.
                            let _ = tx.send(DropEvent::from(&raw));
                        }
                    }
                }
            })
?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EventReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
