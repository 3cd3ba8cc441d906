//! swiftlet's eBPF probes, built for `bpfel-unknown-none` by `agent/build.rs` (aya-build) and
//! embedded in the agent.
//!
//! Probes: `cgroup:cgroup_mkdir` and `cgroup:cgroup_rmdir` tracepoints, each writing a
//! [`CgroupEvent`] to the `EVENTS` ring buffer for a cgroup whose path starts with the prefix the
//! agent set (its pod root, in every hierarchy; see `CGROUP_PREFIX`); `sched:sched_process_exec` and
//! `sched:sched_process_exit` writing a [`ProcessEvent`] for processes below the pod root cgroup
//! (everything else is filtered out in the kernel with one helper call and one array lookup); and
//! two uprobes on the agent's own `swiftlet_cri_call_begin`/`_end` markers writing a
//! [`CriEvent`], so CRI calls land on the same clock as what the kernel saw. An event that cannot
//! be delivered bumps a per-CPU counter in `LOST` (see `swiftlet_ebpf_common::lost`). The reader
//! is woken only when it sleeps (see `wakeup_flag`).
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
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id, bpf_get_current_comm,
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_buf, bpf_probe_read_kernel_str_bytes, bpf_probe_read_user_buf,
    },
    macros::{map, raw_tracepoint, tracepoint, uprobe},
    maps::{Array, PerCpuArray, RingBuf},
    programs::{ProbeContext, RawTracePointContext, TracePointContext},
};
use swiftlet_ebpf_common::{
    CGROUP_PATH_MAX, CGROUP_PREFIX_MAX, CGROUP_PREFIX_WORDS, COMM_LEN, CRI_UID_MAX, CgroupEvent,
    CriEvent, EVENTS_RING_BYTES, EXIT_CODE_UNKNOWN, EventHeader, KIND_CGROUP_MKDIR,
    KIND_CGROUP_RMDIR, KIND_CRI_BEGIN, KIND_CRI_END, KIND_PROCESS_EXEC, KIND_PROCESS_EXIT,
    ProcessEvent, WAKEUP_THRESHOLD_BYTES, lost, starts_with_prefix,
};

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(lost::COUNT, 0);

/// Slot 0: non-zero while the agent's reader is polling the ring (see `wakeup_flag`).
#[map]
static READER: Array<u32> = Array::with_max_entries(1, 0);

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
// Offsets into kernel structs for the raw-tracepoint cgroup probes, read by the agent from the
// kernel's BTF (`struct cgroup`: level, kn, root; `struct kernfs_node`: id; `struct cgroup_root`:
// hierarchy_id). The raw tracepoint hands the program `(struct cgroup *, const char *path)`
// without the kernel first assembling a trace record (which copies the path once more).
#[unsafe(no_mangle)]
static CGRP_LEVEL_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CGRP_KN_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CGRP_ROOT_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static KN_ID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static ROOT_HIERARCHY_ID_OFFSET: u32 = 0;

/// The path prefix (relative to each hierarchy's root) of the cgroups the cgroup probes report,
/// packed by `swiftlet_ebpf_common::cgroup_prefix_words`, and how many of its bytes count (0:
/// every cgroup). The agent sets it to its pod root: the cgroups the rest of the host makes and
/// removes then cost it nothing (no record, no wake-up).
#[unsafe(no_mangle)]
static CGROUP_PREFIX: [u64; CGROUP_PREFIX_WORDS] = [0; CGROUP_PREFIX_WORDS];
#[unsafe(no_mangle)]
static CGROUP_PREFIX_LEN: u32 = 0;

/// cgroup2 level of the pod root cgroup (see `POD_ROOT`).
#[unsafe(no_mangle)]
static POD_ROOT_LEVEL: u32 = 1;
/// Offset of `exit_code` in `struct task_struct` (from the kernel's BTF); 0 = unknown.
#[unsafe(no_mangle)]
static TASK_EXIT_CODE_OFFSET: u32 = 0;

/// Slot 0: the cgroup2 id of the cgroup every pod lives below, written by the agent once it
/// exists; 0 lets nothing through.
#[map]
static POD_ROOT: Array<u64> = Array::with_max_entries(1, 0);

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

#[raw_tracepoint(tracepoint = "cgroup_mkdir")]
pub fn cg_mkdir_raw(ctx: RawTracePointContext) -> i32 {
    if let Err(counter) = try_cgroup_raw(&ctx, KIND_CGROUP_MKDIR) {
        count_lost(counter);
    }
    0
}

#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn cg_rmdir_raw(ctx: RawTracePointContext) -> i32 {
    if let Err(counter) = try_cgroup_raw(&ctx, KIND_CGROUP_RMDIR) {
        count_lost(counter);
    }
    0
}

/// Reads a `T` at `base + offset` in kernel memory.
///
/// # Safety
/// None beyond the helper's: `bpf_probe_read_kernel` fails cleanly on a bad address.
#[inline(always)]
unsafe fn read_field<T>(base: u64, offset: &'static u32) -> Result<T, u32> {
    let at = base.wrapping_add(global(offset) as u64);
    // SAFETY: see the function's contract.
    unsafe { bpf_probe_read_kernel(at as *const T) }.map_err(|_| lost::READ_FAILED)
}

#[inline(always)]
fn try_cgroup_raw(ctx: &RawTracePointContext, kind: u32) -> Result<(), u32> {
    let path: u64 = ctx.arg(1);
    if !in_cgroup_prefix(path as *const u8) {
        return Ok(());
    }
    // SAFETY: `submit_with` hands `fill_cgroup_raw` a reserved entry of the right size.
    submit_with(|event| unsafe { fill_cgroup_raw(ctx, kind, event) })
}

#[inline(always)]
fn cgroup_header(kind: u32, ktime_ns: u64) -> EventHeader {
    EventHeader {
        kind,
        len: core::mem::size_of::<CgroupEvent>() as u32,
        ktime_ns,
    }
}

/// # Safety
/// `event` must point at writable memory the size of a `CgroupEvent`.
#[inline(always)]
unsafe fn fill_cgroup_raw(
    ctx: &RawTracePointContext,
    kind: u32,
    event: *mut CgroupEvent,
) -> Result<(), u32> {
    // SAFETY: no preconditions; the helper only reads the clock.
    let ktime_ns = unsafe { bpf_ktime_get_ns() };
    let cgrp: u64 = ctx.arg(0);
    let path: u64 = ctx.arg(1);
    // SAFETY (all reads): kernel pointers from the tracepoint's arguments, offsets from BTF,
    // every access through `bpf_probe_read_kernel`.
    let (level, kn, root) = unsafe {
        (
            read_field::<i32>(cgrp, &CGRP_LEVEL_OFFSET)?,
            read_field::<u64>(cgrp, &CGRP_KN_OFFSET)?,
            read_field::<u64>(cgrp, &CGRP_ROOT_OFFSET)?,
        )
    };
    // SAFETY: as above.
    let (id, hierarchy_id) = unsafe {
        (
            read_field::<u64>(kn, &KN_ID_OFFSET)?,
            read_field::<i32>(root, &ROOT_HIERARCHY_ID_OFFSET)?,
        )
    };
    // The kernel assembles the path for these tracepoints in a static buffer of 1 KiB, so a
    // fixed-size copy of the whole path field (a word at a time) stays inside it and costs a
    // third of a string copy (a byte at a time); the reader cuts at the NUL. Should the buffer
    // ever be smaller on some kernel, the copy fails cleanly and the string copy is used.
    // SAFETY: `event` is valid for writes (caller contract); the path buffer is plain bytes.
    let path_len = unsafe {
        let buf = &mut *core::ptr::addr_of_mut!((*event).path);
        match bpf_probe_read_kernel_buf(path as *const u8, buf) {
            Ok(()) => CGROUP_PATH_MAX,
            Err(_) => bpf_probe_read_kernel_str_bytes(path as *const u8, buf)
                .map_err(|_| lost::READ_FAILED)?
                .len(),
        }
    };
    // SAFETY: as above.
    unsafe {
        write_cgroup(
            event,
            cgroup_header(kind, ktime_ns),
            level,
            hierarchy_id,
            id,
            path_len,
        )
    };
    Ok(())
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

/// Whether the cgroup path at `path` (kernel memory) starts with `CGROUP_PREFIX`: checked before
/// a record is reserved, since a discarded record would still wake the reader. A path that
/// cannot be read is reported (the reader's own checks then apply).
#[inline(always)]
fn in_cgroup_prefix(path: *const u8) -> bool {
    let len = global(&CGROUP_PREFIX_LEN);
    if len == 0 {
        return true;
    }
    let mut words = [0u64; CGROUP_PREFIX_WORDS];
    // SAFETY: `words` is plain memory of CGROUP_PREFIX_MAX bytes; the helper fails cleanly on a
    // bad address. The kernel's path buffers (1 KiB for the raw tracepoint, the trace record's
    // string followed by the rest of the per-CPU trace buffer for the classic one) hold that many.
    let read = unsafe {
        let buf = &mut *core::ptr::addr_of_mut!(words).cast::<[u8; CGROUP_PREFIX_MAX]>();
        bpf_probe_read_kernel_buf(path, buf)
    };
    if read.is_err() {
        return true;
    }
    // SAFETY: a valid, aligned static; read volatile so the loader's value is the one compared.
    let prefix = unsafe { core::ptr::read_volatile(&CGROUP_PREFIX) };
    starts_with_prefix(&words, &prefix, len)
}

/// Fills a ring-buffer entry in place (no 300-byte copy through the 512-byte stack).
#[inline(always)]
fn try_cgroup(ctx: &TracePointContext, kind: u32) -> Result<(), u32> {
    // SAFETY (read_at): the offset comes from the tracepoint's own format description.
    let loc: u32 =
        unsafe { ctx.read_at(global(&CGROUP_PATH_OFFSET)) }.map_err(|_| lost::READ_FAILED)?;
    // SAFETY: the `__data_loc` offset points inside the record.
    let path = unsafe { ctx.as_ptr().cast::<u8>().add((loc & 0xffff) as usize) };
    if !in_cgroup_prefix(path) {
        return Ok(());
    }
    // SAFETY: `submit_with` hands `fill_cgroup` a reserved entry of the right size.
    submit_with(|event| unsafe { fill_cgroup(ctx, kind, event) })
}

/// Reserves a `T` on the ring buffer, lets `fill` write it in place, then submits it (waking the
/// reader only if it sleeps, see [`wakeup_flag`]), or discards it when `fill` fails.
#[inline(always)]
fn submit_with<T: 'static>(fill: impl FnOnce(*mut T) -> Result<(), u32>) -> Result<(), u32> {
    let Some(mut entry) = EVENTS.reserve::<T>(0) else {
        return Err(lost::RINGBUF_FULL);
    };
    // The wake-up is decided after the reservation, never before: see `wakeup_flag`.
    match fill(entry.as_mut_ptr()) {
        Ok(()) => {
            entry.submit(wakeup_flag());
            Ok(())
        }
        Err(counter) => {
            // A discarded record holds its place until the reader skips it, so it follows the
            // same rule (a reader left asleep before it would miss the records after it).
            entry.discard(wakeup_flag());
            Err(counter)
        }
    }
}

/// Writes every field of a cgroup event but the path (already in place).
///
/// # Safety
/// `event` must point at writable memory the size of a `CgroupEvent`.
#[inline(always)]
unsafe fn write_cgroup(
    event: *mut CgroupEvent,
    header: EventHeader,
    level: i32,
    hierarchy_id: i32,
    cgroup_id: u64,
    path_len: usize,
) {
    // SAFETY: see the function's contract.
    unsafe {
        core::ptr::addr_of_mut!((*event).header).write(header);
        core::ptr::addr_of_mut!((*event).level).write(level as u32);
        core::ptr::addr_of_mut!((*event).hierarchy_id).write(hierarchy_id as u32);
        core::ptr::addr_of_mut!((*event).cgroup_id).write(cgroup_id);
        core::ptr::addr_of_mut!((*event).path_len).write(path_len as u32);
        core::ptr::addr_of_mut!((*event)._pad).write(0);
    }
}

/// Wake-ups, which cost far more than the event itself (the ring buffer queues the reader's
/// wake-up as interrupt work on its own CPU: 5-8 µs on a VM, 20-40 times a program's own run
/// time). While the agent's reader is polling (`READER` non-zero: it drains every few
/// milliseconds while records keep coming) a record needs no wake-up. When it sleeps, the kernel's
/// own rule applies (flag 0): wake the reader for a record submitted when it had caught up, the
/// first since its last drain. A ring a quarter full wakes it at once either way.
///
/// The flag is read after the record was reserved: the reader, before it goes to sleep, clears
/// the flag and then checks that nothing was reserved since its last drain, so a record either
/// sees the cleared flag (and wakes it) or is seen by that check (and keeps it polling).
#[inline(always)]
fn wakeup_flag() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= WAKEUP_THRESHOLD_BYTES {
        return BPF_RB_FORCE_WAKEUP as u64;
    }
    match READER.get(0) {
        // SAFETY (read_volatile): a valid, aligned map value; the agent writes it concurrently,
        // so the load must not be elided or hoisted.
        Some(polling) if unsafe { core::ptr::read_volatile(polling) } != 0 => {
            BPF_RB_NO_WAKEUP as u64
        }
        _ => 0,
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

    // The record carries the string's length (NUL included): copy that many bytes in one go
    // (a word at a time, not the byte-at-a-time string copy); the reader cuts at the NUL. The
    // mask keeps the verifier's bound; longer paths are cut.
    let path_len = ((loc >> 16) as usize).min(CGROUP_PATH_MAX);
    // SAFETY: `event` is valid for writes (caller contract); the path buffer is plain bytes.
    unsafe {
        let path = &mut *core::ptr::addr_of_mut!((*event).path);
        if let Some(dst) = path.get_mut(..path_len & (2 * CGROUP_PATH_MAX - 1))
            && !dst.is_empty()
        {
            bpf_probe_read_kernel_buf(src, dst).map_err(|_| lost::READ_FAILED)?;
        }
    }
    unsafe {
        write_cgroup(
            event,
            cgroup_header(kind, ktime_ns),
            level,
            root,
            id,
            path_len,
        )
    };
    Ok(())
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    if in_pod_cgroup()
        && let Err(counter) = try_process(KIND_PROCESS_EXEC)
    {
        count_lost(counter);
    }
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // Only a thread-group leader's exit is the process's exit; other threads are noise.
    if pid_tgid >> 32 == pid_tgid & 0xffff_ffff
        && in_pod_cgroup()
        && let Err(counter) = try_process(KIND_PROCESS_EXIT)
    {
        count_lost(counter);
    }
    0
}

/// True when the current task's cgroup2 ancestor at `POD_ROOT_LEVEL` is the pod root.
#[inline(always)]
fn in_pod_cgroup() -> bool {
    let Some(&root) = POD_ROOT.get(0) else {
        return false;
    };
    if root == 0 {
        return false;
    }
    // SAFETY: no preconditions; an out-of-range level returns 0.
    let ancestor = unsafe { bpf_get_current_ancestor_cgroup_id(global(&POD_ROOT_LEVEL) as i32) };
    ancestor == root
}

#[inline(always)]
fn try_process(kind: u32) -> Result<(), u32> {
    submit_with(|event: *mut ProcessEvent| {
        // SAFETY: no preconditions.
        let (ktime_ns, pid_tgid, cgroup_id) = unsafe {
            (
                bpf_ktime_get_ns(),
                bpf_get_current_pid_tgid(),
                bpf_get_current_cgroup_id(),
            )
        };
        let exit_code = if kind == KIND_PROCESS_EXIT {
            read_exit_code()
        } else {
            0
        };
        let comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
        // SAFETY: `event` points at a reserved, writable, 8-byte aligned entry of the right size.
        unsafe {
            core::ptr::addr_of_mut!((*event).header).write(EventHeader {
                kind,
                len: core::mem::size_of::<ProcessEvent>() as u32,
                ktime_ns,
            });
            core::ptr::addr_of_mut!((*event).pid).write(pid_tgid as u32);
            core::ptr::addr_of_mut!((*event).tgid).write((pid_tgid >> 32) as u32);
            core::ptr::addr_of_mut!((*event).cgroup_id).write(cgroup_id);
            core::ptr::addr_of_mut!((*event).exit_code).write(exit_code);
            core::ptr::addr_of_mut!((*event)._pad).write(0);
            core::ptr::addr_of_mut!((*event).comm).write(comm);
        }
        Ok(())
    })
}

/// `current->exit_code`, at the offset the agent read from BTF.
#[inline(always)]
fn read_exit_code() -> u32 {
    let offset = global(&TASK_EXIT_CODE_OFFSET);
    if offset == 0 {
        return EXIT_CODE_UNKNOWN;
    }
    // SAFETY: `bpf_get_current_task` has no preconditions; the read goes through
    // `bpf_probe_read_kernel`, which fails cleanly on a bad address.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        bpf_probe_read_kernel(task.add(offset).cast::<i32>())
            .map(|code| code as u32)
            .unwrap_or(EXIT_CODE_UNKNOWN)
    }
}

/// Programs that do nothing, never loaded by the agent: the eBPF bench attaches them where the
/// probes above attach, so that the kernel's run-time counters show what running any program
/// costs at that point on the machine (the dispatch and the counting itself), beside what the
/// probes cost.
#[tracepoint]
pub fn noop_tp(_ctx: TracePointContext) -> u32 {
    0
}

/// See [`noop_tp`].
#[raw_tracepoint]
pub fn noop_raw(_ctx: RawTracePointContext) -> i32 {
    0
}

/// See [`noop_tp`].
#[uprobe]
pub fn noop_uprobe(_ctx: ProbeContext) -> u32 {
    0
}

/// Programs that each do one part of what a probe does, never loaded by the agent: the eBPF
/// bench attaches them to the CRI markers beside [`noop_uprobe`], so that the kernel's counters
/// show what each part costs on the machine. `cost_clock`: reading the clock.
#[uprobe]
pub fn cost_clock(_ctx: ProbeContext) -> u32 {
    // SAFETY: no preconditions; the helper only reads the clock.
    let now = unsafe { bpf_ktime_get_ns() };
    // Keeps the call (its result used); never true.
    if now == 0 {
        count_lost(lost::READ_FAILED);
    }
    0
}

/// See [`cost_clock`]: reserving a record and submitting it without waking the reader.
#[uprobe]
pub fn cost_record(_ctx: ProbeContext) -> u32 {
    submit_cost_record(BPF_RB_NO_WAKEUP as u64);
    0
}

/// See [`cost_clock`]: the same, waking the reader each time (what a probe pays for a wake-up).
#[uprobe]
pub fn cost_wakeup(_ctx: ProbeContext) -> u32 {
    submit_cost_record(BPF_RB_FORCE_WAKEUP as u64);
    0
}

#[inline(always)]
fn submit_cost_record(flags: u64) {
    if let Some(mut entry) = EVENTS.reserve::<CriEvent>(0) {
        let event: *mut CriEvent = entry.as_mut_ptr();
        // SAFETY: a reserved, writable, 8-byte aligned entry of the right size; the header marks
        // it as a CRI record with no UID, which the reader decodes like any other.
        unsafe {
            core::ptr::write_bytes(event.cast::<u8>(), 0, core::mem::size_of::<CriEvent>());
            core::ptr::addr_of_mut!((*event).header).write(EventHeader {
                kind: KIND_CRI_BEGIN,
                len: core::mem::size_of::<CriEvent>() as u32,
                ktime_ns: 0,
            });
        }
        entry.submit(flags);
    }
}

/// `swiftlet_cri_call_begin(method: u32, uid_ptr: *const u8, uid_len: usize)`.
#[uprobe]
pub fn cri_begin(ctx: ProbeContext) -> u32 {
    if let Err(counter) = try_cri(&ctx, KIND_CRI_BEGIN) {
        count_lost(counter);
    }
    0
}

/// `swiftlet_cri_call_end(method: u32, uid_ptr: *const u8, uid_len: usize, ok: u32)`.
#[uprobe]
pub fn cri_end(ctx: ProbeContext) -> u32 {
    if let Err(counter) = try_cri(&ctx, KIND_CRI_END) {
        count_lost(counter);
    }
    0
}

#[inline(always)]
fn try_cri(ctx: &ProbeContext, kind: u32) -> Result<(), u32> {
    submit_with(|event: *mut CriEvent| {
        // SAFETY: no preconditions.
        let (ktime_ns, pid_tgid) = unsafe { (bpf_ktime_get_ns(), bpf_get_current_pid_tgid()) };
        let method: u32 = ctx.arg(0).unwrap_or(u32::MAX);
        let uid_ptr: u64 = ctx.arg(1).unwrap_or(0);
        let uid_len: u64 = ctx.arg(2).unwrap_or(0);
        let ok: u32 = if kind == KIND_CRI_END {
            ctx.arg(3).unwrap_or(0)
        } else {
            0
        };
        // Longer UIDs are cut (the agent never passes one); the mask keeps the verifier's bound.
        let len = if uid_len > CRI_UID_MAX as u64 {
            CRI_UID_MAX
        } else {
            uid_len as usize
        };
        // SAFETY: `event` points at a reserved, writable, 8-byte aligned entry of the right
        // size; the UID is read with `bpf_probe_read_user`, which fails cleanly on a bad pointer.
        unsafe {
            let uid = &mut *core::ptr::addr_of_mut!((*event).uid);
            if let Some(dst) = uid.get_mut(..len & (2 * CRI_UID_MAX - 1))
                && !dst.is_empty()
                && uid_ptr != 0
            {
                bpf_probe_read_user_buf(uid_ptr as *const u8, dst)
                    .map_err(|_| lost::READ_FAILED)?;
            }
            core::ptr::addr_of_mut!((*event).header).write(EventHeader {
                kind,
                len: core::mem::size_of::<CriEvent>() as u32,
                ktime_ns,
            });
            core::ptr::addr_of_mut!((*event).method).write(method);
            core::ptr::addr_of_mut!((*event).ok).write(ok);
            core::ptr::addr_of_mut!((*event).pid).write(pid_tgid as u32);
            core::ptr::addr_of_mut!((*event).uid_len).write(len as u32);
        }
        Ok(())
    })
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // Unreachable in a verified program: the verifier rejects any path that could get here.
    loop {}
}
