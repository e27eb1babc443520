/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Service translation (docs/DATAPATH.md, "Services"), as Cilium's bpf_lxc does it: a pod's
 * TCP or UDP packet to a frontend (a Service's ClusterIP, port and protocol) gets one of the
 * frontend's backends as destination before conntrack and egress policy, so the pod's policy
 * judges the pod it really reaches; the flow's conntrack entry keeps the frontend's id, and the
 * replies get the frontend's address back as their source on their way into the pod. A pod's
 * connection to its own Service (hairpin) also gets WEFT_LB_HAIRPIN_V4 as its source and is
 * turned back into the pod by this program, both ways, without crossing the node's stack.
 * Frontends without backends, SCTP and IPv6 hairpin are left to kube-proxy.
 */
#ifndef WEFT_LB_H
#define WEFT_LB_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "weft_maps.h"
#include "parse.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_key);
	__type(value, struct lb_service);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_backend_key);
	__type(value, struct lb_addr);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb_addr);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_flow_key);
	__type(value, struct lb_flow);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_flows SEC(".maps");

/* skb->mark of a hairpin packet this program sent back into its pod: the pod's own policy
 * judged it already (a pod's packets arrive with mark 0: veth scrubs it across namespaces). */
#define WEFT_MARK_HAIRPIN 0x57ef4850u

#define IP4_CSUM_OFF (ETH_HLEN + 10)
#define IP4_SADDR_OFF (ETH_HLEN + 12)
#define IP4_DADDR_OFF (ETH_HLEN + 16)
#define IP6_SADDR_OFF (ETH_HLEN + 8)
#define IP6_DADDR_OFF (ETH_HLEN + 24)

/* What the translation did to a packet (handle() fills it, the program acts on it). */
struct lb_state {
	/* The frontend's id (lb_revnat) when the packet was translated from a frontend. */
	__u32 id;
	/* Send the packet back into the pod it came from (a hairpin flow, either way). */
	__u8 hairpin;
};

/* WEFT_LB_HAIRPIN_V4 written by stores: an initializer would land in .rodata, and the object has
 * no global data for the loader to create. */
static __always_inline void lb_hairpin_addr(__u8 *a)
{
	__u32 v4 = bpf_htonl(WEFT_LB_HAIRPIN_V4);

	__builtin_memset(a, 0, 16);
	__builtin_memcpy(a, &v4, 4);
}

static __always_inline int l4_csum_off(const struct flow *f)
{
	if (f->proto == IPPROTO_TCP)
		return f->l4_off + 16;
	if (f->proto == IPPROTO_UDP)
		return f->l4_off + 6;
	return -1;
}

/* Rewrites the packet's destination (dst) or source address and port, checksums included, and
 * the flow with it. Later fragments have no L4 header: only their address changes. */
static __always_inline int lb_rewrite(struct __sk_buff *skb, struct flow *f, int dst,
				      const __u8 *addr, __be16 port)
{
	int csum = f->frag == FRAG_LATER ? -1 : l4_csum_off(f);
	__u32 l4_flags = f->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__u8 *old = dst ? f->daddr : f->saddr;
	__be16 *old_port = dst ? &f->dport : &f->sport;
	__s64 diff;

	if (f->family == WEFT_FAMILY_V4) {
		diff = bpf_csum_diff((__be32 *)old, 4, (__be32 *)addr, 4, 0);
		if (bpf_l3_csum_replace(skb, IP4_CSUM_OFF, 0, diff, 0) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, dst ? IP4_DADDR_OFF : IP4_SADDR_OFF, addr, 4, 0) < 0)
			return -1;
		__builtin_memcpy(old, addr, 4);
	} else {
		diff = bpf_csum_diff((__be32 *)old, 16, (__be32 *)addr, 16, 0);
		if (bpf_skb_store_bytes(skb, dst ? IP6_DADDR_OFF : IP6_SADDR_OFF, addr, 16, 0) < 0)
			return -1;
		__builtin_memcpy(old, addr, 16);
	}
	if (csum >= 0 && bpf_l4_csum_replace(skb, csum, 0, diff, BPF_F_PSEUDO_HDR | l4_flags) < 0)
		return -1;
	if (port == *old_port || f->frag == FRAG_LATER)
		return 0;
	if (csum >= 0 && bpf_l4_csum_replace(skb, csum, *old_port, port, l4_flags | sizeof(port)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, f->l4_off + (dst ? 2 : 0), &port, sizeof(port), 0) < 0)
		return -1;
	*old_port = port;
	if (dst)
		f->policy_port = port;
	return 0;
}

static __always_inline int lb_same(const struct lb_addr *a, const struct lb_addr *b)
{
	return __builtin_memcmp(a->addr, b->addr, 16) == 0 && a->port == b->port &&
	       a->family == b->family;
}

/* A pod's packet to a frontend: destination translated to the flow's backend (and, for a
 * hairpin flow, source to WEFT_LB_HAIRPIN_V4). Returns 0 (not translated: no frontend, or left
 * to kube-proxy), 1 (translated, lb filled) or -1 (the packet could not be rewritten). */
static __always_inline int lb_translate(struct __sk_buff *skb, struct flow *f, struct lb_state *lb)
{
	if (!f->has_ports || (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP))
		return 0;
	struct lb_key k = { .port = f->dport, .proto = f->proto, .family = f->family };

	__builtin_memcpy(k.addr, f->daddr, 16);
	struct lb_service *svc = bpf_map_lookup_elem(&lb_services, &k);

	if (!svc || !svc->count)
		return 0;
	__u32 id = svc->id;
	struct lb_flow_key fk = {
		.sport = f->sport,
		.dport = f->dport,
		.proto = f->proto,
		.family = f->family,
	};

	__builtin_memcpy(fk.saddr, f->saddr, 16);
	__builtin_memcpy(fk.daddr, f->daddr, 16);
	struct lb_backend_key bk = { .id = id };
	struct lb_addr be;
	struct lb_flow *fl = 0;
	struct lb_addr *cur = 0;

	/* A TCP SYN opens a new connection: it chooses afresh, like every flow not seen yet. */
	if ((f->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
		fl = bpf_map_lookup_elem(&lb_flows, &fk);
	if (fl) {
		bk.slot = fl->slot;
		cur = bpf_map_lookup_elem(&lb_backends, &bk);
		/* Its backend left the frontend (or its slot now holds another): choose again. */
		if (cur && !lb_same(cur, &fl->backend))
			cur = 0;
	}
	if (!cur) {
		bk.slot = bpf_get_prandom_u32() % svc->count;
		cur = bpf_map_lookup_elem(&lb_backends, &bk);
		if (!cur)
			return 0;
		struct lb_flow nf = { .backend = *cur, .slot = bk.slot };

		bpf_map_update_elem(&lb_flows, &fk, &nf, BPF_ANY);
	}
	be = *cur;
	if (be.family != f->family)
		return 0;
	int hairpin = __builtin_memcmp(be.addr, f->saddr, 16) == 0;

	if (hairpin && f->family != WEFT_FAMILY_V4)
		return 0;
	if (lb_rewrite(skb, f, 1, be.addr, be.port) < 0)
		return -1;
	__u8 hairpin_src[16];

	lb_hairpin_addr(hairpin_src);
	if (hairpin && lb_rewrite(skb, f, 0, hairpin_src, f->sport) < 0)
		return -1;
	lb->id = id;
	lb->hairpin = hairpin;
	return 1;
}

/* A reply of a translated flow entering the client pod: the frontend's address and port as
 * its source again. The frontend gone, the reply goes as it is (its connection is over). */
static __always_inline int lb_reverse(struct __sk_buff *skb, struct flow *f, __u32 id)
{
	struct lb_addr *fe = bpf_map_lookup_elem(&lb_revnat, &id);

	if (!fe || fe->family != f->family)
		return 0;
	return lb_rewrite(skb, f, 0, fe->addr, fe->port);
}

static __always_inline int lb_is_hairpin_addr(const struct flow *f)
{
	__u8 h[16];

	lb_hairpin_addr(h);
	return f->family == WEFT_FAMILY_V4 && __builtin_memcmp(f->daddr, h, 4) == 0;
}

/* Sends a hairpin packet back into its pod: out of the host veth it came in by, the pod's MAC
 * as destination and the host side's (the packet's destination until now) as source. */
static __always_inline int lb_hairpin_redirect(struct __sk_buff *skb, const __u8 *pod_mac)
{
	__u8 host_mac[6];

	if (bpf_skb_load_bytes(skb, 0, host_mac, sizeof(host_mac)) < 0 ||
	    bpf_skb_store_bytes(skb, 0, pod_mac, 6, 0) < 0 ||
	    bpf_skb_store_bytes(skb, 6, host_mac, sizeof(host_mac), 0) < 0)
		return TC_ACT_SHOT;
	skb->mark = WEFT_MARK_HAIRPIN;
	return bpf_redirect(skb->ifindex, 0);
}

#endif /* WEFT_LB_H */
