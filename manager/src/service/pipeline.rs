//! A bounded two-worker pipeline: items computed on worker threads, their results applied in
//! order on the calling thread as they come. The policy regeneration loops (`regen`) compute
//! slots on it while the slots before are written (docs/POLICY.md).

/// `compute` of every item on two worker threads, handed to `apply` in the items' order on
/// this thread as each is ready: one slot's kernel writes overlap the computation of the next
/// ones, and at most [`AHEAD`] results per worker wait, so memory stays bounded whatever the
/// number of slots. The first error of `apply` stops the workers and is returned.
pub(super) fn pipelined<T: Sync, R: Send, E>(
    items: &[T],
    compute: impl Fn(&T) -> R + Sync,
    mut apply: impl FnMut(&T, R) -> Result<(), E>,
) -> Result<(), E> {
    const WORKERS: usize = 2;
    if items.len() < 2 {
        return items.iter().try_for_each(|item| apply(item, compute(item)));
    }
    std::thread::scope(|s| {
        let compute = &compute;
        let (results, workers): (Vec<_>, Vec<_>) = (0..WORKERS)
            .map(|w| {
                let (tx, rx) = std::sync::mpsc::sync_channel(AHEAD);
                let worker = s.spawn(move || {
                    for item in items.iter().skip(w).step_by(WORKERS) {
                        if tx.send(compute(item)).is_err() {
                            break; // `apply` failed: nobody takes results any more
                        }
                    }
                });
                (rx, worker)
            })
            .unzip();
        let mut outcome = Ok(());
        // Worker `w` computes items w, w + WORKERS, ...: item i's result comes from worker
        // i % WORKERS.
        for (item, from) in items.iter().zip(results.iter().cycle()) {
            // A worker that panicked hung up: its panic is raised below.
            let Ok(result) = from.recv() else {
                break;
            };
            outcome = apply(item, result);
            if outcome.is_err() {
                break;
            }
        }
        drop(results);
        for worker in workers {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        outcome
    })
}

/// Results a worker of [`pipelined`] may have ready before `apply` takes them.
const AHEAD: usize = 4;

#[cfg(test)]
mod tests {
    use super::pipelined;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn pipelined_applies_every_result_in_the_items_order() {
        for n in [0, 1, 2, 3, 17, 100] {
            let items: Vec<u64> = (0..n).collect();
            let mut seen = Vec::new();
            // Later items compute faster: order must come from the items, not the workers.
            pipelined(
                &items,
                |&i| {
                    std::thread::sleep(std::time::Duration::from_micros((n - i) * 20));
                    i * 10
                },
                |&i, r| {
                    seen.push((i, r));
                    Ok::<_, ()>(())
                },
            )
            .unwrap();
            assert_eq!(seen, items.iter().map(|&i| (i, i * 10)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn pipelined_stops_at_the_first_error_and_returns_it() {
        let items: Vec<usize> = (0..10_000).collect();
        let computed = AtomicUsize::new(0);
        let mut applied = 0;
        let result = pipelined(
            &items,
            |&i| {
                computed.fetch_add(1, Ordering::Relaxed);
                i
            },
            |&i, _| {
                applied += 1;
                if i == 5 {
                    Err(format!("item {i}"))
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(result, Err("item 5".to_owned()));
        assert_eq!(applied, 6);
        // The workers stop once nobody takes their results: a few ahead, not all 10 000.
        assert!(computed.load(Ordering::Relaxed) < 100, "{computed:?}");
    }

    #[test]
    #[should_panic(expected = "compute failed")]
    fn a_worker_panic_reaches_the_caller() {
        let items: Vec<usize> = (0..10).collect();
        let _ = pipelined(
            &items,
            |&i| {
                assert!(i != 3, "compute failed");
                i
            },
            |_, _| Ok::<_, ()>(()),
        );
    }
}
