// SPDX-License-Identifier: Apache-2.0
/*
 * Weft's per-endpoint datapath, attached to the host side of each pod's veth:
 *   from_pod  (tc ingress of the host veth)  = packets leaving the pod  -> the pod's EGRESS policy
 *   to_pod    (tc egress of the host veth)   = packets entering the pod -> the pod's INGRESS policy
 * Order per IP packet: (leaving the pod) Service translation (lb.h) -> conntrack (own tuple,
 * then reversed tuple; never for an ACK-less TCP SYN) -> the layers of policy whose flags are
 * set (ClusterNetworkPolicy Admin tier, NetworkPolicy, ClusterNetworkPolicy Baseline tier:
 * decide()) -> create ct entry -> metrics, and a ringbuf event on drop. docs/DATAPATH.md
 * describes the map encodings and the conntrack rules.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "weft_maps.h"
#include "parse.h"
#include "lb.h"

#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#endif
#ifndef unlikely
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif

#define ETH_P_IP_BE bpf_htons(0x0800)
#define ETH_P_IPV6_BE bpf_htons(0x86DD)
#define ETH_P_ARP_BE bpf_htons(0x0806)

#define NS_PER_S 1000000000ULL
/* Idle lifetimes of conntrack entries (weft_maps.h); LRU eviction bounds the table anyway. */
#define CT_LIFETIME_TCP_NS (WEFT_CT_LIFETIME_TCP_S * NS_PER_S)
#define CT_LIFETIME_OTHER_NS (WEFT_CT_LIFETIME_OTHER_S * NS_PER_S)
#define CT_CLOSE_TIMEOUT_NS (WEFT_CT_CLOSE_TIMEOUT_S * NS_PER_S)
/* Refresh last_seen at most once a second: a write per packet would bounce the cache line
 * between CPUs for every packet of a busy flow. */
#define CT_REFRESH_NS 1000000000ULL

/* Default sizes; the manager overrides every max_entries at load time (DatapathConfig). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct endpoint_info);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints SEC(".maps");

/* LPM tries must be created with BPF_F_NO_PREALLOC (the kernel rejects them otherwise). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(max_entries, 512 * 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipcache SEC(".maps");

/* Not preallocated: a node holds a few thousand to a few hundred thousand pairs. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct policy_pair_key);
	__type(value, __u32);
	__uint(max_entries, 1024 * 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_pairs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct policy_list_key);
	__type(value, struct policy_value);
	__uint(max_entries, 256 * 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_lists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_gen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 512 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag_key);
	__type(value, struct frag_value);
	__uint(max_entries, 8192);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} frags SEC(".maps");

/* Not preallocated: per-CPU values for every possible (endpoint, direction, reason) would cost
 * max_entries * ncpus * 16 bytes up front. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct metrics_key);
	__type(value, struct metrics_value);
	__uint(max_entries, 256 * 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} metrics SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} events SEC(".maps");

static __always_inline void count(__u32 endpoint_id, __u8 dir, __u8 reason, __u32 len)
{
	struct metrics_key k = { .endpoint_id = endpoint_id, .direction = dir, .reason = reason };
	struct metrics_value *v = bpf_map_lookup_elem(&metrics, &k);

	if (v) {
		/* Per-CPU value: no atomics needed. */
		v->packets += 1;
		v->bytes += len;
		return;
	}
	struct metrics_value init = { .packets = 1, .bytes = len };

	bpf_map_update_elem(&metrics, &k, &init, BPF_NOEXIST);
}

struct peer {
	__u32 identity;
	__u32 cidr_identity;
};

static __always_inline struct peer peer_identity(const struct flow *f, const __u8 *addr)
{
	struct ipcache_key k = { .family = f->family };
	struct peer p = { .identity = 2 };

	__builtin_memcpy(k.addr, addr, 16);
	k.prefixlen = WEFT_IPCACHE_FIXED_PREFIX + (f->family == WEFT_FAMILY_V4 ? 32 : 128);
	struct ipcache_value *v = bpf_map_lookup_elem(&ipcache, &k);

	/* The manager installs 0.0.0.0/0 and ::/0 -> world; a miss means the same. */
	if (v) {
		p.identity = v->identity;
		p.cidr_identity = v->cidr_identity;
	}
	return p;
}

/* The policy entry of (slot, peer identity, direction) for the flow's protocol and port, in two
 * steps: the pair's port list, then the longest match in that list. NULL: no entry. */
static __always_inline struct policy_value *policy_entry(__u32 policy_id, __u32 identity,
							  __u8 direction, const struct flow *f)
{
	struct policy_pair_key pk = {
		.policy_id = policy_id,
		.identity = identity,
		.direction = direction,
	};
	__u32 *list = bpf_map_lookup_elem(&policy_pairs, &pk);

	if (!list)
		return NULL;
	struct policy_list_key k = {
		.prefixlen = WEFT_POLICY_LIST_FULL_PREFIX,
		.list_id = *list,
		.proto = f->proto,
		.dport = f->policy_port,
	};

	return bpf_map_lookup_elem(&policy_lists, &k);
}

static __always_inline __u8 policy_verdict(__u32 policy_id, __u32 identity, __u8 dir,
					   const struct flow *f)
{
	/* Within one identity the userspace encoding already resolved deny-over-allow (a block
	 * covered by a deny is stored as deny), so the longest match is the answer for that
	 * identity. Across the exact identity and the wildcard 0, deny in either wins. */
	struct policy_value *exact = policy_entry(policy_id, identity, dir, f);

	if (exact && exact->verdict == WEFT_VERDICT_DENY)
		return WEFT_VERDICT_DENY;
	struct policy_value *any = policy_entry(policy_id, 0, dir, f);

	if (any)
		return any->verdict;
	return exact ? exact->verdict : 0;
}

static __always_inline void ct_fill(struct ct_key *k, const struct flow *f, __u32 endpoint_id,
				    __u8 dir, int reverse)
{
	k->endpoint_id = endpoint_id;
	k->proto = f->proto;
	k->family = f->family;
	if (!reverse) {
		__builtin_memcpy(k->saddr, f->saddr, 16);
		__builtin_memcpy(k->daddr, f->daddr, 16);
		k->sport = f->sport;
		k->dport = f->dport;
		k->direction = dir;
	} else {
		__builtin_memcpy(k->saddr, f->daddr, 16);
		__builtin_memcpy(k->daddr, f->saddr, 16);
		k->sport = f->dport;
		k->dport = f->sport;
		k->direction = dir ^ 1;
	}
}

/* An ICMP error is related to a flow when its quoted packet belongs to it: the quoted packet went
 * the other way (dir ^ 1) as an original-direction packet, or this way reversed as a reply. */
static __always_inline int ct_related(const struct flow *f, __u32 endpoint_id, __u8 dir)
{
	struct ct_key k = {
		.sport = f->inner_sport,
		.dport = f->inner_dport,
		.endpoint_id = endpoint_id,
		.proto = f->inner_proto,
		.direction = dir ^ 1,
		.family = f->family,
	};

	__builtin_memcpy(k.saddr, f->inner_saddr, 16);
	__builtin_memcpy(k.daddr, f->inner_daddr, 16);
	if (bpf_map_lookup_elem(&ct, &k))
		return 1;
	__builtin_memcpy(k.saddr, f->inner_daddr, 16);
	__builtin_memcpy(k.daddr, f->inner_saddr, 16);
	k.sport = f->inner_dport;
	k.dport = f->inner_sport;
	k.direction = dir;
	return bpf_map_lookup_elem(&ct, &k) != 0;
}

static __always_inline int ct_alive(struct ct_value *v, __u8 proto, __u64 now)
{
	__u64 idle = now - v->last_seen_ns;

	/* A closed connection's entry lives out its close timeout (the last ACK, a retransmitted
	 * FIN) and is not refreshed. */
	if (unlikely((v->flags & WEFT_CT_CLOSED) == WEFT_CT_CLOSED))
		return idle <= CT_CLOSE_TIMEOUT_NS;
	__u64 lifetime = proto == IPPROTO_TCP ? CT_LIFETIME_TCP_NS : CT_LIFETIME_OTHER_NS;

	if (idle > lifetime)
		return 0;
	if (idle > CT_REFRESH_NS)
		v->last_seen_ns = now;
	return 1;
}

/* A FIN closes its sender's side (`side`), an RST the whole connection. Once both sides are
 * closed, the close timeout starts. */
static __always_inline void ct_close(struct ct_value *v, __u8 tcp_flags, __u8 side, __u64 now)
{
	__u8 flags = v->flags | ((tcp_flags & TCP_FLAG_RST) ? WEFT_CT_CLOSED : side);

	if (flags == v->flags)
		return;
	if ((flags & WEFT_CT_CLOSED) == WEFT_CT_CLOSED)
		v->last_seen_ns = now;
	v->flags = flags;
}

/* The first fragment records its ports, later ones take them over (fragments of one datagram
 * can only be matched by the IP identification). A later fragment whose first one was not seen
 * keeps ports 0 and is judged as such. */
static __always_inline void track_fragment(struct flow *f)
{
	struct frag_key k = { .id = f->frag_id, .proto = f->proto, .family = f->family };

	__builtin_memcpy(k.saddr, f->saddr, 16);
	__builtin_memcpy(k.daddr, f->daddr, 16);
	if (f->frag == FRAG_FIRST) {
		struct frag_value v = {
			.sport = f->sport,
			.dport = f->dport,
			.policy_port = f->policy_port,
			.has_ports = f->has_ports,
		};

		bpf_map_update_elem(&frags, &k, &v, BPF_ANY);
		return;
	}
	struct frag_value *v = bpf_map_lookup_elem(&frags, &k);

	if (v) {
		f->sport = v->sport;
		f->dport = v->dport;
		f->policy_port = v->policy_port;
		f->has_ports = v->has_ports;
	}
}

static __always_inline int source_valid(const struct endpoint_info *ep, const struct flow *f)
{
	if (f->family == WEFT_FAMILY_V4)
		return (ep->flags & WEFT_EP_HAS_IPV4) &&
		       __builtin_memcmp(f->saddr, ep->ipv4, 4) == 0;
	if (f->saddr[0] == 0xfe && (f->saddr[1] & 0xc0) == 0x80)
		return 1;
	return (ep->flags & WEFT_EP_HAS_IPV6) && __builtin_memcmp(f->saddr, ep->ipv6, 16) == 0;
}

/* What decided a new flow, for metrics, conntrack and the drop event: a WEFT_REASON_*, and for a
 * ClusterNetworkPolicy tier the deciding rule (tier 0 otherwise). */
struct decision {
	__u8 reason;
	__u8 tier;
	__u8 rule;
	__u8 pad;
	__u16 priority;
};

static __always_inline void send_drop(struct __sk_buff *skb, const struct endpoint_info *ep,
				      __u8 dir, const struct decision *d, const struct flow *f,
				      __u32 peer)
{
	struct drop_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e)
		return;
	e->ts_ns = bpf_ktime_get_ns();
	e->endpoint_id = ep->endpoint_id;
	e->ifindex = skb->ifindex;
	/* The peer is the source of packets entering the pod and the destination of those
	 * leaving it. */
	e->src_identity = dir == WEFT_DIR_INGRESS ? peer : ep->identity;
	e->dst_identity = dir == WEFT_DIR_INGRESS ? ep->identity : peer;
	e->direction = dir;
	e->reason = d->reason;
	e->family = f->family;
	e->proto = f->proto;
	e->sport = f->sport;
	e->dport = f->proto == IPPROTO_ICMP || f->proto == IPPROTO_ICMPV6 ? f->policy_port : f->dport;
	__builtin_memcpy(e->saddr, f->saddr, 16);
	__builtin_memcpy(e->daddr, f->daddr, 16);
	e->tier = d->tier;
	e->rule = d->rule;
	e->priority = d->priority;
	e->pad = 0;
	bpf_ringbuf_submit(e, 0);
}

/* Drops a packet as `d` decided (counted, reported). */
static __always_inline int drop_decided(struct __sk_buff *skb, const struct endpoint_info *ep,
					__u8 dir, const struct decision *d, const struct flow *f,
					__u32 peer)
{
	count(ep->endpoint_id, dir, d->reason, skb->len);
	send_drop(skb, ep, dir, d, f, peer);
	return TC_ACT_SHOT;
}

/* Drops a packet for a reason that is no policy rule's (counted, reported). */
static __always_inline int drop(struct __sk_buff *skb, const struct endpoint_info *ep, __u8 dir,
				__u8 reason, const struct flow *f, __u32 peer)
{
	struct decision d = { .reason = reason };

	return drop_decided(skb, ep, dir, &d, f, peer);
}

/* The policy verdict for a new flow: the peer's identity, then (nothing decided) the identity
 * of the CIDR rule containing it; 0 when nothing allows or denies it. */
static __always_inline __u8 verdict_for(const struct endpoint_info *ep, struct peer p, __u8 dir,
					const struct flow *f)
{
	__u8 verdict = policy_verdict(ep->policy_id, p.identity, dir, f);

	/* A pod's address inside a Kubernetes ipBlock: only when its own identity decided
	 * nothing (a deny for it, or for any peer, still wins). */
	if (!verdict && p.cidr_identity)
		verdict = policy_verdict(ep->policy_id, p.cidr_identity | WEFT_IDENTITY_BY_IP, dir, f);
	return verdict;
}

/* The first entry in precedence of one ClusterNetworkPolicy tier for the peer: the longest
 * match of each identity the peer has (its own, any peer 0, and for a pod address in a CIDR
 * rule's prefix its by-IP twin) is that identity's first entry (the manager resolved overlaps
 * within an identity); across them the smallest (priority, rule, verdict) wins. Verdict 0:
 * no entry matches. */
static __always_inline struct policy_value tier_entry(__u32 policy_id, struct peer p, __u8 dir,
						      __u8 tier, const struct flow *f)
{
	__u8 direction = dir | (tier << WEFT_POLICY_TIER_SHIFT);
	struct policy_value best = {};
	__u32 best_prec = 0xffffffffu;
	struct policy_value *v = policy_entry(policy_id, p.identity, direction, f);

	if (v && v->verdict) {
		best = *v;
		best_prec = ((__u32)v->priority << 16) | ((__u32)v->rule << 8) | v->verdict;
	}
	v = policy_entry(policy_id, 0, direction, f);
	if (v && v->verdict) {
		__u32 prec = ((__u32)v->priority << 16) | ((__u32)v->rule << 8) | v->verdict;

		if (prec < best_prec) {
			best = *v;
			best_prec = prec;
		}
	}
	if (p.cidr_identity) {
		v = policy_entry(policy_id, p.cidr_identity | WEFT_IDENTITY_BY_IP, direction, f);
		if (v && v->verdict) {
			__u32 prec = ((__u32)v->priority << 16) | ((__u32)v->rule << 8) | v->verdict;

			if (prec < best_prec)
				best = *v;
		}
	}
	return best;
}

/* A tier's final word: 1 when its first matching entry accepts or denies (d says which rule),
 * 0 when no entry matches or it passes (the next layer decides). */
static __always_inline int tier_decides(const struct endpoint_info *ep, struct peer p, __u8 dir,
					__u8 tier, const struct flow *f, struct decision *d)
{
	struct policy_value v = tier_entry(ep->policy_id, p, dir, tier, f);

	if (v.verdict != WEFT_VERDICT_TIER_ACCEPT && v.verdict != WEFT_VERDICT_TIER_DENY)
		return 0;
	d->tier = tier;
	d->rule = v.rule;
	d->priority = v.priority;
	if (v.verdict == WEFT_VERDICT_TIER_ACCEPT)
		d->reason = tier == WEFT_TIER_ADMIN ? WEFT_REASON_ALLOW_ADMIN
						    : WEFT_REASON_ALLOW_BASELINE;
	else
		d->reason = tier == WEFT_TIER_ADMIN ? WEFT_REASON_DROP_ADMIN_DENY
						    : WEFT_REASON_DROP_BASELINE_DENY;
	return 1;
}

/* The flags that make a direction policed at all: enforced, or a tier with entries. */
static __always_inline __u32 policed_flags(__u8 dir)
{
	return dir == WEFT_DIR_EGRESS
		       ? WEFT_EP_EGRESS_ENFORCED | WEFT_EP_ADMIN_EGRESS | WEFT_EP_BASELINE_EGRESS
		       : WEFT_EP_INGRESS_ENFORCED | WEFT_EP_ADMIN_INGRESS | WEFT_EP_BASELINE_INGRESS;
}

/* The verdict for a new flow, layer by layer (docs/DATAPATH.md, "ClusterNetworkPolicy tiers"):
 * the Admin tier (accept or deny is final, pass or no match goes on), the NetworkPolicy layer
 * when the direction is enforced (final: allow, deny or default deny), the Baseline tier
 * (accept or deny), else allow. A tier is looked up only when its flag is set. 1: allow. */
static __always_inline int decide(const struct endpoint_info *ep, struct peer p, __u8 dir,
				  const struct flow *f, struct decision *d)
{
	int egress = dir == WEFT_DIR_EGRESS;

	if ((ep->flags & (egress ? WEFT_EP_ADMIN_EGRESS : WEFT_EP_ADMIN_INGRESS)) &&
	    tier_decides(ep, p, dir, WEFT_TIER_ADMIN, f, d))
		return d->reason == WEFT_REASON_ALLOW_ADMIN;
	if (ep->flags & (egress ? WEFT_EP_EGRESS_ENFORCED : WEFT_EP_INGRESS_ENFORCED)) {
		__u8 verdict = verdict_for(ep, p, dir, f);

		if (verdict == WEFT_VERDICT_ALLOW) {
			d->reason = WEFT_REASON_ALLOW_POLICY;
			return 1;
		}
		d->reason = verdict == WEFT_VERDICT_DENY ? WEFT_REASON_DROP_POLICY_DENY
							 : WEFT_REASON_DROP_POLICY_DEFAULT;
		return 0;
	}
	if ((ep->flags & (egress ? WEFT_EP_BASELINE_EGRESS : WEFT_EP_BASELINE_INGRESS)) &&
	    tier_decides(ep, p, dir, WEFT_TIER_BASELINE, f, d))
		return d->reason == WEFT_REASON_ALLOW_BASELINE;
	d->reason = WEFT_REASON_ALLOW_NOT_ENFORCED;
	return 1;
}

/* A reply of a hairpin flow leaving the pod (to WEFT_LB_HAIRPIN_V4): it belongs to the flow's
 * egress entry, and goes back into the pod from the frontend's address. 1: handled. */
static __always_inline int hairpin_reply(struct __sk_buff *skb, const struct endpoint_info *ep,
					 struct flow *f, __u64 now, struct lb_state *lb)
{
	struct ct_key k = {};

	ct_fill(&k, f, ep->endpoint_id, WEFT_DIR_EGRESS, 1);
	k.direction = WEFT_DIR_EGRESS;
	struct ct_value *cv = bpf_map_lookup_elem(&ct, &k);

	if (!cv || !(cv->flags & WEFT_CT_HAIRPIN) || !ct_alive(cv, f->proto, now))
		return 0;
	__u32 id = cv->rev_nat;

	if (unlikely(f->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
		ct_close(cv, f->tcp_flags, WEFT_CT_CLOSING_REPLY, now);
	if (lb_rewrite(skb, f, 1, ep->ipv4, f->dport) < 0 || lb_reverse(skb, f, id) < 0)
		return -1;
	lb->hairpin = 1;
	return 1;
}

static __always_inline int handle(struct __sk_buff *skb, __u8 dir, struct lb_state *lb)
{
	__u32 ifindex = skb->ifindex;
	struct endpoint_info *ep = bpf_map_lookup_elem(&endpoints, &ifindex);
	__u32 endpoint_id = ep ? ep->endpoint_id : 0;
	__be16 l3 = skb->protocol;

	if (l3 == ETH_P_ARP_BE) {
		count(endpoint_id, dir, WEFT_REASON_PASS_NEIGHBOUR, skb->len);
		return TC_ACT_OK;
	}
	if (l3 != ETH_P_IP_BE && l3 != ETH_P_IPV6_BE) {
		count(endpoint_id, dir, WEFT_REASON_PASS_NOT_IP, skb->len);
		return TC_ACT_OK;
	}
	/* Not (or no longer) an endpoint: a stale attachment must not black-hole traffic. */
	if (!ep)
		return TC_ACT_OK;

	/* Some layer of policy applies to this direction. */
	int policed = (ep->flags & policed_flags(dir)) != 0;
	struct flow f = {};
	int res = l3 == ETH_P_IP_BE ? parse_ipv4(skb, &f) : parse_ipv6(skb, &f);

	if (res == PARSE_NEIGHBOUR) {
		count(endpoint_id, dir, WEFT_REASON_PASS_NEIGHBOUR, skb->len);
		return TC_ACT_OK;
	}
	if (res == PARSE_INVALID) {
		if (!policed) {
			count(endpoint_id, dir, WEFT_REASON_ALLOW_NOT_ENFORCED, skb->len);
			return TC_ACT_OK;
		}
		return drop(skb, ep, dir, WEFT_REASON_DROP_INVALID, &f, 0);
	}

	/* The source address decides the identity other pods see (ipcache): a pod may only send
	 * from its own addresses. IPv6 link-local sources cannot be routed to another pod. */
	if (dir == WEFT_DIR_EGRESS && !source_valid(ep, &f)) {
		return drop(skb, ep, dir, WEFT_REASON_DROP_SPOOFED, &f, 0);
	}

	if (f.frag != FRAG_NONE)
		track_fragment(&f);

	__u64 now = bpf_ktime_get_ns();

	if (dir == WEFT_DIR_EGRESS && f.has_ports) {
		if (unlikely(lb_is_hairpin_addr(&f))) {
			int r = hairpin_reply(skb, ep, &f, now, lb);

			if (r < 0)
				return drop(skb, ep, dir, WEFT_REASON_DROP_INVALID, &f, 0);
			if (r > 0) {
				count(endpoint_id, dir, WEFT_REASON_ALLOW_REPLY, skb->len);
				return TC_ACT_OK;
			}
		}
		if (lb_translate(skb, &f, lb) < 0)
			return drop(skb, ep, dir, WEFT_REASON_DROP_INVALID, &f, 0);
	}
	struct ct_key ck = {};
	struct ct_value *cv;

	ct_fill(&ck, &f, endpoint_id, dir, 0);
	/* The reopen rule: a TCP SYN without ACK starts a connection (TCP never sends one inside
	 * an established one), so it never passes on conntrack, whether an entry for its tuple is
	 * open, closed or absent. It meets the current policy; allowed, it writes the entry afresh
	 * below; denied, it is dropped and the old entry is left to what is left of the old
	 * connection. Costs nothing on other packets: tcp_flags is 0 for every other protocol. */
	if (likely((f.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)) {
		cv = bpf_map_lookup_elem(&ct, &ck);
		if (cv && ct_alive(cv, f.proto, now)) {
			if (unlikely(f.tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
				ct_close(cv, f.tcp_flags, WEFT_CT_CLOSING_ORIG, now);
			count(endpoint_id, dir, WEFT_REASON_ALLOW_ESTABLISHED, skb->len);
			return TC_ACT_OK;
		}
		struct ct_key rk = {};

		ct_fill(&rk, &f, endpoint_id, dir, 1);
		cv = bpf_map_lookup_elem(&ct, &rk);
		if (cv && ct_alive(cv, f.proto, now)) {
			if (unlikely(f.tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
				ct_close(cv, f.tcp_flags, WEFT_CT_CLOSING_REPLY, now);
			/* A reply of a flow the pod opened to a frontend: from the frontend. */
			if ((cv->flags & WEFT_CT_SERVICE) && lb_reverse(skb, &f, cv->rev_nat) < 0)
				return drop(skb, ep, dir, WEFT_REASON_DROP_INVALID, &f, 0);
			count(endpoint_id, dir, WEFT_REASON_ALLOW_REPLY, skb->len);
			return TC_ACT_OK;
		}

		if (f.related && ct_related(&f, endpoint_id, dir)) {
			count(endpoint_id, dir, WEFT_REASON_ALLOW_RELATED, skb->len);
			return TC_ACT_OK;
		}
	}

	__u8 reason = WEFT_REASON_ALLOW_NOT_ENFORCED;

	if (policed) {
		struct peer p = peer_identity(&f, dir == WEFT_DIR_INGRESS ? f.saddr : f.daddr);
		struct decision d = {};

		if (!decide(ep, p, dir, &f, &d))
			return drop_decided(skb, ep, dir, &d, &f, p.identity);
		reason = d.reason;
	}
	/* A hairpin flow never reaches the pod's to_pod program as a new flow: its ingress
	 * policy, for the pod itself as the peer, is judged here by the same layers. */
	if (lb->hairpin && (ep->flags & policed_flags(WEFT_DIR_INGRESS))) {
		struct peer self = peer_identity(&f, f.daddr);
		struct decision d = {};

		if (!decide(ep, self, WEFT_DIR_INGRESS, &f, &d))
			return drop_decided(skb, ep, WEFT_DIR_INGRESS, &d, &f, self.identity);
	}

	/* Track flows even when not enforced, so that replies of connections the pod opened pass
	 * its (possibly enforced) other direction. */
	if (f.has_ports || f.icmp_echo_request) {
		struct ct_value nv = {
			.created_ns = now,
			.last_seen_ns = now,
			.reason = reason,
			.flags = lb->id ? (WEFT_CT_SERVICE | (lb->hairpin ? WEFT_CT_HAIRPIN : 0)) : 0,
			.rev_nat = lb->id,
		};

		bpf_map_update_elem(&ct, &ck, &nv, BPF_ANY);
	}
	count(endpoint_id, dir, reason, skb->len);
	return TC_ACT_OK;
}

SEC("classifier")
int weft_from_pod(struct __sk_buff *skb)
{
	struct lb_state lb = {};
	int r = handle(skb, WEFT_DIR_EGRESS, &lb);

	if (r != TC_ACT_OK || !lb.hairpin)
		return r;
	__u32 ifindex = skb->ifindex;
	struct endpoint_info *ep = bpf_map_lookup_elem(&endpoints, &ifindex);

	return ep ? lb_hairpin_redirect(skb, ep->mac) : TC_ACT_SHOT;
}

SEC("classifier")
int weft_to_pod(struct __sk_buff *skb)
{
	struct lb_state lb = {};

	/* Sent back into the pod by its from_pod program, which judged it. */
	if (skb->mark == WEFT_MARK_HAIRPIN) {
		skb->mark = 0;
		return TC_ACT_OK;
	}
	return handle(skb, WEFT_DIR_INGRESS, &lb);
}

char LICENSE[] SEC("license") = "GPL";
