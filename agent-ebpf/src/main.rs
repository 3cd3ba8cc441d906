//! swiftlet's eBPF probes, built for `bpfel-unknown-none` by `agent/build.rs` (aya-build) and
//! embedded in the agent.
//!
//! Probes: `cgroup:cgroup_mkdir` and `cgroup:cgroup_rmdir` tracepoints, each writing a
//! [`CgroupEvent`] to the `EVENTS` ring buffer. An event that cannot be delivered bumps a per-CPU
//! counter in `LOST` (see `swiftlet_ebpf_common::lost`). Wake-ups of the reader are batched
//! (see `wakeup_flag`).
//!
//! Field offsets of the tracepoint record: the agent reads them from the tracepoint's `format` file
//! in tracefs and writes them into the read-only globals below before loading (aya
//! `EbpfLoader::override_global`). The record layout has changed across kernel versions (before
//! 5.7 `id` was an `int` placed before `level`), so reading the format keeps the probe correct on
//! any kernel without BTF/CO-RE for tracepoint records. The defaults are the 5.7+ layout
//! (`root` 8, `level` 12, `id` 16, `path` 24), used only if the loader does not override them.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes},
    macros::{map, tracepoint},
    maps::{PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use swiftlet_ebpf_common::{
    CgroupEvent, EVENTS_RING_BYTES, EventHeader, KIND_CGROUP_MKDIR, KIND_CGROUP_RMDIR,
    WAKEUP_THRESHOLD_BYTES, lost,
};

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(lost::COUNT, 0);

// Read with `read_volatile` so the compiler cannot fold the defaults into the code: the loader
// patches these in `.rodata` before the program is verified.
#[unsafe(no_mangle)]
static CGROUP_ROOT_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static CGROUP_LEVEL_OFFSET: u32 = 12;
#[unsafe(no_mangle)]
static CGROUP_ID_OFFSET: u32 = 16;
#[unsafe(no_mangle)]
static CGROUP_PATH_OFFSET: u32 = 24;

#[inline(always)]
fn global(value: &'static u32) -> usize {
    // SAFETY: `value` is a valid, aligned, initialised static.
    unsafe { core::ptr::read_volatile(value) as usize }
}

#[tracepoint(category = "cgroup", name = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    handle_cgroup(&ctx, KIND_CGROUP_MKDIR)
}

#[tracepoint(category = "cgroup", name = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    handle_cgroup(&ctx, KIND_CGROUP_RMDIR)
}

/// The safe fallback around [`try_cgroup`]: a failure is counted, never propagated (a tracepoint
/// program's return value is ignored by the kernel anyway).
#[inline(always)]
fn handle_cgroup(ctx: &TracePointContext, kind: u32) -> u32 {
    if let Err(counter) = try_cgroup(ctx, kind) {
        count_lost(counter);
    }
    0
}

#[inline(always)]
fn count_lost(counter: u32) {
    if let Some(slot) = LOST.get_ptr_mut(counter) {
        // SAFETY: the slot is this CPU's value in a per-CPU array; tracepoint programs do not
        // migrate between CPUs while running.
        unsafe { *slot += 1 };
    }
}

/// Fills a ring-buffer entry in place (no 300-byte copy through the 512-byte stack).
#[inline(always)]
fn try_cgroup(ctx: &TracePointContext, kind: u32) -> Result<(), u32> {
    let Some(mut entry) = EVENTS.reserve::<CgroupEvent>(0) else {
        return Err(lost::RINGBUF_FULL);
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved, writable, 8-byte aligned entry of the right size.
    match unsafe { fill_cgroup(ctx, kind, event) } {
        Ok(()) => {
            entry.submit(wakeup_flag());
            Ok(())
        }
        Err(counter) => {
            entry.discard(0);
            Err(counter)
        }
    }
}

/// Batched wake-ups: waking the reader for every record (the default adaptive mode does so
/// whenever the reader has caught up, i.e. almost always) costs far more than the probe. Records
/// are submitted silently and the agent polls on a timer, unless a quarter of the ring is waiting.
#[inline(always)]
fn wakeup_flag() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= WAKEUP_THRESHOLD_BYTES {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// # Safety
/// `event` must point at writable memory the size of a `CgroupEvent`.
#[inline(always)]
unsafe fn fill_cgroup(
    ctx: &TracePointContext,
    kind: u32,
    event: *mut CgroupEvent,
) -> Result<(), u32> {
    // SAFETY: no preconditions; the helper only reads the clock.
    let ktime_ns = unsafe { bpf_ktime_get_ns() };
    // SAFETY (all `read_at`): the offsets come from the tracepoint's own format description and
    // `read_at` goes through `bpf_probe_read_kernel`, which fails cleanly on a bad address.
    let root: i32 =
        unsafe { ctx.read_at(global(&CGROUP_ROOT_OFFSET)) }.map_err(|_| lost::READ_FAILED)?;
    let level: i32 =
        unsafe { ctx.read_at(global(&CGROUP_LEVEL_OFFSET)) }.map_err(|_| lost::READ_FAILED)?;
    let id: u64 =
        unsafe { ctx.read_at(global(&CGROUP_ID_OFFSET)) }.map_err(|_| lost::READ_FAILED)?;
    // `__data_loc`: low 16 bits are the string's offset from the start of the record, high 16
    // bits its length (including the NUL).
    let loc: u32 =
        unsafe { ctx.read_at(global(&CGROUP_PATH_OFFSET)) }.map_err(|_| lost::READ_FAILED)?;
    let src = unsafe { ctx.as_ptr().cast::<u8>().add((loc & 0xffff) as usize) };

    // SAFETY: `event` is valid for writes (caller contract); the path buffer is plain bytes.
    let path_len = unsafe {
        let path = &mut *core::ptr::addr_of_mut!((*event).path);
        bpf_probe_read_kernel_str_bytes(src, path)
            .map_err(|_| lost::READ_FAILED)?
            .len()
    };
    unsafe {
        core::ptr::addr_of_mut!((*event).header).write(EventHeader {
            kind,
            len: core::mem::size_of::<CgroupEvent>() as u32,
            ktime_ns,
        });
        core::ptr::addr_of_mut!((*event).level).write(level as u32);
        core::ptr::addr_of_mut!((*event).hierarchy_id).write(root as u32);
        core::ptr::addr_of_mut!((*event).cgroup_id).write(id);
        core::ptr::addr_of_mut!((*event).path_len).write(path_len as u32);
        core::ptr::addr_of_mut!((*event)._pad).write(0);
    }
    Ok(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // Unreachable in a verified program: the verifier rejects any path that could get here.
    loop {}
}
