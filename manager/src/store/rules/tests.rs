use super::*;
use weft_policy::labels::{Label, LabelSet};
use weft_policy::selector::Selector;

fn rule(name: &str) -> Rule {
    let labels: LabelSet = [Label::new("unspec", "rule", name)].into_iter().collect();
    Rule::new(Selector::all(), labels)
}

fn rules(prefix: &str, n: usize) -> Vec<Rule> {
    (0..n).map(|i| rule(&format!("{prefix}{i}"))).collect()
}

/// `rules` numbered from `from`.
fn numbered(rules: &[Rule], from: u64) -> Vec<(u64, &Rule)> {
    rules.iter().zip(from..).map(|(r, s)| (s, r)).collect()
}

fn names(stored: &StoredRules) -> Vec<String> {
    stored
        .rules
        .iter()
        .map(|(_, r)| r.labels.iter().map(|l| l.value.clone()).collect())
        .collect()
}

fn want(rules: &[Rule]) -> Vec<String> {
    rules
        .iter()
        .map(|r| r.labels.iter().map(|l| l.value.clone()).collect())
        .collect()
}

/// Every record under a sequence number, committed or not.
fn records(store: &Store) -> usize {
    store.rule_seqs().unwrap().len()
}

/// A store holding `n` rules named `old0`.. at revision 2, numbered from 0.
fn store_with_old(n: usize) -> (Store, Vec<Rule>) {
    let store = Store::temporary().unwrap();
    let old = rules("old", n);
    store.write_rules(2, None, &numbered(&old, 0)).unwrap();
    (store, old)
}

/// Loads the rules and checks they are `parts` in order at `revision`, and that the load left
/// exactly their records (nothing uncommitted, nothing dead).
fn loads(store: &Store, revision: u64, parts: &[&[Rule]]) -> StoredRules {
    let stored = store.load_rules().unwrap().unwrap();
    let expect: Vec<String> = parts.iter().flat_map(|p| want(p)).collect();
    assert_eq!(stored.revision, revision);
    assert_eq!(names(&stored), expect);
    assert_eq!(
        records(store),
        expect.len(),
        "only the loaded records are left"
    );
    assert!(store.dead_rules().unwrap().is_empty());
    stored
}

#[test]
fn a_large_change_is_found_whole_and_leaves_no_record_behind() {
    let (store, old) = store_with_old(200);
    assert_eq!(loads(&store, 2, &[&old]).next, 200);

    let new = rules("new", 150);
    store.write_rules(3, None, &numbered(&new, 200)).unwrap();
    assert_eq!(loads(&store, 3, &[&new]).next, 350);

    // Some removed by number, some added: also in steps (more than CHUNK records).
    let more = rules("more", 70);
    let remove: Vec<u64> = (200..230).collect();
    store
        .write_rules(4, Some(&remove), &numbered(&more, 350))
        .unwrap();
    loads(&store, 4, &[&new[30..], &more]);
}

#[test]
fn a_change_stopped_before_its_commit_is_not_found() {
    let (store, old) = store_with_old(100);
    let new = rules("new", 100);
    // Step 1 only: the process stopped there.
    store.stage_rules(&numbered(&new, 100)).unwrap();
    assert_eq!(records(&store), 200);

    // The load deleted the records not committed.
    loads(&store, 2, &[&old]);
}

#[test]
fn a_change_stopped_after_its_commit_is_found_and_finished() {
    let (store, _) = store_with_old(100);
    let new = rules("new", 100);
    let dead: Vec<u64> = (0..100).collect();
    store.stage_rules(&numbered(&new, 100)).unwrap();
    store.commit_rules(3, 200, &dead).unwrap();
    // Part of step 3: the process stopped in the middle of the deletion.
    store.rules.remove(5u64.to_be_bytes()).unwrap();

    loads(&store, 3, &[&new]);
}

#[test]
fn a_deletion_left_unfinished_is_finished_before_the_next_change_commits() {
    let (store, _) = store_with_old(100);
    let new = rules("new", 100);
    store.stage_rules(&numbered(&new, 100)).unwrap();
    store
        .commit_rules(3, 200, &(0..100).collect::<Vec<_>>())
        .unwrap();
    // The same process goes on (the deletion failed): the next change's own list of dead
    // records must not bring the first one's back.
    let more = rules("more", 80);
    store
        .write_rules(4, Some(&[100]), &numbered(&more, 200))
        .unwrap();
    loads(&store, 4, &[&new[1..], &more]);
}

#[test]
fn a_store_of_an_earlier_version_loads_and_takes_a_whole_change() {
    let store = Store::temporary().unwrap();
    // As versions before the steps wrote it: records and a revision, no next.
    let old = rules("old", 100);
    let mut batch = sled::Batch::default();
    for (seq, r) in numbered(&old, 0) {
        batch.insert(&seq.to_be_bytes(), encode("a rule", r).unwrap());
    }
    batch.insert(REVISION, &7u64.to_be_bytes());
    store.rules.apply_batch(batch).unwrap();

    assert_eq!(loads(&store, 7, &[&old]).next, 100);

    let new = rules("new", 100);
    store.write_rules(8, None, &numbered(&new, 100)).unwrap();
    assert_eq!(loads(&store, 8, &[&new]).next, 200);
}

#[test]
fn a_small_change_is_one_batch_and_moves_next() {
    let (store, old) = store_with_old(3);
    let one = rules("one", 1);
    store
        .write_rules(3, Some(&[1]), &numbered(&one, 3))
        .unwrap();
    let stored = loads(&store, 3, &[&old[..1], &old[2..], &one]);
    assert_eq!(stored.next, 4);
}

#[test]
fn nothing_committed_is_none_and_its_records_go() {
    let store = Store::temporary().unwrap();
    assert!(store.load_rules().unwrap().is_none());
    store.stage_rules(&numbered(&rules("new", 10), 0)).unwrap();
    assert!(store.load_rules().unwrap().is_none());
    assert_eq!(records(&store), 0);
}

#[test]
fn a_corrupt_list_of_dead_records_is_refused_naming_it() {
    let store = Store::temporary().unwrap();
    store
        .write_rules(2, None, &numbered(&rules("old", 2), 0))
        .unwrap();
    store.rules.insert(DEAD, &[1u8, 2, 3][..]).unwrap();
    let err = store.load_rules().unwrap_err().to_string();
    assert!(err.contains("rules/dead"), "{err}");
}
