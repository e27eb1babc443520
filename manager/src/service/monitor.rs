//! `weftctl monitor`: naming the `ClusterNetworkPolicy` behind a tier drop. The datapath's event
//! names the rule by tier, priority and index (all the policy map holds); the repository knows
//! which object's rule that is.

use std::collections::BTreeSet;
use weft_policy::labels::{keys, source};
use weft_policy::mapstate::{Direction, Tier};
use weft_policy::rule::Rule;

use super::Manager;
use crate::datapath::DropEvent;

impl Manager {
    /// Fills in `ev.policy` for an `admin-deny` or `baseline-deny` event: the policies with a
    /// rule of that tier, priority, direction and index (more than one only when two policies
    /// of a tier share a priority). Takes the state lock briefly, and only for tier drops while
    /// a monitor is running.
    pub fn name_tier_drop(&self, ev: &mut DropEvent) {
        let Some(t) = ev.tier_rule else {
            return;
        };
        let tier = match t.tier {
            "Admin" => Tier::Admin,
            "Baseline" => Tier::Baseline,
            _ => return,
        };
        let direction = if ev.direction == "egress" {
            Direction::Egress
        } else {
            Direction::Ingress
        };
        let st = self.state();
        let names: BTreeSet<String> = st
            .pol
            .repo()
            .rules()
            .iter()
            .filter(|r| {
                r.tier.as_ref().is_some_and(|tr| {
                    (tr.tier, tr.priority, tr.direction, tr.index)
                        == (tier, t.priority, direction, t.rule)
                })
            })
            .map(|r| rule_name(r))
            .collect();
        if !names.is_empty() {
            ev.policy = Some(names.into_iter().collect::<Vec<_>>().join(", "));
        }
    }
}

/// `<policy name>` or `<policy name>/<rule name>` (the labels when the rule has no name label).
fn rule_name(r: &Rule) -> String {
    let policy = r
        .labels
        .values_of(source::ANY, keys::POLICY_NAME)
        .next()
        .map_or_else(|| r.labels.to_string(), str::to_owned);
    match r.tier.as_ref().map(|t| t.name.as_str()) {
        Some(name) if !name.is_empty() => format!("{policy}/{name}"),
        _ => policy,
    }
}

#[cfg(test)]
mod tests {
    use crate::datapath::{DropEvent, FakeDatapath};
    use crate::service::tests::support::fake_manager;
    use std::sync::Arc;
    use weft_ebpf as abi;
    use weft_policy::labels::{Label, LabelSet, keys, source};
    use weft_policy::mapstate::{Direction, Tier, TierAction};
    use weft_policy::rule::{Rule, TierRule};
    use weft_policy::selector::Selector;

    fn tier_rule(name: &str, priority: u16, index: u8, rule_name: &str) -> Rule {
        let labels: LabelSet = [Label::new(source::K8S, keys::POLICY_NAME, name)]
            .into_iter()
            .collect();
        let mut r = Rule::new(Selector::all(), labels);
        r.tier = Some(TierRule {
            tier: Tier::Admin,
            priority,
            direction: Direction::Ingress,
            index,
            action: TierAction::Deny,
            name: rule_name.into(),
        });
        r
    }

    fn event(reason: u8, tier: u8, priority: u16, rule: u8) -> DropEvent {
        DropEvent::from(&abi::DropEvent {
            direction: abi::DIR_INGRESS,
            reason,
            family: abi::FAMILY_V4,
            tier,
            priority,
            rule,
            ..Default::default()
        })
    }

    #[test]
    fn a_tier_drop_names_the_policy_with_that_rule() {
        let m = fake_manager(Arc::default(), Arc::new(FakeDatapath::default()));
        m.state()
            .pol
            .add_rules(vec![
                tier_rule("block-ssh", 10, 1, "ssh"),
                tier_rule("other", 10, 0, ""),
                tier_rule("later", 20, 1, ""),
            ])
            .unwrap();
        let mut ev = event(abi::REASON_DROP_ADMIN_DENY, abi::TIER_ADMIN, 10, 1);
        m.name_tier_drop(&mut ev);
        assert_eq!(ev.policy.as_deref(), Some("block-ssh/ssh"));
        assert!(
            ev.to_string()
                .ends_with("priority 10 rule 1 (block-ssh/ssh)"),
            "{ev}"
        );
        // No rule there (or not a tier drop): nothing named.
        let mut ev = event(abi::REASON_DROP_ADMIN_DENY, abi::TIER_ADMIN, 30, 1);
        m.name_tier_drop(&mut ev);
        assert_eq!(ev.policy, None);
        let mut ev = event(abi::REASON_DROP_BASELINE_DENY, abi::TIER_BASELINE, 10, 1);
        m.name_tier_drop(&mut ev);
        assert_eq!(ev.policy, None, "the rule is an Admin one");
        let mut ev = event(abi::REASON_DROP_POLICY_DEFAULT, 0, 0, 0);
        m.name_tier_drop(&mut ev);
        assert_eq!(ev.policy, None);
    }
}
