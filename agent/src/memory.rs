//! Giving memory back to the system. The allocator keeps what a large input freed (a manifest of
//! megabytes parses into many small allocations spread over its heaps) for reuse, so the agent's
//! RSS would stay at its peak after the input is gone; trimming returns the free pages.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Least time between two trims.
pub const TRIM_PERIOD: Duration = Duration::from_secs(10);

static LAST_TRIM: Mutex<Option<Instant>> = Mutex::new(None);

/// Returns free heap pages to the system, unless that was done less than [`TRIM_PERIOD`] ago;
/// true when it trimmed. Costs tens of microseconds on a small heap: call it from a blocking
/// thread (housekeeping's), not from an async task.
pub fn release_free_memory() -> bool {
    {
        let mut last = LAST_TRIM.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < TRIM_PERIOD) {
            return false;
        }
        *last = Some(Instant::now());
    }
    trim();
    true
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident set size of this process, in bytes.
    fn rss() -> u64 {
        let status = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = status
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    #[test]
    fn freed_small_allocations_go_back_to_the_system() {
        // 200 MB in small pieces with every other one kept alive until the end, as a parse of a
        // large document leaves its heap: free holes the allocator keeps.
        let mut kept = Vec::new();
        let mut freed = Vec::new();
        for i in 0..400_000 {
            let v = vec![i as u8; 500];
            if i % 100 == 0 {
                kept.push(v);
            } else {
                freed.push(v);
            }
        }
        drop(freed);
        let before = rss();
        *LAST_TRIM.lock().unwrap() = None;
        assert!(release_free_memory());
        let after = rss();
        assert!(
            after + 100 * 1024 * 1024 < before,
            "RSS {before} -> {after}: the freed 200 MB stayed"
        );
        // Rate-limited: a second call right away does nothing.
        assert!(!release_free_memory());
        drop(kept);
    }
}
