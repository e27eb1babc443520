// SPDX-License-Identifier: Apache-2.0
/*
 * Host program run by build.rs: prints the C layout of every map struct and the values of the
 * shared #defines as Rust source, so the Rust mirror can be checked (sizes/offsets) and the
 * constants have one definition (weft_maps.h).
 */
#include <stddef.h>
#include <stdio.h>

#include "weft_maps.h"

#define SIZE(s) printf("    (\"%s\", \"\", %zu),\n", #s, sizeof(struct s))
#define FIELD(s, f) printf("    (\"%s\", \"%s\", %zu),\n", #s, #f, offsetof(struct s, f))
#define CONST(ty, name) printf("/// `%s` from `weft_maps.h`.\npub const %s: %s = %llu;\n", #name, &(#name)[5], #ty, (unsigned long long)(name))

int main(void)
{
	CONST(u8, WEFT_DIR_INGRESS);
	CONST(u8, WEFT_DIR_EGRESS);
	CONST(u32, WEFT_EP_INGRESS_ENFORCED);
	CONST(u32, WEFT_EP_EGRESS_ENFORCED);
	CONST(u32, WEFT_EP_HAS_IPV4);
	CONST(u32, WEFT_EP_HAS_IPV6);
	CONST(u32, WEFT_EP_ADMIN_INGRESS);
	CONST(u32, WEFT_EP_ADMIN_EGRESS);
	CONST(u32, WEFT_EP_BASELINE_INGRESS);
	CONST(u32, WEFT_EP_BASELINE_EGRESS);
	CONST(u8, WEFT_FAMILY_V4);
	CONST(u8, WEFT_FAMILY_V6);
	CONST(u32, WEFT_IPCACHE_FIXED_PREFIX);
	CONST(u32, WEFT_IDENTITY_BY_IP);
	CONST(u32, WEFT_POLICY_FIXED_PREFIX);
	CONST(u32, WEFT_POLICY_PROTO_PREFIX);
	CONST(u32, WEFT_POLICY_FULL_PREFIX);
	CONST(u32, WEFT_POLICY_LIST_FIXED_PREFIX);
	CONST(u32, WEFT_POLICY_LIST_FULL_PREFIX);
	CONST(u8, WEFT_TIER_POLICY);
	CONST(u8, WEFT_TIER_ADMIN);
	CONST(u8, WEFT_TIER_BASELINE);
	CONST(u8, WEFT_POLICY_TIER_SHIFT);
	CONST(u8, WEFT_POLICY_DIR_MASK);
	CONST(u8, WEFT_VERDICT_ALLOW);
	CONST(u8, WEFT_VERDICT_DENY);
	CONST(u8, WEFT_VERDICT_TIER_DENY);
	CONST(u8, WEFT_VERDICT_TIER_PASS);
	CONST(u8, WEFT_VERDICT_TIER_ACCEPT);
	CONST(u8, WEFT_REASON_ALLOW_POLICY);
	CONST(u8, WEFT_REASON_ALLOW_NOT_ENFORCED);
	CONST(u8, WEFT_REASON_ALLOW_ESTABLISHED);
	CONST(u8, WEFT_REASON_ALLOW_REPLY);
	CONST(u8, WEFT_REASON_PASS_NEIGHBOUR);
	CONST(u8, WEFT_REASON_PASS_NOT_IP);
	CONST(u8, WEFT_REASON_DROP_POLICY_DENY);
	CONST(u8, WEFT_REASON_DROP_POLICY_DEFAULT);
	CONST(u8, WEFT_REASON_DROP_INVALID);
	CONST(u8, WEFT_REASON_ALLOW_RELATED);
	CONST(u8, WEFT_REASON_DROP_SPOOFED);
	CONST(u8, WEFT_REASON_ALLOW_ADMIN);
	CONST(u8, WEFT_REASON_DROP_ADMIN_DENY);
	CONST(u8, WEFT_REASON_ALLOW_BASELINE);
	CONST(u8, WEFT_REASON_DROP_BASELINE_DENY);
	CONST(u8, WEFT_REASON_MAX);
	CONST(u8, WEFT_CT_CLOSING_ORIG);
	CONST(u8, WEFT_CT_CLOSING_REPLY);
	CONST(u8, WEFT_CT_CLOSED);
	CONST(u8, WEFT_CT_SERVICE);
	CONST(u8, WEFT_CT_HAIRPIN);
	CONST(u32, WEFT_LB_HAIRPIN_V4);
	CONST(u64, WEFT_CT_LIFETIME_TCP_S);
	CONST(u64, WEFT_CT_LIFETIME_OTHER_S);
	CONST(u64, WEFT_CT_CLOSE_TIMEOUT_S);
	CONST(usize, WEFT_DROP_EVENT_BASE_SIZE);

	printf("/// (struct, field or \"\" for sizeof, offset or size) as the C compiler laid them out.\n");
	printf("pub const C_LAYOUT: &[(&str, &str, usize)] = &[\n");
	SIZE(endpoint_info);
	FIELD(endpoint_info, endpoint_id);
	FIELD(endpoint_info, identity);
	FIELD(endpoint_info, flags);
	FIELD(endpoint_info, policy_id);
	FIELD(endpoint_info, mac);
	FIELD(endpoint_info, ipv4);
	FIELD(endpoint_info, ipv6);
	SIZE(ipcache_key);
	FIELD(ipcache_key, family);
	FIELD(ipcache_key, addr);
	SIZE(ipcache_value);
	FIELD(ipcache_value, identity);
	FIELD(ipcache_value, cidr_identity);
	SIZE(policy_key);
	FIELD(policy_key, policy_id);
	FIELD(policy_key, identity);
	FIELD(policy_key, direction);
	FIELD(policy_key, proto);
	FIELD(policy_key, dport);
	SIZE(policy_pair_key);
	FIELD(policy_pair_key, policy_id);
	FIELD(policy_pair_key, identity);
	FIELD(policy_pair_key, direction);
	FIELD(policy_pair_key, pad);
	SIZE(policy_list_key);
	FIELD(policy_list_key, list_id);
	FIELD(policy_list_key, pad);
	FIELD(policy_list_key, proto);
	FIELD(policy_list_key, dport);
	SIZE(policy_value);
	FIELD(policy_value, verdict);
	FIELD(policy_value, rule);
	FIELD(policy_value, priority);
	SIZE(ct_key);
	FIELD(ct_key, saddr);
	FIELD(ct_key, daddr);
	FIELD(ct_key, sport);
	FIELD(ct_key, dport);
	FIELD(ct_key, endpoint_id);
	FIELD(ct_key, proto);
	FIELD(ct_key, direction);
	FIELD(ct_key, family);
	SIZE(ct_value);
	FIELD(ct_value, created_ns);
	FIELD(ct_value, last_seen_ns);
	FIELD(ct_value, reason);
	FIELD(ct_value, flags);
	FIELD(ct_value, rev_nat);
	SIZE(lb_key);
	FIELD(lb_key, addr);
	FIELD(lb_key, port);
	FIELD(lb_key, proto);
	FIELD(lb_key, family);
	SIZE(lb_service);
	FIELD(lb_service, id);
	FIELD(lb_service, count);
	SIZE(lb_backend_key);
	FIELD(lb_backend_key, id);
	FIELD(lb_backend_key, slot);
	SIZE(lb_addr);
	FIELD(lb_addr, addr);
	FIELD(lb_addr, port);
	FIELD(lb_addr, family);
	FIELD(lb_addr, proto);
	SIZE(lb_flow_key);
	FIELD(lb_flow_key, saddr);
	FIELD(lb_flow_key, daddr);
	FIELD(lb_flow_key, sport);
	FIELD(lb_flow_key, dport);
	FIELD(lb_flow_key, proto);
	FIELD(lb_flow_key, family);
	SIZE(lb_flow);
	FIELD(lb_flow, backend);
	FIELD(lb_flow, slot);
	SIZE(frag_key);
	FIELD(frag_key, saddr);
	FIELD(frag_key, daddr);
	FIELD(frag_key, id);
	FIELD(frag_key, proto);
	FIELD(frag_key, family);
	SIZE(frag_value);
	FIELD(frag_value, sport);
	FIELD(frag_value, dport);
	FIELD(frag_value, policy_port);
	FIELD(frag_value, has_ports);
	SIZE(metrics_key);
	FIELD(metrics_key, endpoint_id);
	FIELD(metrics_key, direction);
	FIELD(metrics_key, reason);
	SIZE(metrics_value);
	FIELD(metrics_value, packets);
	FIELD(metrics_value, bytes);
	SIZE(drop_event);
	FIELD(drop_event, ts_ns);
	FIELD(drop_event, endpoint_id);
	FIELD(drop_event, ifindex);
	FIELD(drop_event, src_identity);
	FIELD(drop_event, dst_identity);
	FIELD(drop_event, direction);
	FIELD(drop_event, reason);
	FIELD(drop_event, family);
	FIELD(drop_event, proto);
	FIELD(drop_event, sport);
	FIELD(drop_event, dport);
	FIELD(drop_event, saddr);
	FIELD(drop_event, daddr);
	FIELD(drop_event, tier);
	FIELD(drop_event, rule);
	FIELD(drop_event, priority);
	printf("];\n");
	return 0;
}
