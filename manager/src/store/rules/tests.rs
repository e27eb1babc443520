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

#[test]
fn a_large_change_is_found_whole_and_leaves_no_record_behind() {
    let store = Store::temporary().unwrap();
    let old = rules("old", 200);
    store.write_rules(2, None, &numbered(&old, 0)).unwrap();
    let stored = store.load_rules().unwrap().unwrap();
    assert_eq!((stored.revision, stored.next), (2, 200));
    assert_eq!(names(&stored), want(&old));

    let new = rules("new", 150);
    store.write_rules(3, None, &numbered(&new, 200)).unwrap();
    let stored = store.load_rules().unwrap().unwrap();
    assert_eq!((stored.revision, stored.next), (3, 350));
    assert_eq!(names(&stored), want(&new));
    assert_eq!(records(&store), 150, "the removed records are deleted");
    assert!(store.dead_rules().unwrap().is_empty());

    // Some removed by number, some added: also in steps (more than CHUNK records).
    let more = rules("more", 70);
    let remove: Vec<u64> = (200..230).collect();
    store
        .write_rules(4, Some(&remove), &numbered(&more, 350))
        .unwrap();
    let stored = store.load_rules().unwrap().unwrap();
    let mut expect = want(&new[30..]);
    expect.extend(want(&more));
    assert_eq!(names(&stored), expect);
    assert_eq!(records(&store), 190);
}

#[test]
fn a_change_stopped_before_its_commit_is_not_found() {
    let store = Store::temporary().unwrap();
    let old = rules("old", 100);
    store.write_rules(2, None, &numbered(&old, 0)).unwrap();
    let new = rules("new", 100);
    // Step 1 only: the process stopped there.
    store.stage_rules(&numbered(&new, 100)).unwrap();
    assert_eq!(records(&store), 200);

    let stored = store.load_rules().unwrap().unwrap();
    assert_eq!(stored.revision, 2);
    assert_eq!(names(&stored), want(&old));
    assert_eq!(
        records(&store),
        100,
        "the load deleted the records not committed"
    );
}

#[test]
fn a_change_stopped_after_its_commit_is_found_and_finished() {
    let store = Store::temporary().unwrap();
    let old = rules("old", 100);
    store.write_rules(2, None, &numbered(&old, 0)).unwrap();
    let new = rules("new", 100);
    let dead: Vec<u64> = (0..100).collect();
    store.stage_rules(&numbered(&new, 100)).unwrap();
    store.commit_rules(3, 200, &dead).unwrap();
    // Part of step 3: the process stopped in the middle of the deletion.
    store.rules.remove(5u64.to_be_bytes()).unwrap();

    let stored = store.load_rules().unwrap().unwrap();
    assert_eq!(stored.revision, 3);
    assert_eq!(names(&stored), want(&new));
    assert_eq!(records(&store), 100, "the load finished the deletion");
    assert!(store.dead_rules().unwrap().is_empty());
}

#[test]
fn a_deletion_left_unfinished_is_finished_before_the_next_change_commits() {
    let store = Store::temporary().unwrap();
    let old = rules("old", 100);
    store.write_rules(2, None, &numbered(&old, 0)).unwrap();
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
    let stored = store.load_rules().unwrap().unwrap();
    let mut expect = want(&new[1..]);
    expect.extend(want(&more));
    assert_eq!(names(&stored), expect);
    assert_eq!(records(&store), 179);
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

    let stored = store.load_rules().unwrap().unwrap();
    assert_eq!((stored.revision, stored.next), (7, 100));
    assert_eq!(names(&stored), want(&old));

    let new = rules("new", 100);
    store.write_rules(8, None, &numbered(&new, 100)).unwrap();
    let stored = store.load_rules().unwrap().unwrap();
    assert_eq!((stored.revision, stored.next), (8, 200));
    assert_eq!(names(&stored), want(&new));
    assert_eq!(records(&store), 100);
}

#[test]
fn a_small_change_is_one_batch_and_moves_next() {
    let store = Store::temporary().unwrap();
    let old = rules("old", 3);
    store.write_rules(2, None, &numbered(&old, 0)).unwrap();
    let one = rules("one", 1);
    store
        .write_rules(3, Some(&[1]), &numbered(&one, 3))
        .unwrap();
    let stored = store.load_rules().unwrap().unwrap();
    assert_eq!((stored.revision, stored.next), (3, 4));
    assert_eq!(names(&stored), ["old0", "old2", "one0"]);
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
