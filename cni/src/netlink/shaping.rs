//! Pod bandwidth: a token-bucket (`tbf`) root qdisc on the device the traffic leaves by.
//!
//! Egress (`kubernetes.io/egress-bandwidth`) is shaped on the pod's own interface, inside its
//! netns: every packet the pod sends leaves through it, and its root qdisc is not the ingress
//! slot Weft's clsact holds on the host veth (the reason the chained `bandwidth` plugin cannot
//! do egress beside Weft: it redirects the host veth's ingress to an ifb). One qdisc per pod
//! device, so pods do not share a qdisc lock. The pod cannot change it without `CAP_NET_ADMIN`.
//!
//! rtnetlink has no tbf builder, so the options are written here: `struct tc_tbf_qopt`
//! (`include/uapi/linux/pkt_sched.h`) plus `TCA_TBF_BURST` and, above 4 GB/s,
//! `TCA_TBF_RATE64`. The link layer is given (Ethernet), so the kernel needs no rate table.

use super::cause;
use crate::error::CniError;
use futures::StreamExt;
use netlink_packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption};
use rtnetlink::Handle;

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
const TC_LINKLAYER_ETHERNET: u8 = 1;

/// A token bucket for `rate_bits` bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Bytes per second.
    pub rate: u64,
    /// Bytes that may pass at once: 100 ms of the rate, at least 32 KiB (a few full-size GSO
    /// segments; a smaller bucket starves large packets).
    pub burst: u32,
    /// Bytes queued before drops: 25 ms of the rate plus the burst, as the `bandwidth` plugin.
    pub limit: u32,
}

impl Bucket {
    /// The bucket for a rate in bits per second.
    #[must_use]
    pub fn for_rate(rate_bits: u64) -> Self {
        let rate = rate_bits / 8;
        let burst = u32::try_from((rate / 10).max(32 * 1024)).unwrap_or(u32::MAX);
        let limit = u32::try_from(rate / 40 + u64::from(burst)).unwrap_or(u32::MAX);
        Self { rate, burst, limit }
    }

    /// `struct tc_tbf_qopt`: rate spec, peak-rate spec (unused), limit, buffer, mtu. The buffer
    /// comes from `TCA_TBF_BURST` instead of ticks.
    fn qopt(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(36);
        // struct tc_ratespec { u8 cell_log; u8 linklayer; u16 overhead; s16 cell_align;
        // u16 mpu; u32 rate; }
        b.extend_from_slice(&[0, TC_LINKLAYER_ETHERNET]);
        b.extend_from_slice(&[0; 6]);
        b.extend_from_slice(&u32::try_from(self.rate).unwrap_or(u32::MAX).to_ne_bytes());
        b.extend_from_slice(&[0; 12]);
        b.extend_from_slice(&self.limit.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b
    }

    fn options(&self) -> Vec<TcOption> {
        let mut o = vec![
            TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, self.qopt())),
            TcOption::Other(DefaultNla::new(
                TCA_TBF_BURST,
                self.burst.to_ne_bytes().to_vec(),
            )),
        ];
        if self.rate > u64::from(u32::MAX) {
            o.push(TcOption::Other(DefaultNla::new(
                TCA_TBF_RATE64,
                self.rate.to_ne_bytes().to_vec(),
            )));
        }
        o
    }
}

/// Adds a root tbf qdisc for `bucket` on the interface `index` of the handle's netns. Fails if
/// the device already has a root qdisc of its own (a fresh veth has none).
pub async fn limit(handle: &Handle, index: u32, bucket: Bucket) -> Result<(), CniError> {
    let what = || format!("shaping interface {index} to {} bit/s", bucket.rate * 8);
    let mut msg = TcMessage::with_index(
        i32::try_from(index).map_err(|_| CniError::netlink(what(), "ifindex out of range"))?,
    );
    msg.header.parent = TcHandle::ROOT;
    msg.header.handle = TcHandle { major: 1, minor: 0 };
    msg.attributes.push(TcAttribute::Kind("tbf".into()));
    msg.attributes.push(TcAttribute::Options(bucket.options()));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    let mut responses = handle
        .clone()
        .request(req)
        .map_err(|e| CniError::netlink(what(), e))?;
    while let Some(msg) = responses.next().await {
        if let NetlinkPayload::Error(e) = msg.payload
            && e.code.is_some()
        {
            return Err(CniError::netlink(
                what(),
                cause(rtnetlink::Error::NetlinkError(e)),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_testkit::{require_root_and_tools, sh};

    /// Deletes the test's netns even when an assertion fails.
    struct Netns(String);
    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }

    /// Privileged: the kernel takes the hand-written options and reports the asked rate.
    #[tokio::test]
    async fn the_kernel_accepts_the_tbf() {
        require_root_and_tools("tbf test", &["ip", "tc"], "apt: iproute2 (scripts/setup)");
        let ns = Netns(format!("wshape-{}", std::process::id()));
        sh(&["ip", "netns", "add", &ns.0]);
        sh(&[
            "ip", "-n", &ns.0, "link", "add", "shape0", "type", "veth", "peer", "name", "shape1",
        ]);
        let index: u32 = sh(&["ip", "-n", &ns.0, "-o", "link", "show", "shape0"])
            .split(':')
            .next()
            .and_then(|i| i.trim().parse().ok())
            .expect("ifindex of shape0");
        let file = std::fs::File::open(format!("/run/netns/{}", ns.0)).expect("open netns");
        crate::netns::run_in_netns(file, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .map_err(|e| CniError::netlink("runtime", e))?;
            rt.block_on(async {
                let h = super::super::connect()?;
                limit(&h, index, Bucket::for_rate(10_000_000)).await
            })
        })
        .await
        .expect("tbf added");
        let shown = sh(&["tc", "-n", &ns.0, "qdisc", "show", "dev", "shape0"]);
        assert!(
            shown.contains("tbf 1: root") && shown.contains("rate 10Mbit"),
            "{shown}"
        );
        assert!(
            shown.contains("burst 125000b") || shown.contains("burst 122070b"),
            "{shown}"
        );
    }

    #[test]
    fn bucket_sizes_and_layout() {
        let b = Bucket::for_rate(10_000_000);
        assert_eq!(b.rate, 1_250_000);
        assert_eq!(b.burst, 125_000);
        assert_eq!(b.limit, 1_250_000 / 40 + 125_000);
        assert_eq!(Bucket::for_rate(8_000).burst, 32 * 1024);
        let q = b.qopt();
        assert_eq!(q.len(), 36);
        assert_eq!(q[1], TC_LINKLAYER_ETHERNET);
        assert_eq!(&q[8..12], &1_250_000u32.to_ne_bytes());
        assert_eq!(&q[24..28], &b.limit.to_ne_bytes());
        assert_eq!(b.options().len(), 2);
        assert_eq!(Bucket::for_rate(40_000_000_000).options().len(), 3);
    }
}
