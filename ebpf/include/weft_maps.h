/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Map keys, values and events shared by the datapath programs and the manager.
 *
 * This header is the single C definition; ebpf/src/lib.rs mirrors each struct with #[repr(C)] and
 * ebpf/build.rs compiles ebpf/layout/layout.c (which includes this file) for the host so a test can
 * compare every size and offset. Keep padding explicit: the kernel hashes and compares whole keys,
 * so an implicit hole with garbage in it would make two equal keys differ.
 */
#ifndef WEFT_MAPS_H
#define WEFT_MAPS_H

#include <linux/types.h>

/* Direction from the endpoint's point of view (policy_key.direction, metrics, events). */
#define WEFT_DIR_INGRESS 0
#define WEFT_DIR_EGRESS 1

/* endpoint_info.flags */
#define WEFT_EP_INGRESS_ENFORCED (1u << 0)
#define WEFT_EP_EGRESS_ENFORCED (1u << 1)
#define WEFT_EP_HAS_IPV4 (1u << 2)
#define WEFT_EP_HAS_IPV6 (1u << 3)
/* The endpoint has ClusterNetworkPolicy entries of that tier in that direction: the tier is
 * looked up only when its flag is set (docs/DATAPATH.md, "ClusterNetworkPolicy tiers"). */
#define WEFT_EP_ADMIN_INGRESS (1u << 4)
#define WEFT_EP_ADMIN_EGRESS (1u << 5)
#define WEFT_EP_BASELINE_INGRESS (1u << 6)
#define WEFT_EP_BASELINE_EGRESS (1u << 7)

/*
 * endpoints: HASH, key = host-side ifindex (__u32). policy_id names the policy slot the
 * endpoint enforces: endpoints with the same identity (and named ports) share one slot's
 * entries in the policy trie. The enforcement flags are the slot's, copied here so that one
 * update of this entry switches slot and flags together.
 */
struct endpoint_info {
	__u32 endpoint_id;
	__u32 identity;
	__u32 flags;
	__u32 policy_id;
	__u8 mac[6];
	__u8 pad[2];
	__u8 ipv4[4];
	__u8 ipv6[16];
};

#define WEFT_FAMILY_V4 4
#define WEFT_FAMILY_V6 6

/*
 * ipcache: LPM_TRIE. The family byte and padding are always part of the prefix, so
 * prefixlen = 32 + address prefix length; an IPv4 address uses addr[0..4].
 */
struct ipcache_key {
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};
#define WEFT_IPCACHE_FIXED_PREFIX 32

/*
 * cidr_identity: for an endpoint's address (local or remote), the identity of the longest
 * CIDR-rule prefix containing it, else 0. Kubernetes ipBlock peers match pods by IP: their
 * policy entries are keyed by that CIDR identity with WEFT_IDENTITY_BY_IP set, and are looked
 * up only when the peer's own identity decided nothing (docs/POLICY.md, "ipBlock and pod IPs").
 */
struct ipcache_value {
	__u32 identity;
	__u32 cidr_identity;
};

/* Policy-key identity bit of the by-IP twin of a CIDR identity (above every real identity:
 * label identities < 2^24, CIDR identities 2^24 + n). */
#define WEFT_IDENTITY_BY_IP (1u << 30)

/*
 * A policy entry (see docs/DATAPATH.md, "Policy maps"): the key the manager computes,
 * {policy slot, peer identity, direction, proto, dport}, as an LPM prefix. policy_id, identity
 * and direction are always in the prefix (72 bits); proto adds 8 bits unless it is a wildcard;
 * dport (network byte order, so its high bits come first) adds 0..16 bits for an aligned
 * power-of-two port block. The direction byte also holds the layer the entry belongs to
 * (WEFT_TIER_* << WEFT_POLICY_TIER_SHIFT). No map is keyed by it: the entries are stored in two
 * steps, policy_pairs and policy_lists below.
 */
struct policy_key {
	__u32 prefixlen;
	__u32 policy_id;
	__u32 identity;
	__u8 direction;
	__u8 proto;
	__be16 dport;
};
#define WEFT_POLICY_FIXED_PREFIX 72
#define WEFT_POLICY_PROTO_PREFIX 80
#define WEFT_POLICY_FULL_PREFIX 96

/*
 * policy_pairs: HASH, key = the fixed part of a policy entry (slot, peer identity, direction
 * with its layer), value = the id (__u32) of the port list holding that pair's (proto, dport)
 * entries. Most pairs of a node have one of a few hundred distinct port lists, so each distinct
 * list is stored once. A pair with no entries has no key.
 */
struct policy_pair_key {
	__u32 policy_id;
	__u32 identity;
	__u8 direction;
	__u8 pad[3];
};

/*
 * policy_lists: LPM_TRIE, the port lists: list_id and pad (0) are always in the prefix (40
 * bits), then proto and dport exactly as in a policy entry (a policy entry's prefix length
 * minus 32). A list's entries never change while a pair points at it: the manager writes a new
 * list, points the pairs at it, then deletes the list nothing points at.
 */
struct policy_list_key {
	__u32 prefixlen;
	__u32 list_id;
	__u8 pad;
	__u8 proto;
	__be16 dport;
};
#define WEFT_POLICY_LIST_FIXED_PREFIX 40
#define WEFT_POLICY_LIST_FULL_PREFIX 64

/* Layers of policy_key.direction (bits 4..5). */
#define WEFT_TIER_POLICY 0
#define WEFT_TIER_ADMIN 1
#define WEFT_TIER_BASELINE 2
#define WEFT_POLICY_TIER_SHIFT 4
#define WEFT_POLICY_DIR_MASK 1

/*
 * policy_gen: HASH, key = policy_id (__u32), value = generation (__u64). Never read by the
 * programs: the manager's crash-safe record of which slots it finished writing. A slot whose
 * entries are being written holds 0; every slot that may have pairs in policy_pairs has a key.
 */

/*
 * policy_value.verdict: ALLOW and DENY in the NetworkPolicy layer (rule and priority 0); the
 * three ClusterNetworkPolicy actions in the tiers, numbered in the order they take precedence
 * at equal (priority, rule): deny first (fail closed).
 */
#define WEFT_VERDICT_ALLOW 1
#define WEFT_VERDICT_DENY 2
#define WEFT_VERDICT_TIER_DENY 3
#define WEFT_VERDICT_TIER_PASS 4
#define WEFT_VERDICT_TIER_ACCEPT 5

/*
 * A tier entry's precedence is (priority, rule, verdict), smallest first: the policy's
 * spec.priority, the rule's index in its direction's list, the action. Within one identity the
 * longest match is that identity's first entry (the manager resolved overlaps); across the
 * identities a packet matches (its own, 0, its by-IP twin) the smallest precedence wins.
 * Same 4 bytes as before tiers: NetworkPolicy entries have rule and priority 0.
 */
struct policy_value {
	__u8 verdict;
	__u8 rule;
	__u16 priority;
};

/*
 * ct: LRU_HASH. One entry per flow per endpoint and direction of the packet that created it,
 * keyed by that packet's tuple. A packet matches as "established" on its own tuple and as
 * "reply" on the reversed tuple with the opposite direction. endpoint_id and direction are in
 * the key so that the sending pod's entry never lets a packet skip the receiving pod's policy.
 * ICMP echo uses (id, 0) as ports for requests and (0, id) for replies.
 */
struct ct_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 endpoint_id;
	__u8 proto;
	__u8 direction;
	__u8 family;
	__u8 pad;
};

struct ct_value {
	__u64 created_ns;
	__u64 last_seen_ns;
	__u8 reason;
	__u8 flags;
	__u8 pad[2];
	/* A flow the datapath translated from a Service frontend (flags & WEFT_CT_SERVICE): the
	 * frontend's id in lb_revnat, to give replies the frontend's address back. */
	__u32 rev_nat;
};

/*
 * ct_value.flags: which side of a TCP connection has closed it. A FIN sets its sender's bit, an
 * RST both (it aborts the connection). With both bits set the entry is closed: it is no longer
 * refreshed and expires WEFT_CT_CLOSE_TIMEOUT_S after the close. An ACK-less SYN never passes on
 * an entry, open or closed: it meets the policy and, if allowed, writes the entry afresh.
 */
#define WEFT_CT_CLOSING_ORIG (1u << 0)
#define WEFT_CT_CLOSING_REPLY (1u << 1)
#define WEFT_CT_CLOSED (WEFT_CT_CLOSING_ORIG | WEFT_CT_CLOSING_REPLY)
/* The flow was translated from a Service frontend (rev_nat says which). */
#define WEFT_CT_SERVICE (1u << 2)
/* ... to the client pod itself: its source was rewritten to WEFT_LB_HAIRPIN_V4. */
#define WEFT_CT_HAIRPIN (1u << 3)

/* Idle lifetimes of ct entries (seconds); LRU eviction bounds the table anyway. */
#define WEFT_CT_LIFETIME_TCP_S (6 * 3600)
#define WEFT_CT_LIFETIME_OTHER_S 60
#define WEFT_CT_CLOSE_TIMEOUT_S 10

/*
 * frags: LRU_HASH. Only the first fragment of an IP datagram carries the L4 header; its ports
 * are remembered under the datagram's identity so later fragments get the same ports (and thus
 * the same conntrack and policy result) instead of ports 0.
 */
struct frag_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 id;
	__u8 proto;
	__u8 family;
	__u8 pad[2];
};

struct frag_value {
	__be16 sport;
	__be16 dport;
	__be16 policy_port;
	__u8 has_ports;
	__u8 pad;
};

/*
 * Service load-balancing (docs/DATAPATH.md, "Services"). A pod's packet to a frontend (a
 * Service's ClusterIP, port and protocol) is translated to one of the frontend's backends
 * before conntrack and egress policy, so policy judges the pod it really reaches.
 *
 * lb_services: HASH, key = the frontend, value = its id and number of backends (slots
 * 0..count-1 of lb_backends). A frontend with no backends has no entry.
 */
struct lb_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 family;
};

struct lb_service {
	__u32 id;
	__u32 count;
};

/* lb_backends: HASH, (frontend id, slot) -> backend. */
struct lb_backend_key {
	__u32 id;
	__u32 slot;
};

/* A backend (lb_backends; proto 0), or a frontend itself (lb_revnat: HASH, id -> frontend). */
struct lb_addr {
	__u8 addr[16];
	__be16 port;
	__u8 family;
	__u8 proto;
};

/*
 * lb_flows: LRU_HASH. The backend each flow of a frontend was given, keyed by the flow's
 * tuple as the client sent it, so that its later packets (and fragments) go to the same
 * backend while it stays one of the frontend's; a TCP SYN chooses afresh.
 */
struct lb_flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 family;
	__u8 pad[2];
};

struct lb_flow {
	struct lb_addr backend;
	__u32 slot;
};

/* Source a pod's connection to its own Service is given (the pod cannot receive a packet from
 * its own address): Cilium's IPV4_LOOPBACK, 169.254.42.1 (host order). */
#define WEFT_LB_HAIRPIN_V4 0xa9fe2a01u

/* Reasons (metrics_key.reason, drop_event.reason, ct_value.reason). */
#define WEFT_REASON_ALLOW_POLICY 1
#define WEFT_REASON_ALLOW_NOT_ENFORCED 2
#define WEFT_REASON_ALLOW_ESTABLISHED 3
#define WEFT_REASON_ALLOW_REPLY 4
#define WEFT_REASON_PASS_NEIGHBOUR 5
#define WEFT_REASON_PASS_NOT_IP 6
#define WEFT_REASON_DROP_POLICY_DENY 7
#define WEFT_REASON_DROP_POLICY_DEFAULT 8
#define WEFT_REASON_DROP_INVALID 9
#define WEFT_REASON_ALLOW_RELATED 10
#define WEFT_REASON_DROP_SPOOFED 11
/* ClusterNetworkPolicy: accepted or denied by a rule of the Admin or Baseline tier. */
#define WEFT_REASON_ALLOW_ADMIN 12
#define WEFT_REASON_DROP_ADMIN_DENY 13
#define WEFT_REASON_ALLOW_BASELINE 14
#define WEFT_REASON_DROP_BASELINE_DENY 15
#define WEFT_REASON_MAX 15

/* metrics: PERCPU_HASH. */
struct metrics_key {
	__u32 endpoint_id;
	__u8 direction;
	__u8 reason;
	__u16 pad;
};

struct metrics_value {
	__u64 packets;
	__u64 bytes;
};

/* events: RINGBUF of drop_event. tier, rule and priority name the deciding ClusterNetworkPolicy
 * rule of an admin or baseline deny (WEFT_TIER_*; 0 for every other drop). Fields are only ever
 * appended: a reader accepts the shorter records of an older object. */
struct drop_event {
	__u64 ts_ns;
	__u32 endpoint_id;
	__u32 ifindex;
	__u32 src_identity;
	__u32 dst_identity;
	__u8 direction;
	__u8 reason;
	__u8 family;
	__u8 proto;
	__be16 sport;
	__be16 dport;
	__u8 saddr[16];
	__u8 daddr[16];
	__u8 tier;
	__u8 rule;
	__u16 priority;
	__u32 pad;
};
/* sizeof(struct drop_event) before tier, rule and priority were appended. */
#define WEFT_DROP_EVENT_BASE_SIZE 64

#endif /* WEFT_MAPS_H */
