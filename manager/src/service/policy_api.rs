//! Policy operations: import, delete, list, identities, label changes and trace.

use weft_api::{
    Endpoint, EndpointState, IdentityInfo, ImportResult, TracePeerRequest, TraceRequest,
    TraceResult, policy::local_source,
};
use weft_policy::labels::{Label, LabelSet};
use weft_policy::mapstate::{Identity, Verdict, proto, reserved};
use weft_policy::rule::{NamedPorts, Rule};
use weft_policy::trace::{TracePeer, trace};

use super::{Manager, ManagerError, State, datapath_view, from_api_labels, to_api_labels};
use crate::node::ipcache::Source;
use crate::policy_state::Effects;

fn split_kv(s: &str) -> Result<(&str, &str), ManagerError> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| ManagerError::Invalid(format!("label {s:?} is not of the form key=value")))
}

fn parse_protocol(p: &str) -> Result<u8, ManagerError> {
    Ok(match p.to_ascii_lowercase().as_str() {
        "tcp" => proto::TCP,
        "udp" => proto::UDP,
        "sctp" => proto::SCTP,
        "icmp" => proto::ICMP,
        "icmpv6" => proto::ICMPV6,
        "any" => proto::ANY,
        n => n.parse().map_err(|_| {
            ManagerError::Invalid(format!(
                "protocol {p:?} is not tcp, udp, sctp, icmp, icmpv6 or a number"
            ))
        })?,
    })
}

impl Manager {
    fn apply_effects_after(&self, st: &mut State, effects: &Effects) -> Result<(), ManagerError> {
        // New CIDR identities enter the ipcache only once every endpoint's policy knows them;
        // released ones leave after no policy refers to them any more. A prefix that another
        // source (an endpoint's address) also wants keeps that source's entry.
        for (prefix, id) in &effects.ipcache_add {
            st.ipcache.set(*prefix, Source::Cidr, *id);
        }
        for prefix in &effects.ipcache_remove {
            st.ipcache.unset(*prefix, &Source::Cidr);
        }
        self.flush_ipcache(st)
    }

    /// Imports a policy file (Cilium JSON/YAML or Kubernetes `NetworkPolicy`). All or nothing: a
    /// file that does not parse changes nothing. Returns once every endpoint enforces the new
    /// revision.
    pub fn import_policy(&self, file: &str, text: &str) -> Result<ImportResult, ManagerError> {
        let t0 = std::time::Instant::now();
        // Outside the state lock: only rules whose text is new are parsed.
        let mut memo = self
            .parse_memo
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pieces = memo
            .parse(file, text)
            .map_err(|e| ManagerError::Invalid(e.to_string()))?;
        let warnings: Vec<String> = memo.take_notes().iter().map(ToString::to_string).collect();
        drop(memo);
        for w in &warnings {
            tracing::warn!(file, "policy warning: {w}");
        }
        let parsed = t0.elapsed();
        let mut st = self.state();
        let (change, effects) = st.pol.add_pieces(pieces)?;
        let mut result = self.finish_import(file, st, &change, &effects, t0, parsed)?;
        result.warnings = warnings;
        Ok(result)
    }

    /// Adds parsed rules (same labels replace, as on import). `t0`: when the request started.
    pub fn import_rules(
        &self,
        file: &str,
        rules: Vec<weft_policy::rule::Rule>,
        t0: std::time::Instant,
    ) -> Result<ImportResult, ManagerError> {
        let parsed = t0.elapsed();
        let mut st = self.state();
        let (change, effects) = st.pol.add_rules(rules)?;
        self.finish_import(file, st, &change, &effects, t0, parsed)
    }

    fn finish_import(
        &self,
        file: &str,
        st: std::sync::MutexGuard<'_, State>,
        change: &weft_policy::repository::RepoChange,
        effects: &Effects,
        t0: std::time::Instant,
        parsed: std::time::Duration,
    ) -> Result<ImportResult, ManagerError> {
        let stored = t0.elapsed();
        let result = self.enforce_change(st, change, effects, t0)?;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        tracing::info!(
            file,
            revision = result.revision,
            regenerated = result.regenerated,
            elapsed_ms = result.elapsed_ms,
            parse_ms = ms(parsed),
            repository_ms = ms(stored) - ms(parsed),
            regenerate_ms = result.elapsed_ms - ms(stored),
            "policy imported"
        );
        Ok(result)
    }

    /// Brings every endpoint to the repository's new revision after `change`, then releases
    /// the lock and the memory the regeneration freed. `t0`: when the request started.
    fn enforce_change(
        &self,
        mut st: std::sync::MutexGuard<'_, State>,
        change: &weft_policy::repository::RepoChange,
        effects: &Effects,
        t0: std::time::Instant,
    ) -> Result<ImportResult, ManagerError> {
        // The repository change is written but not yet durable: its fsync (milliseconds on a
        // busy disk) runs on another thread while the maps are written, and the answer waits
        // for both. A kill before it ends loses an unanswered change: the restart's slot
        // read-back repairs the maps to whichever repository was stored.
        let store = st.pol.store().clone();
        let (regenerated, flushed) = std::thread::scope(|s| {
            let flush = s.spawn(|| {
                let t = std::time::Instant::now();
                store.flush().map(|()| t.elapsed())
            });
            let t = std::time::Instant::now();
            let regenerated = self
                .regenerate_for_change(&mut st, change, effects)
                .and_then(|n| self.apply_effects_after(&mut st, effects).map(|()| n));
            let maps = t.elapsed();
            let flushed = flush.join();
            if let Ok(Ok(fsync)) = &flushed {
                tracing::debug!(
                    maps_us = maps.as_micros(),
                    fsync_us = fsync.as_micros(),
                    "policy change written (maps, and the store's flush beside them)"
                );
            }
            (regenerated, flushed.map(|f| f.map(|_| ())))
        });
        let flushed = flushed
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .map_err(|e| ManagerError::from(crate::policy_state::PolicyStateError::from(e)));
        let regenerated = regenerated
            .and_then(|n| flushed.map(|()| n))
            .inspect_err(|_| {
                self.mark_needs_regeneration();
                self.prom().policy_changed(t0.elapsed(), false);
            })?;
        // Before the answer (durable within sled's next flush): the next restart trusts the
        // slots this change wrote.
        self.persist_slots(&mut st);
        self.prom().policy_changed(t0.elapsed(), true);
        let result = ImportResult {
            revision: st.pol.repo().revision(),
            rules: st.pol.repo().rules().len(),
            regenerated,
            elapsed_ms: t0.elapsed().as_secs_f64() * 1000.0,
            warnings: Vec::new(),
        };
        drop(st);
        super::release_freed_memory();
        Ok(result)
    }

    /// Deletes the rules carrying every label of `filter` (`k=v`, optionally `source:k=v`),
    /// or every rule with `all`.
    pub fn delete_policy(
        &self,
        filter: &[String],
        all: bool,
    ) -> Result<ImportResult, ManagerError> {
        let t0 = std::time::Instant::now();
        if filter.is_empty() && !all {
            return Err(ManagerError::Invalid(
                "say which rules to delete: labels (k=v) or all".into(),
            ));
        }
        let filter: Vec<Label> = filter
            .iter()
            .map(|s| Label::parse_filter(s).map_err(|e| ManagerError::Invalid(e.to_string())))
            .collect::<Result<_, _>>()?;
        self.delete_rules(&filter, all, t0)
    }

    /// Deletes the rules whose labels contain all of `filter` (every rule with `all`).
    pub fn delete_rules(
        &self,
        filter: &[Label],
        all: bool,
        t0: std::time::Instant,
    ) -> Result<ImportResult, ManagerError> {
        let mut st = self.state();
        let (change, effects) = st.pol.delete_rules(filter, all)?;
        self.enforce_change(st, &change, &effects, t0)
    }

    /// Rules of the repository, cloned.
    pub fn rules(&self) -> Vec<weft_policy::rule::Rule> {
        self.state()
            .pol
            .repo()
            .rules()
            .iter()
            .map(|r| Rule::clone(r))
            .collect()
    }

    /// The repository: revision and rules.
    pub fn policies(&self) -> serde_json::Value {
        let st = self.state();
        let cache = self.k8s_cache.get();
        let rejected = cache.map(|c| c.rejected()).unwrap_or_default();
        let partial = cache.map(|c| c.partial()).unwrap_or_default();
        let tiered = cache.map(|c| c.tiered()).unwrap_or_default();
        serde_json::json!({
            "revision": st.pol.repo().revision(),
            "rules": st.pol.repo().rules(),
            "rejected": rejected,
            "partial": partial,
            "cluster_network_policies": tiered,
        })
    }

    /// Every identity in use.
    pub fn identities(&self) -> Vec<IdentityInfo> {
        let st = self.state();
        let clustered = self.cluster.is_some();
        let reserved_entry = |id, label: &str| IdentityInfo {
            id,
            labels: vec![label.into()],
            references: 0,
            source: local_source(),
        };
        let mut out = vec![
            reserved_entry(reserved::HOST, "reserved:host"),
            reserved_entry(reserved::WORLD, "reserved:world"),
        ];
        out.extend(st.pol.identities().map(|(id, key, refs)| {
            let (labels, source) = match key {
                weft_policy::identity::IdentityKey::Labels(l) => (
                    l.iter().map(ToString::to_string).collect(),
                    if clustered { "kvstore" } else { "local" },
                ),
                weft_policy::identity::IdentityKey::Cidr(p) => (vec![format!("cidr:{p}")], "local"),
            };
            IdentityInfo {
                id,
                labels,
                references: refs,
                source: source.into(),
            }
        }));
        out.extend(st.pol.remote_only().map(|(id, l)| IdentityInfo {
            id,
            labels: l.iter().map(ToString::to_string).collect(),
            references: 0,
            source: "kvstore".into(),
        }));
        out.sort_by_key(|i| i.id);
        out
    }

    /// Changes an endpoint's labels: new identity, ipcache and every affected endpoint updated.
    /// Peers learn the new identity before the endpoint's addresses map to it.
    pub fn set_labels(
        &self,
        id: u32,
        add: &[String],
        remove: &[String],
    ) -> Result<Endpoint, ManagerError> {
        let add: Vec<(&str, &str)> = add.iter().map(|s| split_kv(s)).collect::<Result<_, _>>()?;
        let remove: Vec<&str> = remove.iter().map(String::as_str).collect();
        let current = self
            .endpoint(id)
            .ok_or(crate::endpoint::EndpointError::NotFound(id))?;
        let new_labels = from_api_labels(&current.labels)
            .with_user_changes(&add, &remove)
            .map_err(|e| ManagerError::Invalid(e.to_string()))?;
        self.replace_labels(id, &new_labels)
    }

    /// Gives an endpoint exactly `new_labels` (Kubernetes mode: its pod's labels changed), with
    /// the same ordering guarantees as [`Self::set_labels`].
    pub fn replace_labels(&self, id: u32, new_labels: &LabelSet) -> Result<Endpoint, ManagerError> {
        let new_labels = new_labels.clone();
        // A label set new to this node may need a number from the kvstore: asked before the
        // state lock.
        let cluster_id = self.cluster_identity(&new_labels)?;
        let mut st = self.state();
        let mut ep = st
            .reg
            .get(id)
            .cloned()
            .ok_or(crate::endpoint::EndpointError::NotFound(id))?;
        if ep.state == EndpointState::Deleting {
            return Err(crate::endpoint::EndpointError::BeingDeleted(id).into());
        }
        let old_labels = from_api_labels(&ep.labels);
        if new_labels == old_labels {
            return Ok(ep);
        }
        let old_id = ep.identity;
        let (new_id, gained) = match cluster_id {
            Some(cid) => st.pol.acquire_as(&new_labels, Some(cid))?,
            None => st.pol.acquire(&new_labels)?,
        };
        ep.labels = to_api_labels(&new_labels);
        ep.identity = new_id;
        // Peers first, then the endpoint's own entry and ipcache addresses, then its record: a
        // failure before the record is written leaves the old identity in force everywhere.
        let set_addresses = |st: &mut State, identity: Identity| {
            for ip in &ep.ips {
                st.ipcache.set(
                    ipnet::IpNet::from(ip.address),
                    Source::LocalEndpoint(ep.id),
                    identity,
                );
            }
        };
        let mut programmed = self.regenerate_users(&mut st, &gained).map(|_| ());
        // Its named ports move to the new identity with it (peers' egress rules by name).
        let ready = ep.state == EndpointState::Ready;
        let named = self.named_ports(&ep);
        let owner = crate::policy_state::PortOwner::Local(ep.id);
        if programmed.is_ok() && ready {
            let moved = st.pol.set_peer_ports(owner.clone(), new_id, named.clone());
            programmed = self.regenerate_users(&mut st, &moved).map(|_| ());
        }
        if programmed.is_ok()
            && let (EndpointState::Ready, Some(mut view)) = (ep.state, datapath_view(&ep))
        {
            // The new identity's slot is complete before the endpoint's entry switches to it:
            // one update changes identity, slot and enforcement flags together; the old slot
            // goes only after, if nobody else uses it.
            programmed = self
                .prepare_slot(&mut st, new_id, &new_labels, &named)
                .and_then(|slot| {
                    view.policy_id = slot;
                    self.datapath.attach_endpoint(&view)?;
                    if let Some(old) = st.slots.join(ep.id, slot) {
                        self.retire_slot(&mut st, old)?;
                    }
                    Ok(())
                });
            if programmed.is_ok() {
                set_addresses(&mut st, new_id);
                programmed = self.flush_ipcache(&mut st);
            }
        }
        if let Err(e) = programmed {
            set_addresses(&mut st, old_id);
            if ready {
                // (The full regeneration asked for below recomputes from this.)
                let _ = st.pol.set_peer_ports(owner, old_id, named);
            }
            st.pol.release(new_id)?;
            self.mark_needs_regeneration();
            return Err(e);
        }
        let ep = st.reg.update(ep)?;
        let lost = st
            .pol
            .release(old_id)
            .map_err(ManagerError::from)
            .and_then(|lost| {
                self.regenerate(&mut st, &[ep.id])?;
                self.regenerate_users(&mut st, &lost)
            });
        if let Err(e) = lost {
            self.mark_needs_regeneration();
            return Err(e);
        }
        self.poke_cluster();
        tracing::info!(
            endpoint_id = id,
            old_identity = old_id,
            new_identity = new_id,
            "endpoint labels changed"
        );
        Ok(ep)
    }

    fn resolve_peer<'a>(
        &self,
        st: &'a State,
        peer: &TracePeerRequest,
        side: &str,
    ) -> Result<(Identity, Option<LabelSet>, Identity, NamedPorts), ManagerError> {
        let set = [
            peer.endpoint.is_some(),
            !peer.labels.is_empty(),
            peer.ip.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if set != 1 {
            return Err(ManagerError::Invalid(format!(
                "{side}: give exactly one of an endpoint id, labels or an IP"
            )));
        }
        // What the datapath sees for the endpoint's address: its identity and, for Kubernetes
        // ipBlocks, the CIDR identity containing it.
        let cidr_of = |ip: std::net::IpAddr| {
            st.ipcache
                .value(&ipnet::IpNet::from(ip))
                .map_or(0, |v| v.cidr_identity)
        };
        let local = |ep: &'a Endpoint| {
            let cidr = ep.ips.first().map_or(0, |i| cidr_of(i.address));
            (
                ep.identity,
                Some(from_api_labels(&ep.labels)),
                cidr,
                self.named_ports(ep),
            )
        };
        if let Some(id) = peer.endpoint {
            let ep = st
                .reg
                .get(id)
                .ok_or(crate::endpoint::EndpointError::NotFound(id))?;
            return Ok(local(ep));
        }
        if let Some(ip) = peer.ip {
            if let Some(ep) = st.reg.owner_of(ip) {
                return Ok(local(ep));
            }
            // Longest-prefix match over what the ipcache holds, as the datapath resolves it.
            let v = st.ipcache.resolve(ip).map(|(_, v)| v);
            return Ok((
                v.map_or(reserved::WORLD, |v| v.identity),
                None,
                v.map_or(0, |v| v.cidr_identity),
                NamedPorts::new(),
            ));
        }
        let wanted: Vec<Label> = peer
            .labels
            .iter()
            .map(|s| Label::parse_filter(s).map_err(|e| ManagerError::Invalid(e.to_string())))
            .collect::<Result<_, _>>()?;
        let by_identity: std::collections::BTreeMap<Identity, &Endpoint> = st
            .reg
            .list()
            .filter(|ep| from_api_labels(&ep.labels).contains_all(&wanted))
            .map(|ep| (ep.identity, ep))
            .collect();
        let hits: Vec<&Endpoint> = by_identity.into_values().collect();
        match hits.as_slice() {
            [ep] => Ok(local(ep)),
            [] => Err(ManagerError::Invalid(format!(
                "{side}: no endpoint has the labels {}; give labels of an existing endpoint, an endpoint id or an IP",
                peer.labels.join(",")
            ))),
            many => Err(ManagerError::Invalid(format!(
                "{side}: labels {} match endpoints of {} different identities; add labels to narrow it",
                peer.labels.join(","),
                many.len()
            ))),
        }
    }

    /// What the policy decides for one flow, and which rule decided.
    pub fn trace(&self, req: &TraceRequest) -> Result<TraceResult, ManagerError> {
        let protocol = parse_protocol(&req.protocol)?;
        let st = self.state();
        let (src_id, src_labels, src_cidr, src_ports) =
            self.resolve_peer(&st, &req.src, "source")?;
        let (dst_id, dst_labels, dst_cidr, dst_ports) =
            self.resolve_peer(&st, &req.dst, "destination")?;
        let t = trace(
            st.pol.repo(),
            st.pol.cache(),
            TracePeer {
                identity: src_id,
                labels: src_labels.as_ref(),
                named_ports: Some(&src_ports),
                cidr_identity: src_cidr,
            },
            TracePeer {
                identity: dst_id,
                labels: dst_labels.as_ref(),
                named_ports: Some(&dst_ports),
                cidr_identity: dst_cidr,
            },
            protocol,
            req.port,
            st.pol.options(),
        );
        Ok(TraceResult {
            verdict: if t.verdict == Verdict::Allow {
                "allow"
            } else {
                "deny"
            }
            .into(),
            src_identity: src_id,
            dst_identity: dst_id,
            egress: t.egress.map(|d| d.to_string()),
            ingress: t.ingress.map(|d| d.to_string()),
        })
    }
}
