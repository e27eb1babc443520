//! The Service and `EndpointSlice` watchers: both feed one [`ServiceTable`], and each Service
//! whose translation changes is delivered to the sink. The table is held while delivering, so
//! the sink sees a Service's changes in the order they were computed even though the two
//! watchers run as separate tasks.

use super::{Handler, Watchers};
use crate::services::{Change, SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL, ServiceTable, key};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::BTreeSet;

/// Services another proxy serves are not watched (kube-proxy's selector too). Their frontends
/// would not be translated anyway (`crate::services`): the selector saves the memory.
pub(super) fn service_selector() -> String {
    format!("!{SERVICE_PROXY_NAME_LABEL}")
}

/// Slices of a Service, except those of headless Services (the `EndpointSlice` controller labels
/// them) and of other proxies' Services (it copies the Service's labels onto its slices).
pub(super) fn slice_selector() -> String {
    format!("{SERVICE_NAME_LABEL},!{HEADLESS_LABEL},!{SERVICE_PROXY_NAME_LABEL}")
}

/// The `EndpointSlice` controller's label on the slices of a headless Service.
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

impl Watchers {
    /// Runs `f` on the table and delivers the changes it returns, the table still held.
    fn services_do(&self, f: impl FnOnce(&mut ServiceTable, &str) -> Vec<Change>) {
        let mut t = self
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for c in f(&mut t, &self.node_name) {
            match c {
                Change::Apply(name, frontends) => {
                    tracing::debug!(service = %name, frontends = frontends.len(), "service translated");
                    self.sink.service_apply(&name, frontends);
                }
                Change::Delete(name) => {
                    tracing::debug!(service = %name, "service without frontends");
                    self.sink.service_delete(&name);
                }
            }
        }
    }
}

pub(super) struct Services;
impl Handler<Service> for Services {
    fn name(&self) -> &'static str {
        "services"
    }
    fn apply(&mut self, w: &Watchers, svc: Service) {
        w.services_do(|t, node| t.put_service(svc, node).into_iter().collect());
    }
    fn delete(&mut self, w: &Watchers, svc: Service) {
        w.services_do(|t, node| t.remove_service(&svc, node).into_iter().collect());
    }
    fn relisted(&mut self, w: &Watchers, listed: &[Service]) {
        let keys: BTreeSet<String> = listed.iter().filter_map(|s| key(&s.metadata)).collect();
        w.services_do(|t, node| t.services_relisted(&keys, node, || w.sink.service_names()));
    }
}

pub(super) struct Slices;
impl Handler<EndpointSlice> for Slices {
    fn name(&self) -> &'static str {
        "endpointslices"
    }
    fn apply(&mut self, w: &Watchers, slice: EndpointSlice) {
        w.services_do(|t, node| t.put_slice(slice, node));
    }
    fn delete(&mut self, w: &Watchers, slice: EndpointSlice) {
        w.services_do(|t, node| t.remove_slice(&slice, node).into_iter().collect());
    }
    fn relisted(&mut self, w: &Watchers, listed: &[EndpointSlice]) {
        let keys: BTreeSet<String> = listed.iter().filter_map(|s| key(&s.metadata)).collect();
        w.services_do(|t, node| t.slices_relisted(&keys, node, || w.sink.service_names()));
    }
}
