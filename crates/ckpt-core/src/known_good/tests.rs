use super::*;

fn t(secs: i64) -> Timestamp {
    Timestamp(secs * 1000)
}

fn id(name: &str) -> PodId {
    PodId::new("kube-system", name)
}

/// `name:hash@secs` entries.
fn map(entries: &[(&str, &str, i64)]) -> BTreeMap<PodId, SpecSince> {
    (entries.iter())
        .map(|(n, h, s)| {
            let entry = SpecSince {
                spec_hash: (*h).to_owned(),
                since: t(*s),
            };
            (id(n), entry)
        })
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<PodId> {
    names.iter().map(|n| id(n)).collect()
}

/// What one pass sees.
struct Pass<'a> {
    known_good: &'a [(&'a str, &'a str, i64)],
    ready_since: &'a [(&'a str, &'a str, i64)],
    desired: &'a [(&'a str, &'a str)],
    ready: &'a [&'a str],
    kept: &'a [&'a str],
    synced: bool,
    now: i64,
}

/// What it leaves: the known-good and ready-since maps and the next look (seconds).
struct Expected<'a> {
    known_good: &'a [(&'a str, &'a str, i64)],
    ready_since: &'a [(&'a str, &'a str, i64)],
    next: Option<i64>,
}

fn check(what: &str, pass: Pass<'_>, expected: Expected<'_>) {
    let desired: BTreeMap<PodId, String> = (pass.desired.iter())
        .map(|(n, h)| (id(n), (*h).to_owned()))
        .collect();
    let tracked = track(
        &map(pass.known_good),
        &map(pass.ready_since),
        &desired,
        &set(pass.ready),
        &set(pass.kept),
        pass.synced,
        t(pass.now),
    );
    let want = Tracked {
        known_good: map(expected.known_good),
        ready_since: map(expected.ready_since),
        next: expected.next.map(t),
    };
    assert_eq!(tracked, want, "{what}");
}

#[test]
fn content_is_proven_by_a_minute_of_readiness_on_synced_views() {
    let base = Pass {
        known_good: &[],
        ready_since: &[],
        desired: &[("a", "h1")],
        ready: &["a"],
        kept: &["a"],
        synced: true,
        now: 100,
    };
    check(
        "the first Ready pass starts a streak, and asks to look again when it is due",
        Pass { ..base },
        Expected {
            known_good: &[],
            ready_since: &[("a", "h1", 100)],
            next: Some(160),
        },
    );
    check(
        "Ready for less than a minute: not yet",
        Pass {
            ready_since: &[("a", "h1", 100)],
            now: 159,
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[("a", "h1", 100)],
            next: Some(160),
        },
    );
    check(
        "Ready for a minute proves it",
        Pass {
            ready_since: &[("a", "h1", 100)],
            now: 160,
            ..base
        },
        Expected {
            known_good: &[("a", "h1", 160)],
            ready_since: &[],
            next: None,
        },
    );
    check(
        "not Ready breaks the streak",
        Pass {
            ready_since: &[("a", "h1", 100)],
            ready: &[],
            now: 130,
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[],
            next: None,
        },
    );
    check(
        "new content starts its own streak; the proof of the old one stays",
        Pass {
            known_good: &[("a", "h1", 50)],
            ready_since: &[("a", "h1", 10)],
            desired: &[("a", "h2")],
            ..base
        },
        Expected {
            known_good: &[("a", "h1", 50)],
            ready_since: &[("a", "h2", 100)],
            next: Some(160),
        },
    );
    check(
        "proven content needs no streak",
        Pass {
            known_good: &[("a", "h1", 50)],
            ..base
        },
        Expected {
            known_good: &[("a", "h1", 50)],
            ready_since: &[],
            next: None,
        },
    );
    check(
        "not synced: nothing is proven, nothing broken",
        Pass {
            ready_since: &[("a", "h1", 100)],
            desired: &[],
            ready: &[],
            synced: false,
            now: 500,
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[("a", "h1", 100)],
            next: None,
        },
    );
    check(
        "a removed checkpoint's proof and streak go with it",
        Pass {
            known_good: &[("a", "h1", 50), ("b", "h9", 50)],
            ready_since: &[("b", "h9", 90)],
            desired: &[("a", "h1")],
            kept: &["a"],
            ..base
        },
        Expected {
            known_good: &[("a", "h1", 50)],
            ready_since: &[],
            next: None,
        },
    );
    check(
        "two streaks: look again when the first is due",
        Pass {
            ready_since: &[("a", "h1", 90), ("b", "h2", 70)],
            desired: &[("a", "h1"), ("b", "h2")],
            ready: &["a", "b"],
            kept: &["a", "b"],
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[("a", "h1", 90), ("b", "h2", 70)],
            next: Some(130),
        },
    );
}

#[test]
fn ready_means_running_with_the_ready_condition_true() {
    let pod = |phase: &str, ready: &str| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "status": { "phase": phase, "conditions": [
                { "type": "PodScheduled", "status": "True" },
                { "type": "Ready", "status": ready }
            ] }
        }))
        .expect("a pod")
    };
    assert!(is_ready(&pod("Running", "True")));
    assert!(!is_ready(&pod("Running", "False")));
    assert!(!is_ready(&pod("Pending", "True")));
    assert!(!is_ready(&k8s_openapi::api::core::v1::Pod::default()));
}

/// The module's example, once a doctest (`track` is internal to the crate now).
#[test]
fn a_minute_of_readiness_proves_the_content() {
    let id = PodId::new("kube-system", "kube-apiserver-x7k2p");
    let desired = BTreeMap::from([(id.clone(), "h1".to_owned())]);
    let ready = BTreeSet::from([id.clone()]);
    let kept = BTreeSet::from([id.clone()]);
    let t0 = Timestamp(0);
    let first = track(
        &BTreeMap::new(),
        &BTreeMap::new(),
        &desired,
        &ready,
        &kept,
        true,
        t0,
    );
    assert!(first.known_good.is_empty());
    assert_eq!(first.next, Some(t0.saturating_add(KNOWN_GOOD_AFTER)));
    let later = t0.saturating_add(KNOWN_GOOD_AFTER);
    let second = track(
        &first.known_good,
        &first.ready_since,
        &desired,
        &ready,
        &kept,
        true,
        later,
    );
    assert_eq!(second.known_good[&id].spec_hash, "h1");
}
