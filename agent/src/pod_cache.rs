//! The pod cache: pod reads handed from the PLEG to the pod's next sync, and which pods are being
//! killed. The agent makes one [`PodCache`] and gives a handle to the PLEG (its writer), the
//! runtime manager, the pod workers and container GC by constructor.
//!
//! The PLEG reads a changed pod's full state (4+ CRI calls) and sends its events; the pod's
//! worker then syncs and would read the same state again. Instead the PLEG stores its read here
//! and the sync takes it (the kubelet's PLEG cache does this job). A read may drive the sync's
//! actions only when nothing on the pod was mutated since the read began: every mutating
//! operation of the agent on a pod (starts, stops, kills, removals, resizes) bumps the pod's
//! mutation generation when it begins and when it ends, and a read records the clock when it
//! began. A read that began while a mutation ran, or before one that began later, is rejected. A
//! stored read is used at most once, and not after [`MAX_AGE`]. Changes the runtime makes by
//! itself (a container exits) after a read are no danger: the PLEG compares its next relist with
//! its snapshot, which is no newer than the read, so it sees them and the pod syncs again.
//!
//! This store is the agent's pod cache: the PLEG writes it (its reads, and the container exits the
//! kernel saw before the runtime recorded them) and the pod workers read it; the PLEG never
//! writes a pod's status. A kernel-seen exit is laid over every state the pod's worker turns
//! into status ([`Fresh::overlay`]) until a read shows the runtime's own record of it.
//!
//! The same bookkeeping says which pods (or containers) the agent is stopping right now: the
//! eBPF fast path need not re-read those, the stopping code reads or forgets the pod itself.
//!
//! While the PLEG trusts the kernel path (`pleg::Cadence`: the eBPF probes report every
//! container exit), a stored read stays good past [`MAX_AGE`], as long as the trust lasted since
//! the read began ([`Fresh::set_kernel`]) and nothing mutated the pod: the runtime changes a
//! pod's state by itself only when a container ends, which the kernel reports (and the PLEG
//! then reads the pod again). A pod's periodic resync then takes the read its last sync made
//! instead of asking the runtime again (the kubelet's evented PLEG keeps its cache current the
//! same way, from the runtime's events). Any reason to distrust the kernel path ends it for
//! every read stored before.
use crate::pod::PodState;
use k8s_cri::v1 as api;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The one pod cache of the agent, shared by its holders; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct PodCache(Arc<Mutex<Fresh>>);

impl PodCache {
    /// The cache's bookkeeping, locked (a poisoned lock is taken over: every update leaves it
    /// consistent).
    pub fn lock(&self) -> MutexGuard<'_, Fresh> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a mutation of pod `uid` (`kill`: stopping the whole pod; `container`: stopping
    /// that one container) until the returned guard drops.
    pub fn mutating(&self, uid: &str, kill: bool, container: Option<&str>) -> Mutating {
        let mut f = self.lock();
        f.begin(uid, kill);
        if let Some(id) = container {
            f.container_stop(id, true);
        }
        Mutating {
            cache: self.clone(),
            uid: uid.to_owned(),
            kill,
            container: container.map(str::to_owned),
        }
    }
}

/// Marks a mutation of one pod (or the stop of one container) for as long as it lives.
#[derive(Debug)]
pub struct Mutating {
    cache: PodCache,
    uid: String,
    kill: bool,
    container: Option<String>,
}

impl Drop for Mutating {
    fn drop(&mut self) {
        let mut f = self.cache.lock();
        if let Some(id) = &self.container {
            f.container_stop(id, false);
        }
        f.end(&self.uid, self.kill);
    }
}

/// A stored read older than this is not used (the sync reads the runtime instead).
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// Where a pod read began in the pods' mutation history, and its place among reads: take it
/// before the read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadToken {
    clock: u64,
    seq: u64,
    /// The kernel path's trust when the read began ([`Fresh::set_kernel`]).
    trust: Option<u64>,
}

/// One pod's mutations.
#[derive(Debug, Default)]
struct Mutations {
    /// The clock when a mutation last began or ended.
    last: u64,
    /// Mutations running now.
    active: u32,
    /// Whole-pod stops running now.
    kills: u32,
}

#[derive(Debug, Default)]
pub struct Fresh {
    /// Ticks at every mutation's begin and end, and when a pod's record is dropped.
    clock: u64,
    /// Reads that began before this are rejected: a pod's mutation record was dropped since.
    floor: u64,
    pods: HashMap<String, Mutations>,
    /// Pod UID -> (the read's token, when it was stored, the state).
    reads: HashMap<String, (ReadToken, Instant, PodState)>,
    /// Counts reads begun: a later read has a higher sequence number.
    seq: u64,
    /// Pod UID -> the sequence number of the newest read a sync used: an older read is never
    /// used after it, so what a worker turns into status never goes back in time.
    used: HashMap<String, u64>,
    /// Container ids being stopped one by one (count of stops running).
    stopping: HashMap<String, u32>,
    /// Pod UID -> container exits the kernel saw: (container id, exit code, Unix ns, whether
    /// its cgroup is gone).
    exits: HashMap<String, Vec<(String, i32, i64, bool)>>,
    /// Pod UID -> container id -> its last ContainerStatus read ([`Fresh::reuse_statuses`]).
    statuses: HashMap<String, HashMap<String, api::ContainerStatus>>,
    /// Which pods the runtime can hold, known without asking it.
    pub known: Known,
    /// The PLEG's trust in the kernel path: `Some(epoch)` while trusted, the epoch counting its
    /// distrusts.
    kernel: Option<u64>,
    /// Counts the exits [`Fresh::kernel_exit`] recorded.
    kernel_exits: u64,
}

/// What the agent knows of the runtime's changes at one moment while the kernel path is trusted
/// ([`Fresh::quiet_mark`]): two equal marks mean no mutation began or ended, no pod record was
/// dropped, no exit was seen and the trust held in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietMark {
    clock: u64,
    kernel_exits: u64,
    epoch: u64,
}

/// A value made from a listing of the runtime, kept while the pod cache's [`QuietMark`] holds:
/// a pass or a request that lists the runtime then asks it nothing on a node where nothing
/// started, stopped or exited since.
#[derive(Debug)]
pub struct QuietListing<T> {
    cache: PodCache,
    last: Mutex<Option<(QuietMark, T)>>,
}

impl<T: Clone> QuietListing<T> {
    pub fn new(cache: PodCache) -> Self {
        Self {
            cache,
            last: Mutex::default(),
        }
    }

    fn last(&self) -> MutexGuard<'_, Option<(QuietMark, T)>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value of the last listing while the mark has not moved since it began (the kernel
    /// path trusted all along), else a new one from `list` (the mark is taken before it runs,
    /// so a change during the listing makes the next call list again).
    pub async fn get<E>(
        &self,
        list: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let mark = self.cache.lock().quiet_mark();
        if let Some(mark) = mark
            && let Some((at, value)) = &*self.last()
            && *at == mark
        {
            return Ok(value.clone());
        }
        let value = list.await?;
        *self.last() = mark.map(|mark| (mark, value.clone()));
        Ok(value)
    }
}

/// Which pods the runtime can hold, as far as the agent knows without asking it: a pod the last
/// full relist did not have and this agent has not started a sandbox for since holds nothing
/// (only this agent creates objects with its node name). A new pod's first sync then skips the
/// read of its runtime state, which under load queues behind other pods' RunPodSandbox. Kept
/// with the pod cache: the relists write it, the syncs and kills of the runtime manager too.
#[derive(Debug, Default)]
pub struct Known {
    /// UIDs of the last successful relist; `None` before the first (nothing is known then:
    /// a previous agent may have left pods to adopt).
    pub relisted: Option<HashSet<String>>,
    /// UIDs this agent ran a sandbox for, until `kill_pod` removed everything of the pod.
    pub created: HashSet<String>,
}

impl Known {
    pub fn holds_nothing(&self, uid: &str) -> bool {
        self.relisted
            .as_ref()
            .is_some_and(|r| !r.contains(uid) && !self.created.contains(uid))
    }
}

/// A container state whose ContainerStatus does not change while a listing shows the container
/// in it: running (until it exits) and exited (for good). Created and unknown ones are asked.
fn settled(state: i32) -> bool {
    state == api::ContainerState::ContainerRunning as i32
        || state == api::ContainerState::ContainerExited as i32
}

impl Fresh {
    /// For each listed container of pod `uid` (id and the state the listing shows): the status
    /// last read for it when that showed the same settled state, else `None` (to be asked). A
    /// pod of n containers is then read with one ContainerStatus call per container that
    /// changed, not n per read: the PLEG reads a starting pod on every relist, which made the
    /// agent's CPU per started container grow with the pod's size.
    pub fn reuse_statuses<'a>(
        &self,
        uid: &str,
        listed: impl Iterator<Item = (&'a str, i32)>,
    ) -> Vec<Option<api::ContainerStatus>> {
        let known = self.statuses.get(uid);
        listed
            .map(|(id, state)| {
                known
                    .and_then(|k| k.get(id))
                    .filter(|s| s.state == state && settled(state))
                    .cloned()
            })
            .collect()
    }

    /// Remembers the statuses of pod `uid`'s containers just read (replacing what was kept, so
    /// removed containers are forgotten).
    pub fn remember_statuses(&mut self, uid: &str, statuses: &[api::ContainerStatus]) {
        let kept = statuses
            .iter()
            .filter(|s| settled(s.state))
            .map(|s| (s.id.clone(), s.clone()))
            .collect();
        self.statuses.insert(uid.to_owned(), kept);
    }

    /// A mutation of pod `uid` begins; `kill` when it stops the whole pod. Drops the pod's
    /// stored read.
    pub fn begin(&mut self, uid: &str, kill: bool) {
        self.clock += 1;
        let m = self.pods.entry(uid.to_owned()).or_default();
        m.last = self.clock;
        m.active += 1;
        m.kills += u32::from(kill);
        self.reads.remove(uid);
    }

    /// The mutation begun with the same arguments ended.
    pub fn end(&mut self, uid: &str, kill: bool) {
        self.clock += 1;
        let m = self.pods.entry(uid.to_owned()).or_default();
        m.last = self.clock;
        m.active = m.active.saturating_sub(1);
        m.kills = m.kills.saturating_sub(u32::from(kill));
    }

    /// Container `id` is being stopped (`true`) or its stop ended (`false`).
    pub fn container_stop(&mut self, id: &str, stopping: bool) {
        if stopping {
            *self.stopping.entry(id.to_owned()).or_default() += 1;
        } else if let Some(n) = self.stopping.get_mut(id) {
            *n -= 1;
            if *n == 0 {
                self.stopping.remove(id);
            }
        }
    }

    /// Whether the agent is stopping pod `uid` as a whole, or container `container` of it.
    pub fn is_stopping(&self, uid: &str, container: Option<&str>) -> bool {
        self.pods.get(uid).is_some_and(|m| m.kills > 0)
            || container.is_some_and(|id| self.stopping.contains_key(id))
    }

    /// Whether a mutation of pod `uid` (a sync, a kill) is running.
    pub fn is_mutating(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|m| m.active > 0)
    }

    /// The token of a read of pod `uid` beginning now; `None` while the pod is being mutated
    /// (such a read is not stored).
    pub fn token(&mut self, uid: &str) -> Option<ReadToken> {
        match self.pods.get(uid) {
            Some(m) if m.active > 0 => None,
            _ => Some(self.next_token()),
        }
    }

    fn next_token(&mut self) -> ReadToken {
        self.seq += 1;
        ReadToken {
            clock: self.clock,
            seq: self.seq,
            trust: self.kernel,
        }
    }

    /// The PLEG's trust in the kernel path: `trusted`, and `epoch`, the count of its distrusts
    /// (a read stays good past [`MAX_AGE`] only while trusted in the epoch it began in).
    pub fn set_kernel(&mut self, trusted: bool, epoch: u64) {
        self.kernel = trusted.then_some(epoch);
    }

    /// The mark of this moment while the kernel path is trusted, `None` otherwise: a later equal
    /// mark shows that nothing changed the runtime's pods in between, as far as the agent and
    /// the kernel path can see.
    pub fn quiet_mark(&self) -> Option<QuietMark> {
        self.kernel.map(|epoch| QuietMark {
            clock: self.clock,
            kernel_exits: self.kernel_exits,
            epoch,
        })
    }

    /// Whether a read that began at `token` is still current because the kernel path was
    /// trusted all along since.
    fn evented(&self, token: ReadToken) -> bool {
        token.trust.is_some() && token.trust == self.kernel
    }

    /// A sync's own read of pod `uid` beginning now: its sequence number (for [`Fresh::used`])
    /// and, unless the pod is being mutated, its token (for [`Fresh::store_own`]).
    pub fn own_read_of(&mut self, uid: &str) -> (u64, Option<ReadToken>) {
        match self.token(uid) {
            Some(token) => (token.seq, Some(token)),
            None => (self.own_read(), None),
        }
    }

    /// Stores a sync's own read that began at `token` when the kernel path keeps it current
    /// (for the pod's next resync); else nothing.
    pub fn store_own(&mut self, uid: &str, token: ReadToken, state: &PodState, now: Instant) {
        if self.evented(token) {
            self.store(uid, token, state.clone(), now);
        }
    }

    /// The sequence number of a read a sync makes itself, beginning now; pass it to
    /// [`Fresh::used`] once the read is done.
    pub fn own_read(&mut self) -> u64 {
        self.next_token().seq
    }

    /// A sync used the read with sequence number `seq` of pod `uid`: older stored reads are
    /// not used any more.
    pub fn used(&mut self, uid: &str, seq: u64) {
        let newest = self.used.entry(uid.to_owned()).or_default();
        *newest = (*newest).max(seq);
        if self.reads.get(uid).is_some_and(|(t, _, _)| t.seq < *newest) {
            self.reads.remove(uid);
        }
    }

    /// Nothing was mutated on pod `uid` since the read with this token began.
    fn valid(&self, uid: &str, token: u64) -> bool {
        token >= self.floor
            && self
                .pods
                .get(uid)
                .is_none_or(|m| m.active == 0 && m.last <= token)
    }

    /// The token of reads beginning now for every pod at once (a full listing of the runtime;
    /// pass it to [`Fresh::retain`] too). A pod mutated meanwhile gets no stored read from it:
    /// its mutation still runs when the read is stored, or its end moved the pod's record past
    /// the token.
    pub fn token_for_all(&mut self) -> ReadToken {
        self.next_token()
    }

    /// Stores a read of pod `uid` that began at `token`, for the pod's next sync, unless a
    /// mutation began since. Replaces an older stored read.
    pub fn store(&mut self, uid: &str, token: ReadToken, state: PodState, now: Instant) {
        let newer = self.used.get(uid).is_none_or(|&u| token.seq >= u)
            && self
                .reads
                .get(uid)
                .is_none_or(|(t, _, _)| token.seq >= t.seq);
        if newer && self.valid(uid, token.clock) {
            self.reads.insert(uid.to_owned(), (token, now, state));
        }
    }

    /// The stored read of pod `uid` when it is still good: nothing mutated since it began, and
    /// younger than [`MAX_AGE`] or kept current by the kernel path ([`Fresh::set_kernel`]),
    /// with whether it was young. It stays for the next sync until a mutation begins (the
    /// PLEG's events of one change can sync a pod twice; both may use the read), and a stale
    /// one is dropped.
    pub fn take(&mut self, uid: &str, now: Instant) -> Option<(PodState, bool)> {
        let (token, at, state) = self.reads.get(uid)?;
        let (token, at) = (*token, *at);
        let young = now.saturating_duration_since(at) < MAX_AGE;
        if self.valid(uid, token.clock) && (young || self.evented(token)) {
            let state = state.clone();
            self.used(uid, token.seq);
            return Some((state, young));
        }
        self.reads.remove(uid);
        None
    }

    /// Records that the kernel saw container `id` of pod `uid` exit with `code` at
    /// `finished_ns` (Unix nanoseconds), `gone` when seen as its cgroup's removal, until a read
    /// shows the runtime's record of it.
    pub fn kernel_exit(&mut self, uid: &str, id: &str, code: i32, finished_ns: i64, gone: bool) {
        self.kernel_exits += 1;
        let exits = self.exits.entry(uid.to_owned()).or_default();
        exits.retain(|(c, ..)| c != id);
        exits.push((id.to_owned(), code, finished_ns, gone));
    }

    /// Lays the kernel-seen exits of pod `uid` over `state` (a container the state shows running
    /// is shown exited). An exit that does not apply to `state` is dropped: the runtime has its
    /// own record of it by now, or the container is gone. True when something was laid over.
    pub fn overlay(&mut self, uid: &str, state: &mut PodState) -> bool {
        let Some(exits) = self.exits.get_mut(uid) else {
            return false;
        };
        // An exit not laid over is shown by the runtime's own record now (reads a sync uses
        // only move forward), or its container is gone.
        exits.retain(|(id, code, at, gone)| state.apply_kernel_exit(id, *code, *at, *gone));
        let applied = !exits.is_empty();
        if exits.is_empty() {
            self.exits.remove(uid);
        }
        applied
    }

    /// Forgets pod `uid` (removed from the runtime), unless a mutation of it still runs.
    pub fn forget(&mut self, uid: &str) {
        self.reads.remove(uid);
        self.statuses.remove(uid);
        self.exits.remove(uid);
        self.used.remove(uid);
        if self.pods.get(uid).is_some_and(|m| m.active == 0) {
            self.drop_records(|u| u != uid);
        }
    }

    /// Keeps the records of the pods `keep` says (the runtime's pods, from a listing begun at
    /// `listed`), of pods being mutated and of pods mutated since `listed`.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool, listed: ReadToken) {
        let listed = listed.clock;
        self.reads.retain(|uid, _| keep(uid));
        self.statuses.retain(|uid, _| keep(uid));
        self.exits.retain(|uid, _| keep(uid));
        self.used.retain(|uid, _| keep(uid));
        let recent: std::collections::HashSet<String> = self
            .pods
            .iter()
            .filter(|(_, m)| m.last > listed)
            .map(|(uid, _)| uid.clone())
            .collect();
        self.drop_records(|uid| keep(uid) || recent.contains(uid));
    }

    /// Drops the idle pods' mutation records that `keep` does not keep. A read that began before
    /// can then no longer tell whether it is stale: every such read is rejected.
    fn drop_records(&mut self, keep: impl Fn(&str) -> bool) {
        let before = self.pods.len();
        self.pods.retain(|uid, m| m.active > 0 || keep(uid));
        if self.pods.len() != before {
            self.clock += 1;
            self.floor = self.clock;
        }
    }

    /// How many stored reads and pod records are kept (for tests).
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        (self.reads.len(), self.pods.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(id: &str) -> PodState {
        PodState {
            containers: vec![k8s_cri::v1::ContainerStatus {
                id: id.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A whole mutation: begins and ends.
    fn mutation(f: &mut Fresh, uid: &str, kill: bool) {
        f.begin(uid, kill);
        f.end(uid, kill);
    }

    fn id(s: Option<(PodState, bool)>) -> Option<String> {
        s.map(|(s, _)| s.containers[0].id.clone())
    }

    #[test]
    fn a_read_after_the_last_mutation_is_used_until_the_next() {
        let mut f = Fresh::default();
        let now = Instant::now();
        mutation(&mut f, "u", false);
        let t = f.token("u").expect("no mutation runs");
        f.store("u", t, state("a"), now);
        assert_eq!(id(f.take("u", now)), Some("a".into()));
        assert_eq!(
            id(f.take("u", now)),
            Some("a".into()),
            "nothing changed since"
        );
        f.begin("u", false);
        assert_eq!(f.take("u", now).map(|_| ()), None, "a mutation runs");
        f.end("u", false);
        assert_eq!(f.take("u", now).map(|_| ()), None, "mutated since the read");
        // A pod never mutated by this agent (adopted) works too.
        let t = f.token("v").unwrap();
        f.store("v", t, state("b"), now);
        assert_eq!(id(f.take("v", now)), Some("b".into()));
    }

    #[test]
    fn a_read_that_began_before_or_during_a_mutation_is_rejected() {
        let mut f = Fresh::default();
        let now = Instant::now();
        // Began before a mutation that ended before the read was stored.
        let t = f.token("u").unwrap();
        mutation(&mut f, "u", false);
        f.store("u", t, state("a"), now);
        assert!(f.take("u", now).is_none());
        // Stored, then a mutation began and ended before the sync took it.
        let t = f.token("u").unwrap();
        f.store("u", t, state("a"), now);
        mutation(&mut f, "u", false);
        assert!(f.take("u", now).is_none());
        // Stored, then a mutation ran past the store without the stored read being dropped
        // (begin drops it; check the generation guard alone by storing after begin).
        let t = f.token("u").unwrap();
        f.begin("u", false);
        f.store("u", t, state("a"), now);
        f.end("u", false);
        assert!(f.take("u", now).is_none());
        // Began while a mutation ran: no token at all.
        f.begin("u", true);
        assert!(f.token("u").is_none());
        f.end("u", true);
        // Another pod's mutations do not matter.
        let t = f.token("u").unwrap();
        mutation(&mut f, "other", false);
        f.store("u", t, state("a"), now);
        assert!(f.take("u", now).is_some());
    }

    #[test]
    fn an_old_read_is_not_used() {
        let mut f = Fresh::default();
        let then = Instant::now();
        let t = f.token("u").unwrap();
        f.store("u", t, state("a"), then);
        assert!(f.take("u", then + MAX_AGE).is_none());
    }

    #[test]
    fn the_quiet_mark_moves_with_every_change_the_agent_or_the_kernel_sees() {
        let mut f = Fresh::default();
        assert_eq!(f.quiet_mark(), None, "no mark without the kernel path");
        f.set_kernel(true, 0);
        let mark = f.quiet_mark().unwrap();
        assert_eq!(f.quiet_mark(), Some(mark), "nothing changed");
        f.begin("u", false);
        assert_ne!(f.quiet_mark(), Some(mark), "a mutation began");
        f.end("u", false);
        let mark = f.quiet_mark().unwrap();
        f.kernel_exit("u", "c", 1, 5, false);
        assert_ne!(f.quiet_mark(), Some(mark), "an exit was seen");
        let mark = f.quiet_mark().unwrap();
        f.set_kernel(false, 1);
        f.set_kernel(true, 1);
        assert_ne!(f.quiet_mark(), Some(mark), "the trust was lost in between");
    }

    #[test]
    fn a_quiet_listing_is_listed_again_only_after_a_change() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let cache = PodCache::default();
        let listing = QuietListing::new(cache.clone());
        let calls = AtomicU32::new(0);
        let get = || {
            futures::executor::block_on(
                listing.get(async { Ok::<_, ()>(calls.fetch_add(1, Ordering::Relaxed) + 1) }),
            )
        };
        // Without the kernel path every call lists.
        assert_eq!((get(), get()), (Ok(1), Ok(2)));
        cache.lock().set_kernel(true, 0);
        assert_eq!((get(), get()), (Ok(3), Ok(3)), "nothing changed: kept");
        drop(cache.mutating("u", false, None));
        assert_eq!((get(), get()), (Ok(4), Ok(4)), "a mutation: listed again");
        cache.lock().kernel_exit("u", "c", 1, 5, false);
        assert_eq!(get(), Ok(5), "an exit: listed again");
        // A failed listing keeps nothing: the next call lists again.
        cache.lock().kernel_exit("u", "d", 1, 6, false);
        let failed = futures::executor::block_on(listing.get(async { Err::<u32, _>("down") }));
        assert_eq!(failed, Err("down"));
        assert_eq!(get(), Ok(6));
    }

    #[test]
    fn while_the_kernel_path_is_trusted_a_read_stays_current_until_a_mutation() {
        let mut f = Fresh::default();
        let then = Instant::now();
        let later = then + MAX_AGE * 100;
        // Not trusted when the read began: it ages out as before.
        let t = f.token("u").unwrap();
        f.set_kernel(true, 0);
        f.store_own("u", t, &state("a"), then);
        assert!(
            f.take("u", later).is_none(),
            "an untrusted read is not even stored"
        );
        f.store("u", t, state("a"), then);
        assert!(f.take("u", later).is_none());
        // Trusted all along: current however old, taken again by every resync.
        let t = f.token("u").unwrap();
        f.store_own("u", t, &state("b"), then);
        let young = |f: &mut Fresh, now| {
            f.take("u", now)
                .map(|(s, young)| (id(Some((s, young))), young))
        };
        assert_eq!(young(&mut f, later), Some((Some("b".into()), false)));
        assert_eq!(id(f.take("u", later)), Some("b".into()));
        assert_eq!(young(&mut f, then), Some((Some("b".into()), true)));
        // A mutation ends it.
        mutation(&mut f, "u", false);
        assert!(f.take("u", later).is_none());
        // A distrust since the read ends it, even once trusted again.
        let t = f.token("u").unwrap();
        f.store_own("u", t, &state("c"), then);
        f.set_kernel(false, 1);
        assert!(f.take("u", later).is_none());
        f.store_own("u", t, &state("c"), then);
        f.set_kernel(true, 1);
        assert!(f.take("u", later).is_none(), "stored in the earlier epoch");
        let t = f.token("u").unwrap();
        f.store_own("u", t, &state("d"), then);
        assert_eq!(id(f.take("u", later)), Some("d".into()));
    }

    #[test]
    fn forgetting_a_pod_rejects_reads_in_flight_and_bounds_the_maps() {
        let mut f = Fresh::default();
        let now = Instant::now();
        // A read in flight while the pod is killed and forgotten must not be taken by a new
        // pod with the same UID.
        let t = f.token("u").unwrap();
        mutation(&mut f, "u", true);
        f.forget("u");
        assert_eq!(f.len(), (0, 0));
        f.store("u", t, state("a"), now);
        assert!(f.take("u", now).is_none());
        // Pods gone from the runtime are dropped, ones being mutated kept.
        for uid in ["a", "b", "c"] {
            mutation(&mut f, uid, false);
            let t = f.token(uid).unwrap();
            f.store(uid, t, state(uid), now);
        }
        let listed = f.token_for_all();
        mutation(&mut f, "d", false);
        f.begin("c", false);
        f.retain(|uid| uid == "a", listed);
        assert_eq!(
            f.len(),
            (1, 3),
            "a, c (being mutated) and d (mutated since the listing)"
        );
        f.end("c", false);
        assert_eq!(
            id(f.take("a", now)),
            None,
            "dropping records rejects older reads"
        );
    }

    #[test]
    fn stopping_is_per_pod_or_per_container() {
        let mut f = Fresh::default();
        assert!(!f.is_stopping("u", Some("c1")));
        f.begin("u", false);
        f.container_stop("c1", true);
        assert!(f.is_stopping("u", Some("c1")));
        assert!(!f.is_stopping("u", Some("c2")), "another container's crash");
        assert!(!f.is_stopping("u", None));
        f.container_stop("c1", false);
        f.end("u", false);
        assert!(!f.is_stopping("u", Some("c1")));
        f.begin("u", true);
        assert!(f.is_stopping("u", Some("c2")) && f.is_stopping("u", None));
        assert!(!f.is_stopping("v", None));
        f.end("u", true);
        assert!(!f.is_stopping("u", None));
    }

    fn running(id: &str, started_at: i64) -> PodState {
        PodState {
            containers: vec![k8s_cri::v1::ContainerStatus {
                id: id.into(),
                state: k8s_cri::v1::ContainerState::ContainerRunning as i32,
                started_at,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A pod read asks ContainerStatus only for containers whose listed state changed or is not
    /// settled: a pod of n containers read at every relist of its start asked n statuses each
    /// time before.
    #[test]
    fn a_read_reuses_the_statuses_of_containers_whose_settled_state_did_not_change() {
        use k8s_cri::v1::ContainerState as S;
        let status = |id: &str, state: S| k8s_cri::v1::ContainerStatus {
            id: id.into(),
            state: state as i32,
            ..Default::default()
        };
        let mut f = Fresh::default();
        f.remember_statuses(
            "u",
            &[
                status("run", S::ContainerRunning),
                status("done", S::ContainerExited),
                status("new", S::ContainerCreated),
                status("gone", S::ContainerRunning),
            ],
        );
        let listed = [
            ("run", S::ContainerRunning as i32),
            ("done", S::ContainerExited as i32),
            ("new", S::ContainerCreated as i32),
            ("other", S::ContainerRunning as i32),
        ];
        let reused: Vec<Option<String>> = f
            .reuse_statuses("u", listed.iter().copied())
            .into_iter()
            .map(|s| s.map(|s| s.id))
            .collect();
        assert_eq!(
            reused,
            [Some("run".into()), Some("done".into()), None, None],
            "running and exited reused; created (not settled) and unknown asked"
        );
        // The listing shows a change: asked again.
        let changed = f.reuse_statuses("u", [("run", S::ContainerExited as i32)].into_iter());
        assert!(changed[0].is_none());
        // Another pod's statuses are not this one's; a forgotten pod has none.
        assert!(f.reuse_statuses("v", listed.iter().copied())[0].is_none());
        f.forget("u");
        assert!(f.reuse_statuses("u", listed.iter().copied())[0].is_none());
    }

    #[test]
    fn a_sync_never_uses_a_read_older_than_one_it_used() {
        let mut f = Fresh::default();
        let now = Instant::now();
        // The PLEG begins a read; then a sync reads the pod itself and uses that newer read.
        let pleg = f.token("u").expect("no mutation runs");
        let own = f.own_read();
        f.used("u", own);
        // The PLEG's older read arrives: it is not stored, so no sync goes back in time.
        f.store("u", pleg, state("old"), now);
        assert_eq!(f.take("u", now).map(|_| ()), None);
        // A read begun after the sync's is used, and an older one does not replace it.
        let older = f.token("u").expect("no mutation runs");
        let newer = f.token("u").expect("no mutation runs");
        f.store("u", newer, state("c"), now);
        f.store("u", older, state("b"), now);
        assert_eq!(id(f.take("u", now)), Some("c".into()));
        let stale = pleg;
        f.store("u", stale, state("old"), now);
        assert_eq!(
            id(f.take("u", now)),
            Some("c".into()),
            "the newer read stays"
        );
    }

    #[test]
    fn a_kernel_seen_exit_is_laid_over_until_a_read_shows_the_runtimes_record() {
        let mut f = Fresh::default();
        f.kernel_exit("u", "a", 3, 5_000, false);
        let mut read = running("a", 4_000);
        assert!(f.overlay("u", &mut read));
        assert_eq!(read.containers[0].exit_code, 3);
        assert_eq!(
            read.containers[0].state,
            k8s_cri::v1::ContainerState::ContainerExited as i32
        );
        // Another read from before the runtime recorded it: laid over again.
        let mut again = running("a", 4_000);
        assert!(f.overlay("u", &mut again));
        // The runtime's record: nothing to lay over, and the exit is forgotten.
        let mut recorded = running("a", 4_000);
        recorded.containers[0].state = k8s_cri::v1::ContainerState::ContainerExited as i32;
        assert!(!f.overlay("u", &mut recorded));
        assert!(f.exits.is_empty());
        // An exit from before the container started (the runtime's helper) is not its exit.
        f.kernel_exit("u", "b", 0, 1_000, false);
        let mut b = running("b", 2_000);
        assert!(!f.overlay("u", &mut b));
        assert!(f.exits.is_empty());
        // Unless the container's cgroup went: then it exited before the runtime noted its
        // start.
        f.kernel_exit("u", "b", 1, 1_000, true);
        let mut b = running("b", 2_000);
        assert!(f.overlay("u", &mut b));
        assert_eq!(b.containers[0].exit_code, 1);
        f.forget("u");
        // A pod removed from the runtime takes its exits with it.
        f.kernel_exit("v", "c", 1, 9, false);
        f.forget("v");
        assert!(f.exits.is_empty());
    }
    #[test]
    fn a_pod_holds_nothing_only_when_the_last_relist_and_our_own_starts_say_so() {
        let mut k = super::Known::default();
        // Before the first relist a previous agent's pods may be there to adopt.
        assert!(!k.holds_nothing("a"));
        k.relisted = Some(HashSet::from(["b".to_owned()]));
        assert!(k.holds_nothing("a"));
        assert!(!k.holds_nothing("b"), "the relist found it");
        // A sandbox started after the relist listed the runtime.
        k.created.insert("a".to_owned());
        assert!(!k.holds_nothing("a"));
        k.created.remove("a");
        assert!(k.holds_nothing("a"));
    }
}
