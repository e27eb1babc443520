//! The watchers' retry backoff: kube-runtime's default capped lower, and a reset right after
//! an error ignored.

use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher;

/// Where the wait between two attempts of a failing list or watch stops growing (the jitter
/// adds up to as much again). kube-runtime's default (client-go's) grows to 30 s: a manager
/// whose watches failed through an API server restart of half a minute then saw the server
/// again only 45-110 s after its return (the backoff grown to 30 s, then a `410 Gone` re-list
/// waiting its turn too). With 4 s it takes seconds, at one request per 4-8 s per watch and node
/// while the server is away.
pub const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(4);

/// The backoff of every watcher of Weft's: kube-runtime's default (800 ms doubling, with
/// jitter, back to the start after 120 s without an error) but growing only to [`RETRY_MAX`].
#[must_use]
pub fn retry_backoff() -> ResetTimerBackoff<watcher::ExponentialBackoff> {
    ResetTimerBackoff::new(
        backon::ExponentialBuilder::default()
            .with_min_delay(std::time::Duration::from_millis(800))
            .with_max_delay(RETRY_MAX)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .into(),
        std::time::Duration::from_mins(2),
    )
}

/// [`retry_backoff`], except that a reset soon after an error is ignored. The watcher yields
/// `Init` before each list attempt and any item resets the stream's backoff, so a list the API
/// server keeps refusing (an RBAC 403, a CRD's 404) would otherwise be retried about every
/// second for as long as it fails.
pub(super) struct ListRetryBackoff {
    inner: ResetTimerBackoff<watcher::ExponentialBackoff>,
    last_error: Option<std::time::Instant>,
}

/// How long after an error resets are ignored.
const RESET_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

impl ListRetryBackoff {
    pub(super) fn new() -> Self {
        Self {
            inner: retry_backoff(),
            last_error: None,
        }
    }
}

impl Iterator for ListRetryBackoff {
    type Item = std::time::Duration;
    fn next(&mut self) -> Option<std::time::Duration> {
        self.last_error = Some(std::time::Instant::now());
        self.inner.next()
    }
}

impl kube::runtime::utils::Backoff for ListRetryBackoff {
    fn reset(&mut self) {
        if self.last_error.is_none_or(|t| t.elapsed() >= RESET_AFTER) {
            self.inner.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_wait_grows_from_800_ms_to_at_most_twice_retry_max() {
        let waits: Vec<std::time::Duration> = retry_backoff().take(40).collect();
        assert_eq!(waits.len(), 40, "never gives up");
        assert!(
            waits[0] >= std::time::Duration::from_millis(800),
            "{waits:?}"
        );
        assert!(
            waits[0] < std::time::Duration::from_millis(1600),
            "{waits:?}"
        );
        assert!(waits.iter().all(|w| *w <= RETRY_MAX * 2), "{waits:?}");
        assert!(waits[10..].iter().all(|w| *w >= RETRY_MAX), "{waits:?}");
    }
}
