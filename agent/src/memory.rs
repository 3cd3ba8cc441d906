//! Giving memory back to the system. The allocator keeps what a large input freed (a manifest of
//! megabytes parses into many small allocations spread over its heaps) for reuse, so the agent's
//! RSS would stay at its peak after the input is gone; trimming returns the free pages.
//!
//! Large blocks are the other half. glibc's malloc serves a block of at least its mmap threshold
//! (128 KiB at start) with a mapping of its own, given back whole when freed, but it raises the
//! threshold to the size of every such block freed (up to 32 MiB), so after the first large input
//! the growing vectors of the next one (a pod's 40,000 env vars: a vector doubled from 11 to 23
//! MB, the old and the new alive during the copy) land in the heaps, where they fragment and stay.
//! [`fix_allocator`] pins the threshold at 128 KiB. It also caps the allocator's arenas at
//! [`ARENAS`]: glibc gives threads up to eight arenas a core, each keeping what was freed in it,
//! and a large input decoded on one blocking thread and started from another spreads its pieces
//! over several. With both, a 3 MB manifest peaks at about 50 MiB of RSS instead of 70-92 MiB
//! (release agent, docs/reliability.md).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The mmap threshold [`fix_allocator`] pins: glibc's own starting value.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// The most arenas [`fix_allocator`] lets glibc's malloc make: one per async worker thread.
/// Small allocations are served from each thread's own cache first, so threads seldom wait on
/// an arena's lock.
pub const ARENAS: usize = 2;

/// Pins the allocator's mmap threshold at [`MMAP_THRESHOLD`] (setting it turns off glibc's
/// raising of it), so that every block at least that large has a mapping of its own and goes
/// back to the system when freed, and caps its arenas at [`ARENAS`]. Call once, first thing in
/// `main`; true when the allocator took both (always false with an allocator other than
/// glibc's).
pub fn fix_allocator() -> bool {
    fix()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn fix() -> bool {
    let int = |v: usize| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt takes two integers by value (no pointers) and sets one of glibc malloc's
    // parameters under its lock; any value is accepted or refused (returns 0), never UB.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, int(MMAP_THRESHOLD)) == 1
            && libc::mallopt(libc::M_ARENA_MAX, int(ARENAS)) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn fix() -> bool {
    false
}

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
    trim_now();
    true
}

/// Returns free heap pages to the system now, whenever it was last done (after a one-off peak,
/// such as loading the eBPF probes). Blocking, as [`release_free_memory`].
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim_now() {
    // SAFETY: malloc_trim takes no pointers and only walks the allocator's own free lists under
    // its locks; glibc's malloc is the allocator in use (Rust's System allocator on gnu), so
    // there is no other heap it could disturb.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim_now() {}

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

    /// Bytes the allocator holds in blocks mapped on their own.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn mapped_bytes() -> usize {
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct of counters by value.
        unsafe { libc::mallinfo2() }.hblkhd
    }

    /// Set in the process [`a_large_block_is_mapped_on_its_own_after_one_was_freed`] starts.
    const CHILD: &str = "SWIFTLET_MMAP_THRESHOLD_CHILD";

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_large_block_is_mapped_on_its_own_after_one_was_freed() {
        // In a process of its own: the allocator serves even a large block from free heap
        // space when it has enough, and the other tests of this process leave some.
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "memory::tests::mmap_threshold_child",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .expect("running the test binary");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The check of [`a_large_block_is_mapped_on_its_own_after_one_was_freed`], run by it in a
    /// fresh process (and passing at once otherwise).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn mmap_threshold_child() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        assert!(fix_allocator());
        const SIZE: usize = 8 * 1024 * 1024;
        // Unpinned, freeing this block would raise the threshold to 8 MiB and the next block of
        // that size would come from a heap, where it stays when freed.
        let first = std::hint::black_box(vec![1u8; SIZE]);
        drop(first);
        let before = mapped_bytes();
        let second = std::hint::black_box(vec![2u8; SIZE]);
        let during = mapped_bytes();
        drop(second);
        assert!(
            during >= before + SIZE,
            "an 8 MiB block after a freed one was not mapped on its own: {before} -> {during} \
             bytes in mapped blocks"
        );
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
