//! Reading what a runtime announces it reads next
//! ([`Weights::prefetch`](crate::Weights::prefetch), `wm_prefetch`): the
//! announced ranges of a mapping go to a thread that queues their reads
//! (`MADV_WILLNEED`), so that the announcing call returns at once and the
//! device reads them while the runtime computes on what it has.
//!
//! A plain mapping leaves a model larger than memory to the fault path,
//! whose read-ahead reads around each fault (the device's `read_ahead_kb`)
//! and evicts what the next token needs; queuing only the announced bytes
//! reads what is used and nothing beside it. Where every weight is
//! resident, a queued read finds its pages cached and does no I/O.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::plan::merge;
use crate::os::Mapping;

/// Ranges of one mapping to read ahead, in any order.
pub(crate) struct Announced {
    /// The mapping they are in.
    pub(crate) map: Arc<Mapping>,
    /// Offsets into it, as the tensors' file ranges.
    pub(crate) ranges: Vec<(usize, usize)>,
}

/// The thread that reads announced ranges ahead, started by the first
/// announcement; stopped and joined on drop, after the reads already
/// queued to it (each a `WILLNEED`, which waits for no read).
#[derive(Debug, Default)]
pub(crate) struct Announcer {
    /// The way to the thread, once started; `None` inside when it could
    /// not start, and announcements are then read ahead by the caller.
    started: Mutex<Option<Started>>,
}

#[derive(Debug)]
struct Started {
    to_thread: Option<Sender<Announced>>,
    thread: Option<JoinHandle<()>>,
}

impl Announcer {
    /// Queue the reads of `announced`: on the thread, or here when the
    /// thread cannot be started.
    pub(crate) fn announce(&self, announced: Vec<Announced>) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        let started = started.get_or_insert_with(Started::spawn);
        let mut announced = announced.into_iter();
        if let Some(tx) = &started.to_thread {
            for a in announced.by_ref() {
                if let Err(unsent) = tx.send(a) {
                    // The thread is gone (it never panics, but if it did):
                    // this and the rest are read ahead here.
                    read_ahead(unsent.0);
                    break;
                }
            }
        }
        announced.for_each(read_ahead);
    }
}

impl Started {
    fn spawn() -> Started {
        let (tx, rx) = channel::<Announced>();
        let spawned = std::thread::Builder::new()
            .name("weightmap-announced".into())
            .stack_size(64 << 10)
            .spawn(move || rx.into_iter().for_each(read_ahead));
        match spawned {
            Ok(thread) => Started {
                to_thread: Some(tx),
                thread: Some(thread),
            },
            Err(_) => Started {
                to_thread: None,
                thread: None,
            },
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop once it has queued
        // what it holds.
        drop(self.to_thread.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Queue the reads of `a`'s ranges, near ones joined.
fn read_ahead(a: Announced) {
    for (start, end) in merge(a.ranges) {
        a.map.will_need(start, end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// What the reads do to the page cache is tested where it can be
    /// observed (`tests/announce.rs`); here, the thread's life.
    #[test]
    fn the_thread_ends_with_its_announcer_and_lets_go_of_the_mapping() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![3u8; 8 << 20]).unwrap();
        // SAFETY: the temporary file is not changed while mapped.
        let map = Arc::new(unsafe { Mapping::map(f.as_file()) }.unwrap());
        let announcer = Announcer::default();
        for _ in 0..3 {
            announcer.announce(vec![Announced {
                map: Arc::clone(&map),
                ranges: vec![(4 << 20, 8 << 20), (0, 1 << 20)],
            }]);
        }
        drop(announcer);
        // Joined: the thread has read ahead what it was sent and let go.
        assert_eq!(Arc::strong_count(&map), 1);
        assert_eq!(map.bytes()[5 << 20], 3);
    }
}
