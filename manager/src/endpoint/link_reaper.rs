//! Host veths are deleted after DEL has answered. Deleting a veth blocks in the kernel for
//! ~20 ms (RCU grace periods in `unregister_netdevice`) and nothing needs it gone before the
//! runtime moves on: DEL sets the link down first, which takes its routes with it, so no route
//! or map entry points at the pod's IPs when they are freed. The deletion then runs here, in
//! the background, by the ifindex DEL saw: the CNI creates the next pod's pair while the
//! manager allocates, so a link of the same (container, ifname) — same name — may already be
//! the new one; an ifindex is not reused soon, so a late deletion never takes it. An ADD's
//! allocation still waits for the deletion (`settle`): until then the name is taken.
//! A manager killed with deletions pending finds the links at its next start: host veths that
//! no endpoint owns are scheduled again (`Manager::reap_orphan_links`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::task::JoinHandle;

use crate::node::hostnet::HostNet;

type Pending = HashMap<String, (u64, JoinHandle<()>)>;

/// Background deletion of host links, by name.
pub struct LinkReaper {
    hostnet: Arc<dyn HostNet>,
    pending: Arc<Mutex<Pending>>,
    generation: std::sync::atomic::AtomicU64,
}

fn lock(p: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    p.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LinkReaper {
    /// A reaper deleting through `hostnet`.
    pub fn new(hostnet: Arc<dyn HostNet>) -> Self {
        Self {
            hostnet,
            pending: Arc::new(Mutex::new(HashMap::new())),
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Deletes the link `index`, called `name` when it was read, in the background; a missing
    /// link is fine. Needs a tokio runtime.
    pub fn schedule(&self, name: &str, index: u32) {
        let mut pending = lock(&self.pending);
        if pending.contains_key(name) {
            return;
        }
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let hostnet = Arc::clone(&self.hostnet);
        let map = Arc::clone(&self.pending);
        let owned = name.to_owned();
        // Spawned under the lock: the task's own removal below waits until it is recorded.
        let task = tokio::spawn(async move {
            match hostnet.delete_link_index(index).await {
                Ok(()) => tracing::debug!(link = %owned, "host veth deleted"),
                Err(e) => tracing::warn!(link = %owned, "deleting host veth failed: {e}"),
            }
            let mut pending = lock(&map);
            if pending.get(&owned).is_some_and(|(g, _)| *g == generation) {
                pending.remove(&owned);
            }
        });
        pending.insert(name.to_owned(), (generation, task));
    }

    /// Returns once no deletion of `name` is pending or running.
    pub async fn settle(&self, name: &str) {
        let task = lock(&self.pending).remove(name);
        if let Some((_, task)) = task
            && let Err(e) = task.await
        {
            tracing::error!(link = %name, "host veth deletion task failed: {e}");
        }
    }

    /// Names whose deletion is pending or running.
    pub fn pending(&self) -> Vec<String> {
        lock(&self.pending).keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::hostnet::FakeHostNet;

    #[tokio::test]
    async fn settle_waits_for_the_deletion() {
        let net = Arc::new(FakeHostNet::default());
        net.links.lock().unwrap().insert("weftaaa".into(), 7);
        let reaper = LinkReaper::new(net.clone());
        reaper.schedule("weftaaa", 7);
        reaper.schedule("weftaaa", 7);
        reaper.settle("weftaaa").await;
        assert!(!net.links.lock().unwrap().contains_key("weftaaa"));
        assert!(reaper.pending().is_empty());
        // Nothing pending: settle returns at once, and a missing link is no error.
        reaper.settle("weftaaa").await;
        reaper.schedule("weftbbb", 8);
        reaper.settle("weftbbb").await;
    }

    #[tokio::test]
    async fn a_new_link_of_the_same_name_survives_the_old_ones_deletion() {
        let net = Arc::new(FakeHostNet::default());
        let reaper = LinkReaper::new(net.clone());
        // DEL read ifindex 7; the next ADD's pair, same name, is ifindex 9 by the time the
        // deletion runs.
        net.links.lock().unwrap().insert("weftaaa".into(), 9);
        reaper.schedule("weftaaa", 7);
        reaper.settle("weftaaa").await;
        assert_eq!(net.links.lock().unwrap().get("weftaaa"), Some(&9));
    }
}
