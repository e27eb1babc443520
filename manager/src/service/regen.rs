//! Selective, incremental regeneration (docs/POLICY.md, "How the manager drives it"). Only endpoints whose selected rules or peer
//! identity sets changed are touched, and within them, where the change allows, only the entries
//! of the peer identities it concerns (a new or freed identity; the peers of an edited rule).
//! Everything reaches the datapath as a map diff. Why restricting to identities is exact:
//! docs/POLICY.md, "How the manager drives it".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use weft_api::EndpointState;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::{EndpointPolicy, Identity, PolicyEntry, Verdict};
use weft_policy::repository::RepoChange;
use weft_policy::rule::NamedPorts;

use super::pipeline::pipelined;
use super::work::{Target, Update, change_targets, change_update, identity_update, slot_targets};
use super::{Manager, ManagerError, State, from_api_labels};
use crate::node::ipcache::Source;
use crate::policy_state::Effects;
use crate::slots::{SlotKey, SlotTable};

impl Manager {
    /// Updates the endpoints an identity change affects (`effects`: identities that entered or
    /// left some selectors): in every ready endpoint with a rule using one of those selectors,
    /// only the entries of those identities are recomputed and replaced.
    pub(crate) fn regenerate_users(
        &self,
        st: &mut State,
        effects: &Effects,
    ) -> Result<usize, ManagerError> {
        self.regenerate_identities(st, effects, &BTreeSet::new())
    }

    /// Regenerates the endpoints a repository change can affect. Those an added or removed rule
    /// selects get the entries of the identities the changed rules' peers resolve to, or, when
    /// the change also moves their enforcement (or has a wildcard peer), a full recomputation;
    /// those merely using a selector whose identities changed (a CIDR identity came or went) get
    /// those identities' entries. Every ready endpoint then records the new revision (an
    /// unaffected endpoint enforces it already).
    pub(crate) fn regenerate_for_change(
        &self,
        st: &mut State,
        change: &RepoChange,
        effects: &Effects,
    ) -> Result<usize, ManagerError> {
        let (identities, targets) = change_targets(self, st, change, effects);
        let done: BTreeSet<u32> = targets.iter().map(|(slot, ..)| *slot).collect();
        let update = change_update(&st.pol, change, &identities);
        let (n, whole) = self.apply_work(&mut st.slots, &identities, &targets, move |t| {
            Some(update(t))
        })?;
        let n = n
            + self.regenerate_slots(st, &whole)?
            + self.regenerate_identities(st, effects, &done)?;
        let rev = st.pol.repo().revision();
        let ready: Vec<u32> = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready)
            .map(|ep| ep.id)
            .collect();
        for id in ready {
            st.reg.set_revision(id, rev);
        }
        Ok(n)
    }

    /// See [`Self::regenerate_users`]; slots in `skip` are left alone (the caller
    /// has regenerated them).
    fn regenerate_identities(
        &self,
        st: &mut State,
        effects: &Effects,
        skip: &BTreeSet<u32>,
    ) -> Result<usize, ManagerError> {
        if effects.changed.is_empty() {
            return Ok(0);
        }
        let targets = slot_targets(self, st, skip);
        let update = identity_update(&st.pol, effects);
        let (n, whole) = self.apply_work(&mut st.slots, &effects.identities, &targets, update)?;
        // Ends the batch too (`regenerate_with`, even with no slot to write whole).
        Ok(n + self.regenerate_slots(st, &whole)?)
    }

    /// Computes what each target needs (`update`; `None`: nothing) and installs the new entries
    /// of `identities` as they come ([`pipelined`]). Returns how many endpoints had their
    /// policy changed, and the slots that need a whole regeneration instead.
    fn apply_work(
        &self,
        slots: &mut SlotTable,
        identities: &BTreeSet<Identity>,
        targets: &[Target],
        update: impl Fn(&Target) -> Option<Update> + Sync,
    ) -> Result<(usize, Vec<u32>), ManagerError> {
        let mut whole = Vec::new();
        let mut n = 0;
        pipelined(targets, update, |(slot, ..), update| {
            match update {
                None => {}
                Some(Update::Whole) => whole.push(*slot),
                Some(Update::Identities(entries)) => {
                    self.apply_identities(slots, *slot, identities, &entries)?;
                    n += slots.members(*slot).len();
                }
            }
            Ok::<_, ManagerError>(())
        })?;
        Ok((n, whole))
    }

    /// Regenerates the members of `slots` whole.
    fn regenerate_slots(&self, st: &mut State, slots: &[u32]) -> Result<usize, ManagerError> {
        let members: Vec<u32> = slots.iter().flat_map(|s| st.slots.members(*s)).collect();
        self.regenerate(st, &members)
    }

    /// Replaces the entries of `identities` in a slot.
    fn apply_identities(
        &self,
        slots: &mut SlotTable,
        slot: u32,
        identities: &BTreeSet<Identity>,
        entries: &BTreeMap<PolicyEntry, Verdict>,
    ) -> Result<(), ManagerError> {
        let t0 = std::time::Instant::now();
        let generation = slots.begin_write(slot, false);
        let digest = self
            .datapath
            .apply_policy_identities(slot, identities, entries, generation)
            .inspect_err(|_| self.prom.regeneration_failed())?;
        self.prom.regenerated(t0.elapsed());
        slots.written(slot, generation, digest, None);
        tracing::debug!(
            slot,
            identities = identities.len(),
            entries = entries.len(),
            us = t0.elapsed().as_micros(),
            "slot regenerated (changed identities)"
        );
        self.regenerations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes a whole policy into a slot (diffed by the datapath against what it holds).
    pub(crate) fn write_slot(
        &self,
        slots: &mut SlotTable,
        slot: u32,
        policy: &EndpointPolicy,
    ) -> Result<(), ManagerError> {
        let t0 = std::time::Instant::now();
        let generation = slots.begin_write(slot, true);
        let digest = self
            .datapath
            .apply_policy(slot, policy, generation)
            .inspect_err(|_| self.prom.regeneration_failed())?;
        self.prom.regenerated(t0.elapsed());
        let enforcement = crate::slots::Enforcement::of(policy);
        slots.written(slot, generation, digest, Some(enforcement));
        tracing::debug!(
            slot,
            entries = policy.entries.len(),
            us = t0.elapsed().as_micros(),
            "slot regenerated"
        );
        self.regenerations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A slot lost a member: without members it is kept idle for the identity grace period
    /// (the next pod with the same labels finds its entries written), or released at once
    /// when there is none.
    pub(crate) fn retire_slot(&self, st: &mut State, slot: u32) -> Result<(), ManagerError> {
        if st.pol.identity_grace_ms() > 0 {
            st.slots.mark_idle(slot, crate::sys::clock::now_ms());
            return Ok(());
        }
        self.release_if_unused(st, slot)
    }

    /// Housekeeping: frees the label identities and policy slots idle for the whole grace
    /// period at `now_ms`. Peers selecting a freed identity lose its entries.
    pub fn collect_idle(&self, now_ms: u64) -> Result<(), ManagerError> {
        let mut st = self.state();
        let effects = st.pol.collect_idle_identities(now_ms)?;
        let grace = st.pol.identity_grace_ms();
        let pol = &st.pol;
        let expired = st
            .slots
            .idle_expired(now_ms, grace, |id| pol.identity_key(id).is_some());
        for slot in &expired {
            self.release_if_unused(&mut st, *slot)?;
        }
        if !effects.identities.is_empty() {
            tracing::info!(identities = ?effects.identities, slots = expired.len(), "idle identities freed");
            self.poke_cluster();
            if let Err(e) = self.regenerate_users(&mut st, &effects) {
                // The identities are gone already: the repair recomputes every endpoint.
                self.mark_needs_regeneration();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Frees a slot without members (its entries, then its generation, then its record).
    pub(crate) fn release_if_unused(&self, st: &mut State, slot: u32) -> Result<(), ManagerError> {
        if st.slots.is_unused(slot) {
            self.datapath.release_slot(slot)?;
            st.slots.remove(slot);
        }
        Ok(())
    }

    /// The slot an endpoint with these labels' identity and `named` ports must use, created
    /// and written when there is none yet or its last write did not complete. A slot with
    /// members and a complete write is up to date: every change regenerates it.
    pub(crate) fn prepare_slot(
        &self,
        st: &mut State,
        identity: Identity,
        labels: &LabelSet,
        named: &NamedPorts,
    ) -> Result<u32, ManagerError> {
        let (slot, created) = st.slots.ensure(SlotKey::new(identity, named));
        if created || st.slots.digest(slot).is_none() || st.slots.is_unused(slot) {
            let policy = st.pol.compute(labels, named);
            // An idle slot was not regenerated while nobody used it: its entries are what it
            // last held completely (`digest`). Rewritten only if the policy moved since.
            if st.slots.digest(slot) == Some(crate::datapath::policy_digest(&policy)) {
                st.slots.computed(slot);
                return Ok(slot);
            }
            let written = self.write_slot(&mut st.slots, slot, &policy);
            if written.is_err() && st.slots.is_unused(slot) {
                // Nobody points at it: remove what may have been written.
                let _ = self.release_if_unused(st, slot);
            }
            written?;
        }
        Ok(slot)
    }

    /// Persists (unflushed: sled's own flush within 0.5 s, or the caller's, makes them durable)
    /// the slot records changed since the last call, with the inputs digest unless a
    /// regeneration failed (then the slots may not match the inputs: the next restart must
    /// recompute them). A failure costs only restart time: unpersisted slots are read back.
    pub(crate) fn persist_slots(&self, st: &mut State) {
        if !st.slots.needs_persist() {
            return;
        }
        let inputs =
            (!self.needs_regeneration.load(Ordering::SeqCst)).then(|| st.pol.inputs_digest());
        if let Err(e) = st.slots.persist(inputs) {
            tracing::warn!(
                "cannot persist policy slot records (the next restart reads them back): {e}"
            );
        }
    }

    /// Persists changed slot records, if any (housekeeping), durably: the fsync runs after the
    /// state lock is released, so a policy change never waits for it.
    pub fn persist_slot_records(&self) {
        let store = {
            let mut st = self.state();
            if !st.slots.needs_persist() {
                return;
            }
            self.persist_slots(&mut st);
            st.pol.store().clone()
        };
        if let Err(e) = store.flush() {
            tracing::warn!(
                "cannot flush policy slot records (the next restart reads them back): {e}"
            );
        }
    }

    /// Re-adopts every ready endpoint after a restart. With programs loaded afresh each is
    /// re-attached (the programs are replaced atomically: the veth never runs without one) and
    /// its entry rewritten, then the programs are pinned; with the previous manager's programs
    /// reused, an endpoint whose kernel entry is already right is not touched at all.
    /// First the policy slots are restored: each endpoint keeps the slot the kernel has it
    /// pointing at; slots whose last write is not known to be complete, and slots nobody uses
    /// any more, are read back (one dump of the policy maps, none when every slot is trusted); the
    /// unused ones are then released.
    pub fn readopt(&self) -> Result<usize, ManagerError> {
        let mut st = self.state();
        let t0 = std::time::Instant::now();
        let generations = self.datapath.slot_generations()?;
        let kernel_slots = self.datapath.endpoint_slots()?;
        let inputs = st.pol.inputs_digest();
        let (table, restored) = SlotTable::restore(st.pol.store().clone(), &generations, inputs)
            .map_err(crate::policy_state::PolicyStateError::from)?;
        st.slots = table;
        log_other_compilers(&restored);
        let ready: Vec<weft_api::Endpoint> = st
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready)
            .cloned()
            .collect();
        let mut n = 0;
        for ep in &ready {
            let slot = match kernel_slots.get(&ep.id) {
                Some(s) if generations.contains_key(s) => *s,
                _ => {
                    st.slots
                        .ensure(SlotKey::new(ep.identity, &self.named_ports(ep)))
                        .0
                }
            };
            st.slots.join(ep.id, slot);
            if let Some(mut view) = super::datapath_view(ep) {
                view.policy_id = slot;
                if self.datapath.readopt_endpoint(&view)? {
                    n += 1;
                }
            }
        }
        // Every ready endpoint runs this datapath's programs now: only from here may the next
        // start trust them (docs/DATAPATH.md, "Program pins").
        self.datapath.commit_programs()?;
        // A slot nobody uses whose write is trusted, for an identity kept idle, stays idle as
        // it was before the restart, with the enforcement flags its record kept (no member's
        // entry holds them); the others are read back (to know what to delete) and released.
        let (idle, unused): (Vec<u32>, Vec<u32>) = st.slots.unused().into_iter().partition(|s| {
            st.pol.identity_grace_ms() > 0
                && restored.trusted.contains(s)
                && st.slots.key(*s).is_some_and(|k| st.pol.is_idle(k.identity))
        });
        let now = crate::sys::clock::now_ms();
        for &slot in &idle {
            st.slots.mark_idle(slot, now);
            if let Some(e) = st.slots.enforcement(slot) {
                let flags = crate::datapath::SlotFlags {
                    ingress_enforced: e.ingress,
                    egress_enforced: e.egress,
                    tiers: e.tiers,
                };
                self.datapath.restore_slot_flags(slot, flags);
            }
        }
        let read_back: BTreeSet<u32> = restored
            .untrusted
            .iter()
            .copied()
            .chain(unused.iter().copied())
            .filter(|s| generations.contains_key(s))
            .collect();
        self.datapath.load_slots(&read_back)?;
        for slot in unused {
            self.release_if_unused(&mut st, slot)?;
        }
        st.trust_inputs = restored.inputs_unchanged;
        tracing::info!(
            slots = st.slots.len(),
            trusted = restored.trusted.len(),
            idle = idle.len(),
            read_back = read_back.len(),
            reattached = n,
            ready = ready.len(),
            programs = self.datapath.programs(),
            inputs_unchanged = restored.inputs_unchanged,
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "policy slots restored"
        );
        Ok(n)
    }

    /// Removes datapath state of endpoints the registry does not know (e.g. deleted while the
    /// manager was down, or created by a run whose state was lost). Returns how many.
    pub fn reconcile_datapath(&self) -> Result<usize, ManagerError> {
        let keep: BTreeSet<u32> = self
            .state()
            .reg
            .list()
            .filter(|ep| ep.state == EndpointState::Ready)
            .map(|ep| ep.id)
            .collect();
        let removed = self.datapath.reconcile(&keep)?;
        for id in &removed {
            tracing::warn!(
                endpoint_id = id,
                "removed datapath state of an unknown endpoint"
            );
        }
        Ok(removed.len())
    }

    /// Recomputes every ready endpoint (start-up): the datapath diffs against the pinned maps,
    /// so entries that stay are never touched and nothing is deleted before its replacement.
    /// The repository's CIDR identities enter the ipcache after the policies that know them.
    pub fn regenerate_all(&self) -> Result<usize, ManagerError> {
        let n = {
            let mut st = self.state();
            let ids: Vec<u32> = st.reg.list().map(|ep| ep.id).collect();
            // At restart, slots trusted under unchanged inputs are what a computation gives.
            let trust = std::mem::take(&mut st.trust_inputs);
            let n = self.regenerate_with(&mut st, &ids, trust)?;
            st.slots.forget_trust();
            let cidrs = st.pol.cidr_identities();
            st.ipcache.replace_source(&Source::Cidr, &cidrs);
            self.flush_ipcache(&mut st)?;
            self.persist_slots(&mut st);
            st.pol
                .store()
                .flush()
                .map_err(crate::policy_state::PolicyStateError::from)?;
            n
        };
        super::release_freed_memory();
        Ok(n)
    }

    /// Makes the kernel's ipcache exactly what its owners want: reads the map back, then
    /// rewrites wrong entries in place and removes those nothing owns any more (addresses of
    /// pods that died while the manager was down, CIDR identities no rule references).
    /// Returns how many entries were written or removed.
    pub fn reconcile_ipcache(&self) -> Result<usize, ManagerError> {
        let kernel = self.datapath.ipcache_entries()?;
        let mut st = self.state();
        // Kvstore mode before the first listing (etcd down at start): an address nothing here
        // owns may be a remote pod's. It stays until the listing says (`Remote::listed`);
        // checked under the lock the listing's callback takes, so it cannot slip in between.
        if self.cluster().is_some_and(|c| !c.synced()) {
            let unowned: BTreeMap<ipnet::IpNet, Identity> = kernel
                .iter()
                .filter(|(p, _)| p.prefix_len() == p.max_prefix_len())
                .filter(|(p, _)| st.ipcache.winner(p).is_none())
                .map(|(p, v)| (*p, v.identity))
                .collect();
            if !unowned.is_empty() {
                tracing::info!(
                    entries = unowned.len(),
                    "kvstore not listed yet: keeping unowned host entries until it is"
                );
            }
            st.ipcache
                .replace_source(&Source::restored_remote(), &unowned);
        }
        st.ipcache.set_written(kernel);
        let writes = st.ipcache.clone().pending();
        for w in &writes {
            if let crate::node::ipcache::Write::Remove(prefix) = w {
                tracing::warn!(%prefix, "removing stale ipcache entry");
            }
        }
        self.flush_ipcache(&mut st)?;
        Ok(writes.len())
    }

    /// Recomputes the policy of `ids`' slots and installs what changed; an endpoint whose
    /// identity or named ports no longer match its slot's moves to the right one. Returns how
    /// many endpoints had their policy changed.
    pub(crate) fn regenerate(&self, st: &mut State, ids: &[u32]) -> Result<usize, ManagerError> {
        self.regenerate_with(st, ids, false)
    }

    fn regenerate_with(
        &self,
        st: &mut State,
        ids: &[u32],
        trust: bool,
    ) -> Result<usize, ManagerError> {
        let rev = st.pol.repo().revision();
        // Each ready endpoint's slot (created where its key has none), and the slots to
        // compute: once each, not those a restart trusts.
        let mut moves: Vec<(u32, Option<u32>, u32)> = Vec::new();
        let mut targets: Vec<Target> = Vec::new();
        let mut seen: BTreeSet<u32> = BTreeSet::new();
        for &id in ids {
            let Some(ep) = st.reg.get(id) else {
                continue;
            };
            if ep.state != EndpointState::Ready {
                continue;
            }
            let named = self.named_ports(ep);
            let key = SlotKey::new(ep.identity, &named);
            let old = st.slots.slot_of(id);
            let slot = match old {
                Some(s) if st.slots.key(s) == Some(key) => s,
                _ => st.slots.ensure(key).0,
            };
            if seen.insert(slot) && !(trust && st.slots.trusted(slot)) {
                targets.push((slot, from_api_labels(&ep.labels), named));
            }
            moves.push((id, old, slot));
        }
        // Computed (and digested) on the workers while the slots before are written.
        let mut changed = 0;
        let pol = &st.pol;
        let slots = &mut st.slots;
        let compute = |(_, labels, named): &Target| {
            let policy = pol.compute(labels, named);
            let digest = crate::datapath::policy_digest(&policy);
            (policy, digest)
        };
        pipelined(&targets, compute, |(slot, ..), (policy, digest)| {
            if slots.digest(*slot) == Some(digest) {
                slots.computed(*slot);
            } else {
                self.write_slot(slots, *slot, &policy)?;
                changed += slots.members(*slot).len();
            }
            Ok::<_, ManagerError>(())
        })?;
        // Every endpoint joins its (written) slot before any slot it left is retired: a slot
        // one endpoint leaves may be the one another joins.
        let mut left = Vec::new();
        let mut switched = Ok(());
        for &(id, old, slot) in &moves {
            if old != Some(slot) {
                switched = self.datapath.switch_slot(id, slot);
                if switched.is_err() {
                    break;
                }
                left.extend(st.slots.join(id, slot));
                changed += 1;
            }
            st.reg.set_revision(id, rev);
        }
        for slot in left {
            self.retire_slot(st, slot)?;
        }
        switched?;
        self.datapath.end_policy_writes()?;
        Ok(changed)
    }
}

/// Says which slots another build's policy compiler wrote (an upgrade or a downgrade), and
/// what is done with them.
fn log_other_compilers(restored: &crate::slots::Restored) {
    use crate::slots::Compiler;
    if restored.other_compiler.is_empty() {
        return;
    }
    let by: BTreeSet<String> = restored
        .other_compiler
        .values()
        .map(|c| c.map_or_else(|| "an unversioned build".to_owned(), |c| c.to_string()))
        .collect();
    let read_back = restored
        .other_compiler
        .keys()
        .filter(|s| restored.untrusted.contains(s))
        .count();
    tracing::info!(
        slots = restored.other_compiler.len(),
        written_by = by.into_iter().collect::<Vec<_>>().join(", "),
        this_build = %Compiler::CURRENT,
        read_back,
        "policy slots written by another policy compiler: each is recomputed and rewritten \
         where it differs (read back first where its encoding differs)"
    );
}
