//! The reader task and its half of the probes' wake-up rule.
//!
//! A wake-up from the kernel costs the probe that sends it far more than the event itself: the
//! ring buffer queues the reader's wake-up as interrupt work on its own CPU, 5-8 µs on this VM
//! against 0.1-0.4 µs for a probe's own work. So the reader tells the probes, through the
//! one-entry `READER` map, whether it needs waking:
//!
//! - **Asleep** (flag 0): the kernel's own rule, a record submitted when the reader had caught up
//!   (the first since its last drain) wakes it. An idle agent costs nothing.
//! - **Polling** (flag 1): once woken, the reader drains at once and then every [`GATHER`] for
//!   as long as drains find records, and the probes submit without a wake-up. A burst of any
//!   length costs one wake-up instead of one per record the reader had caught up with.
//!
//! Going back to sleep is the delicate step: a probe that read "polling" must not leave its
//! record behind a sleeping reader. The probes read the flag after reserving their record; the
//! reader clears the flag, then compares the ring's producer and consumer positions (a read-only
//! mapping of the ring's two position pages). Equal: nothing was reserved since its last drain,
//! and every later record sees the cleared flag. Not equal: a record is on its way, and the
//! reader polls on. A ring a quarter full wakes the reader in either state, and an asleep reader
//! also looks at the ring every [`IDLE_CHECK`], a backstop for a record whose reservation and
//! flag read a CPU reordered against the reader's (a store still in its store buffer).

use std::{
    ffi::c_void,
    ptr::NonNull,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::{
    Ebpf,
    maps::{Array, MapData, RingBuf},
};
use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;

use super::{GATHER, Shared};

/// How often an asleep reader looks at the ring without being woken (see the module docs).
pub const IDLE_CHECK: Duration = Duration::from_secs(5);

/// The reader's side of the wake-up rule: the `READER` flag and the ring's positions.
pub(super) struct Wakeups {
    flag: Array<MapData, u32>,
    positions: Positions,
}

impl Wakeups {
    /// `None` (with a debug line saying why) when the ring's positions cannot be mapped: the
    /// reader then relies on the kernel's rule alone, as if always asleep.
    pub(super) fn new(flag: Array<MapData, u32>, ring: &RingBuf<MapData>) -> Option<Self> {
        match Positions::map(ring) {
            Ok(positions) => Some(Self { flag, positions }),
            Err(error) => {
                tracing::debug!(
                    %error,
                    "mapping the ring buffer's positions; every record after a drain wakes the reader"
                );
                None
            }
        }
    }

    fn set(&mut self, polling: bool) {
        if let Err(error) = self.flag.set(0, u32::from(polling), 0) {
            tracing::debug!(%error, polling, "setting the eBPF reader flag");
        }
    }

    /// Clears the flag; `true` when the reader may sleep (nothing reserved since its last
    /// drain), `false` with the flag set again when a record is on its way.
    fn may_sleep(&mut self) -> bool {
        self.set(false);
        // Orders the flag's store (made by the kernel in this thread's system call) before the
        // position loads below.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.positions.caught_up() {
            return true;
        }
        self.set(true);
        false
    }
}

/// A read-only mapping of a BPF ring buffer's first two pages: the consumer position (page 0)
/// and the producer position (page 1), each a `u64` the kernel and the reader update.
struct Positions {
    base: NonNull<c_void>,
    page: usize,
}

// SAFETY: `Positions` owns its mapping (no other value refers to it, and it is unmapped only in
// `Drop`); the mapping is process-wide shared memory, only ever read through atomics, so moving
// the owner to another thread is sound. (Not `Sync`: nothing needs it.)
unsafe impl Send for Positions {}

impl Positions {
    fn map(ring: &RingBuf<MapData>) -> std::io::Result<Self> {
        use rustix::mm::{MapFlags, ProtFlags};
        let page = rustix::param::page_size();
        // SAFETY: a new mapping at an address the kernel picks (null hint, no MAP_FIXED), so no
        // existing memory is replaced; read-only and shared, of the ring's own fd, whose first two
        // pages (consumer and producer positions) the kernel lets user space map read-only.
        // The kernel checks the length against the map; the mapping is owned by `Self` and
        // unmapped once, in `Drop`.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                2 * page,
                ProtFlags::READ,
                MapFlags::SHARED,
                ring,
                0,
            )
        }?;
        NonNull::new(base)
            .map(|base| Self { base, page })
            .ok_or_else(|| std::io::Error::other("mmap returned null"))
    }

    fn load(&self, offset: usize) -> u64 {
        // SAFETY: `offset` is 0 or one page into a live mapping of two pages (it lives as long as
        // `self`, which the reference does not outlive); the kernel keeps a page-aligned, hence
        // 8-byte aligned, u64 at the start of each, updated concurrently, hence the atomic
        // access. The mapping is read-only: only a Relaxed load of at most 8 bytes is sound on
        // read-only memory (std's "Atomic accesses to read-only memory"), never a store, so
        // Acquire is a fence after it.
        let value =
            unsafe { AtomicU64::from_ptr(self.base.as_ptr().cast::<u8>().add(offset).cast()) }
                .load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        value
    }

    /// Nothing reserved past what the reader has consumed.
    fn caught_up(&self) -> bool {
        self.load(self.page) == self.load(0)
    }
}

impl Drop for Positions {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map` (same address and length), once: drop
        // runs once, and no reference into the mapping outlives `self` (`load` returns a copy).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr(), 2 * self.page) };
    }
}

/// The reader task: owns the loaded object (dropping it detaches the probes). Asleep until the
/// kernel wakes it for a record (or [`IDLE_CHECK`] passes), then draining at once and every
/// [`GATHER`] after until a drain finds nothing and the ring is caught up (see the module docs).
pub(super) async fn read_events(
    mut events: AsyncFd<RingBuf<MapData>>,
    mut wakeups: Option<Wakeups>,
    ebpf: Ebpf,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    'asleep: loop {
        let backstop = tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(IDLE_CHECK) => true,
            woken = woken(&mut events, &shared) => if woken.is_err() { break } else { false },
        };
        let mut found = 0;
        if backstop {
            // A look at the ring that leaves the probes' flag alone unless it finds records
            // (two map updates saved every IDLE_CHECK on an idle node). Records reserved during
            // it wake the reader, the flag still saying it sleeps.
            found = drain(events.get_mut(), &shared);
            if found == 0 {
                continue 'asleep;
            }
        }
        if let Some(w) = &mut wakeups {
            w.set(true);
        }
        if !backstop {
            // At once: the record that woke the reader (a container's exit, say) is delivered
            // now, the rest of a burst at the polls that follow.
            found = drain(events.get_mut(), &shared);
        }
        loop {
            if found == 0 && wakeups.as_mut().is_none_or(Wakeups::may_sleep) {
                continue 'asleep;
            }
            tokio::select! {
                () = cancel.cancelled() => break 'asleep,
                () = tokio::time::sleep(GATHER) => {}
                // A quarter-full ring wakes a polling reader too.
                woken = woken(&mut events, &shared) => if woken.is_err() { break 'asleep },
            }
            found = drain(events.get_mut(), &shared);
        }
    }
    drain(events.get_mut(), &shared);
    shared.reader_stopped.store(true, Ordering::Relaxed);
    drop(ebpf);
    tracing::debug!("eBPF reader stopped; probes detached");
}

/// Waits for the kernel to wake the reader and clears the wake-up, so the next wait needs a new
/// one. The records stay in the ring for the next drain.
async fn woken(events: &mut AsyncFd<RingBuf<MapData>>, shared: &Shared) -> std::io::Result<()> {
    match events.readable_mut().await {
        Ok(mut guard) => {
            guard.clear_ready();
            shared.wakeups.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(error) => {
            tracing::error!(%error, "polling the eBPF ring buffer; reader stops");
            Err(error)
        }
    }
}

/// Hands every record in the ring to `shared`; returns how many there were.
fn drain(ring: &mut RingBuf<MapData>, shared: &Shared) -> u64 {
    let mut records = 0u64;
    while let Some(item) = ring.next() {
        shared.record(&item);
        records += 1;
    }
    shared.drains.fetch_add(1, Ordering::Relaxed);
    if records == 0 {
        shared.empty_drains.fetch_add(1, Ordering::Relaxed);
    }
    records
}
