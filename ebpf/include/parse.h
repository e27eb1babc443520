/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Packet parsing into a flow tuple. Uses bpf_skb_load_bytes rather than direct packet access:
 * it copes with headers outside the linear area (GSO packets on veth) and keeps the verifier
 * happy with the variable IPv4/IPv6 header lengths without re-checking data_end at every step.
 */
#ifndef WEFT_PARSE_H
#define WEFT_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "weft_maps.h"

#define IPV6_MAX_EXT_HEADERS 4

#ifndef IPPROTO_ICMPV6
#define IPPROTO_ICMPV6 58
#endif
#define NEXTHDR_HOP 0
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH 51
#define NEXTHDR_DEST 60

#define ICMP_ECHOREPLY 0
#define ICMP_ECHO 8
#define ICMPV6_ECHO_REQUEST 128
#define ICMPV6_ECHO_REPLY 129
#define MLD_LISTENER_QUERY 130
#define MLD_LISTENER_DONE 132
#define MLD2_LISTENER_REPORT 143
#define NDISC_ROUTER_SOLICITATION 133
#define NDISC_NEIGHBOUR_ADVERTISEMENT 136

enum parse_result {
	PARSE_OK = 0,
	PARSE_NEIGHBOUR,
	PARSE_INVALID,
};

struct flow {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	/* Port used for the policy lookup: dport for TCP/UDP/SCTP, the type for ICMP. */
	__be16 policy_port;
	__u8 proto;
	__u8 family;
	/* ICMP echo request: may create a ct entry. */
	__u8 icmp_echo_request;
	/* TCP/UDP/SCTP: may create a ct entry. */
	__u8 has_ports;
	/* TCP: the flags byte (TCP_FLAG_*); 0 for every other protocol and for later fragments. */
	__u8 tcp_flags;
	/* Part of a fragmented datagram (0 = not fragmented, 1 = first, 2 = later). */
	__u8 frag;
	/* Offset of the L4 header (0: none parsed). */
	__u16 l4_off;
	__u32 frag_id;
	/* ICMP error about a TCP/UDP/SCTP packet: the tuple of that (inner) packet. */
	__u8 related;
	__u8 inner_proto;
	__be16 inner_sport;
	__be16 inner_dport;
	__u8 inner_saddr[16];
	__u8 inner_daddr[16];
};

/* TCP header flags (the 14th byte of the header). */
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define FRAG_NONE 0
#define FRAG_FIRST 1
#define FRAG_LATER 2

/* ICMP errors quote the header of the packet that caused them (RFC 792, RFC 4443 §2.4): parse
 * that quoted packet so conntrack can relate the error to its flow (PMTU discovery, port
 * unreachable, traceroute). Best effort: an unparseable quote just leaves the error unrelated. */
static __always_inline void parse_icmp_error(struct __sk_buff *skb, __u32 off, struct flow *f)
{
	__be16 ports[2];
	__u32 l4;

	if (f->family == WEFT_FAMILY_V4) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0 || ip.ihl < 5)
			return;
		f->inner_proto = ip.protocol;
		__builtin_memcpy(f->inner_saddr, &ip.saddr, 4);
		__builtin_memcpy(f->inner_daddr, &ip.daddr, 4);
		l4 = off + ip.ihl * 4;
	} else {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
			return;
		f->inner_proto = ip6.nexthdr;
		__builtin_memcpy(f->inner_saddr, &ip6.saddr, 16);
		__builtin_memcpy(f->inner_daddr, &ip6.daddr, 16);
		l4 = off + sizeof(ip6);
	}
	if (f->inner_proto != IPPROTO_TCP && f->inner_proto != IPPROTO_UDP &&
	    f->inner_proto != IPPROTO_SCTP)
		return;
	if (bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0)
		return;
	f->inner_sport = ports[0];
	f->inner_dport = ports[1];
	f->related = 1;
}

static __always_inline int is_icmp_error(__u8 proto, __u8 type)
{
	if (proto == IPPROTO_ICMP)
		return type == 3 || type == 11 || type == 12; /* unreachable, time exceeded, param */
	return type >= 1 && type <= 4; /* unreachable, too big, time exceeded, param problem */
}

static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, struct flow *f, int first_frag)
{
	/* Later fragments carry no L4 header: they are matched with ports 0. */
	if (!first_frag)
		return PARSE_OK;
	f->l4_off = off;

	switch (f->proto) {
	case IPPROTO_TCP: {
		/* Ports, sequence and acknowledgement numbers, data offset, flags: one load. A first
		 * fragment too short to hold the flags is invalid (RFC 1858's tiny fragments). */
		struct {
			__be16 sport;
			__be16 dport;
			__be32 seq;
			__be32 ack_seq;
			__u8 doff;
			__u8 flags;
		} tcp;

		if (bpf_skb_load_bytes(skb, off, &tcp, sizeof(tcp)) < 0)
			return PARSE_INVALID;
		f->sport = tcp.sport;
		f->dport = tcp.dport;
		f->policy_port = tcp.dport;
		f->tcp_flags = tcp.flags;
		f->has_ports = 1;
		return PARSE_OK;
	}
	case IPPROTO_UDP:
	case IPPROTO_SCTP: {
		__be16 ports[2];

		if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
			return PARSE_INVALID;
		f->sport = ports[0];
		f->dport = ports[1];
		f->policy_port = ports[1];
		f->has_ports = 1;
		return PARSE_OK;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		/* type, code, checksum, then (echo) identifier and sequence. */
		__u8 hdr[8];

		if (bpf_skb_load_bytes(skb, off, hdr, sizeof(hdr)) < 0)
			return PARSE_INVALID;
		__u8 type = hdr[0];
		__be16 id;

		__builtin_memcpy(&id, &hdr[4], sizeof(id));

		/* Link-local control that IPv6 cannot work without: NDP (RS, RA, NS, NA) and MLD
		 * (queries/reports the kernel sends on every interface). Never subject to policy. */
		if (f->proto == IPPROTO_ICMPV6 &&
		    ((type >= NDISC_ROUTER_SOLICITATION && type <= NDISC_NEIGHBOUR_ADVERTISEMENT) ||
		     (type >= MLD_LISTENER_QUERY && type <= MLD_LISTENER_DONE) ||
		     type == MLD2_LISTENER_REPORT))
			return PARSE_NEIGHBOUR;
		f->policy_port = bpf_htons(type);
		if ((f->proto == IPPROTO_ICMP && type == ICMP_ECHO) ||
		    (f->proto == IPPROTO_ICMPV6 && type == ICMPV6_ECHO_REQUEST)) {
			f->sport = id;
			f->icmp_echo_request = 1;
		} else if ((f->proto == IPPROTO_ICMP && type == ICMP_ECHOREPLY) ||
			   (f->proto == IPPROTO_ICMPV6 && type == ICMPV6_ECHO_REPLY)) {
			f->dport = id;
		} else if (is_icmp_error(f->proto, type)) {
			parse_icmp_error(skb, off + 8, f);
		}
		return PARSE_OK;
	}
	default:
		return PARSE_OK;
	}
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct flow *f)
{
	struct iphdr ip;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return PARSE_INVALID;
	if (ip.ihl < 5)
		return PARSE_INVALID;
	f->family = WEFT_FAMILY_V4;
	f->proto = ip.protocol;
	__builtin_memcpy(f->saddr, &ip.saddr, 4);
	__builtin_memcpy(f->daddr, &ip.daddr, 4);
	int first_frag = (ip.frag_off & bpf_htons(0x1fff)) == 0;

	/* More-fragments flag or a non-zero offset: part of a fragmented datagram. */
	if (ip.frag_off & bpf_htons(0x3fff)) {
		f->frag = first_frag ? FRAG_FIRST : FRAG_LATER;
		f->frag_id = bpf_ntohs(ip.id);
	}

	return parse_l4(skb, ETH_HLEN + ip.ihl * 4, f, first_frag);
}

static __always_inline int parse_ipv6(struct __sk_buff *skb, struct flow *f)
{
	struct ipv6hdr ip6;
	__u32 off = ETH_HLEN + sizeof(ip6);
	int first_frag = 1;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
		return PARSE_INVALID;
	f->family = WEFT_FAMILY_V6;
	__builtin_memcpy(f->saddr, &ip6.saddr, 16);
	__builtin_memcpy(f->daddr, &ip6.daddr, 16);
	__u8 nexthdr = ip6.nexthdr;

	/* Bounded walk over the extension headers a pod commonly emits; anything else is the
	 * L4 protocol as far as policy is concerned. */
#pragma unroll
	for (int i = 0; i < IPV6_MAX_EXT_HEADERS; i++) {
		__u8 ext[2];

		if (nexthdr != NEXTHDR_HOP && nexthdr != NEXTHDR_ROUTING && nexthdr != NEXTHDR_DEST &&
		    nexthdr != NEXTHDR_FRAGMENT && nexthdr != NEXTHDR_AUTH)
			break;
		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
			return PARSE_INVALID;
		if (nexthdr == NEXTHDR_FRAGMENT) {
			/* next header, reserved, offset+flags, identification */
			struct {
				__u8 nexthdr;
				__u8 reserved;
				__be16 frag_off;
				__be32 id;
			} fh;

			if (bpf_skb_load_bytes(skb, off, &fh, sizeof(fh)) < 0)
				return PARSE_INVALID;
			first_frag = (fh.frag_off & bpf_htons(0xfff8)) == 0;
			f->frag = first_frag ? FRAG_FIRST : FRAG_LATER;
			f->frag_id = bpf_ntohl(fh.id);
			off += 8;
		} else if (nexthdr == NEXTHDR_AUTH) {
			off += (ext[1] + 2) * 4;
		} else {
			off += (ext[1] + 1) * 8;
		}
		nexthdr = ext[0];
	}
	f->proto = nexthdr;
	return parse_l4(skb, off, f, first_frag);
}

#endif /* WEFT_PARSE_H */
