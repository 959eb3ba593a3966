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

/// A parent's content in a pass: its spec hash is its two parts' hashes side by side.
#[derive(Clone, Copy)]
struct Content<'a> {
    read_at_start: &'a str,
    updated_in_place: &'a str,
    uid: &'a str,
    /// When its containers started (earliest, latest), if all did.
    started: Option<(i64, i64)>,
}

/// Content wholly read at start, as every parent's was before content parts: its spec
/// hash is `hash`.
const fn spec(hash: &str) -> Content<'_> {
    Content {
        read_at_start: hash,
        updated_in_place: "",
        uid: "u1",
        started: None,
    }
}

/// Content in two parts, of pod `u1`, its containers started at `started`.
const fn parts<'a>(
    read_at_start: &'a str,
    updated_in_place: &'a str,
    started: Option<(i64, i64)>,
) -> Content<'a> {
    Content {
        read_at_start,
        updated_in_place,
        uid: "u1",
        started,
    }
}

/// A journal record: `(name, uid, read at start, since, updated in place, since)`.
type Seen<'a> = (&'a str, &'a str, &'a str, Option<i64>, &'a str, Option<i64>);

fn seen(entries: &[Seen<'_>]) -> BTreeMap<PodId, ContentSeen> {
    (entries.iter())
        .map(|(n, uid, start, start_since, in_place, in_place_since)| {
            let record = ContentSeen {
                uid: Some((*uid).to_owned()),
                read_at_start: (*start).to_owned(),
                read_at_start_since: start_since.map(t),
                updated_in_place: (*in_place).to_owned(),
                updated_in_place_since: in_place_since.map(t),
            };
            (id(n), record)
        })
        .collect()
}

/// What one pass sees.
#[derive(Clone, Copy)]
struct Pass<'a> {
    known_good: &'a [(&'a str, &'a str, i64)],
    ready_since: &'a [(&'a str, &'a str, i64)],
    seen: &'a [Seen<'a>],
    contents: &'a [(&'a str, Content<'a>)],
    ready: &'a [&'a str],
    kept: &'a [&'a str],
    synced: bool,
    now: i64,
}

/// What it leaves: the known-good and ready-since maps, the content records (`None`: not
/// looked at) and the next look (seconds).
struct Expected<'a> {
    known_good: &'a [(&'a str, &'a str, i64)],
    ready_since: &'a [(&'a str, &'a str, i64)],
    seen: Option<&'a [Seen<'a>]>,
    next: Option<i64>,
}

fn check(what: &str, pass: Pass<'_>, expected: Expected<'_>) {
    let contents: BTreeMap<PodId, ParentContent> = (pass.contents.iter())
        .map(|(n, c)| {
            let content = ParentContent {
                spec_hash: format!("{}{}", c.read_at_start, c.updated_in_place),
                parts: ContentParts {
                    read_at_start: c.read_at_start.to_owned(),
                    updated_in_place: c.updated_in_place.to_owned(),
                },
                uid: Some(c.uid.to_owned()),
                started: c.started.map(|(earliest, latest)| Started {
                    earliest: t(earliest),
                    latest: t(latest),
                }),
            };
            (id(n), content)
        })
        .collect();
    let before = Proofs {
        known_good: map(pass.known_good),
        ready_since: map(pass.ready_since),
        content_seen: seen(pass.seen),
    };
    let tracked = track(
        &before,
        &contents,
        &set(pass.ready),
        &set(pass.kept),
        pass.synced,
        t(pass.now),
    );
    let proofs = &tracked.proofs;
    assert_eq!(proofs.known_good, map(expected.known_good), "{what}: known-good");
    assert_eq!(
        proofs.ready_since,
        map(expected.ready_since),
        "{what}: ready since"
    );
    if let Some(records) = expected.seen {
        assert_eq!(proofs.content_seen, seen(records), "{what}: content seen");
    }
    assert_eq!(tracked.next, expected.next.map(t), "{what}: next look");
}

#[test]
fn content_is_proven_by_a_minute_of_readiness_on_synced_views() {
    let base = Pass {
        known_good: &[],
        ready_since: &[],
        seen: &[],
        contents: &[("a", spec("h1"))],
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
            seen: None,
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
            seen: None,
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
            seen: None,
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
            seen: None,
            next: None,
        },
    );
    check(
        "new content starts its own streak; the proof of the old one stays",
        Pass {
            known_good: &[("a", "h1", 50)],
            ready_since: &[("a", "h1", 10)],
            contents: &[("a", spec("h2"))],
            ..base
        },
        Expected {
            known_good: &[("a", "h1", 50)],
            ready_since: &[("a", "h2", 100)],
            seen: None,
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
            seen: None,
            next: None,
        },
    );
    check(
        "not synced: nothing is proven, nothing broken",
        Pass {
            ready_since: &[("a", "h1", 100)],
            contents: &[],
            ready: &[],
            synced: false,
            now: 500,
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[("a", "h1", 100)],
            seen: None,
            next: None,
        },
    );
    check(
        "a removed checkpoint's proof and streak go with it",
        Pass {
            known_good: &[("a", "h1", 50), ("b", "h9", 50)],
            ready_since: &[("b", "h9", 90)],
            contents: &[("a", spec("h1"))],
            kept: &["a"],
            ..base
        },
        Expected {
            known_good: &[("a", "h1", 50)],
            ready_since: &[],
            seen: None,
            next: None,
        },
    );
    check(
        "two streaks: look again when the first is due",
        Pass {
            ready_since: &[("a", "h1", 90), ("b", "h2", 70)],
            contents: &[("a", spec("h1")), ("b", spec("h2"))],
            ready: &["a", "b"],
            kept: &["a", "b"],
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[("a", "h1", 90), ("b", "h2", 70)],
            seen: None,
            next: Some(130),
        },
    );
}

/// The module's example, once a doctest (`track` is internal to the crate now).
#[test]
fn a_minute_of_readiness_proves_the_content() {
    let id = PodId::new("kube-system", "kube-apiserver-x7k2p");
    let content = ParentContent {
        spec_hash: "h1".to_owned(),
        parts: ContentParts::default(),
        uid: Some("u1".to_owned()),
        started: None,
    };
    let contents = BTreeMap::from([(id.clone(), content)]);
    let ready = BTreeSet::from([id.clone()]);
    let kept = BTreeSet::from([id.clone()]);
    let t0 = Timestamp(0);
    let first = track(&Proofs::default(), &contents, &ready, &kept, true, t0);
    assert!(first.proofs.known_good.is_empty());
    assert_eq!(first.next, Some(t0.saturating_add(KNOWN_GOOD_AFTER)));
    let later = t0.saturating_add(KNOWN_GOOD_AFTER);
    let second = track(&first.proofs, &contents, &ready, &kept, true, later);
    assert_eq!(second.proofs.known_good[&id].spec_hash, "h1");
}

/// Issue 36: a Secret/ConfigMap volume rotated under a running pod is proven by readiness
/// only once the kubelet could have written it: from the rotation plus
/// [`KUBELET_SYNC_ALLOWANCE`] (150 s), then a minute (so 100 → 310).
#[test]
fn content_updated_in_place_is_proven_after_the_kubelet_could_sync_it() {
    let base = Pass {
        known_good: &[("a", "s1v1", 50)],
        ready_since: &[],
        seen: &[("a", "u1", "s1", None, "v1", None)],
        contents: &[("a", parts("s1", "v2", Some((0, 0))))],
        ready: &["a"],
        kept: &["a"],
        synced: true,
        now: 100,
    };
    let rotated: &[Seen<'_>] = &[("a", "u1", "s1", None, "v2", Some(100))];
    check(
        "the rotation is seen: its time is recorded, the proof is due after the allowance and a minute",
        base,
        Expected {
            known_good: &[("a", "s1v1", 50)],
            ready_since: &[("a", "s1v2", 100)],
            seen: Some(rotated),
            next: Some(310),
        },
    );
    // Was proven at 160: the pod was Ready, but maybe still with the old files.
    check(
        "Ready for more than a minute, within the allowance: not yet",
        Pass {
            ready_since: &[("a", "s1v2", 100)],
            seen: rotated,
            now: 250,
            ..base
        },
        Expected {
            known_good: &[("a", "s1v1", 50)],
            ready_since: &[("a", "s1v2", 100)],
            seen: Some(rotated),
            next: Some(310),
        },
    );
    check(
        "a minute Ready after the allowance proves it",
        Pass {
            ready_since: &[("a", "s1v2", 100)],
            seen: rotated,
            now: 310,
            ..base
        },
        Expected {
            known_good: &[("a", "s1v2", 310)],
            ready_since: &[],
            seen: Some(rotated),
            next: None,
        },
    );
    check(
        "a streak begun after the allowance counts from itself",
        Pass {
            ready_since: &[("a", "s1v2", 300)],
            seen: rotated,
            now: 320,
            ..base
        },
        Expected {
            known_good: &[("a", "s1v1", 50)],
            ready_since: &[("a", "s1v2", 300)],
            seen: Some(rotated),
            next: Some(360),
        },
    );
    check(
        "a restart does not hurry it: the kubelet's sync is what the volume waits for",
        Pass {
            ready_since: &[("a", "s1v2", 100)],
            seen: rotated,
            contents: &[("a", parts("s1", "v2", Some((120, 120))))],
            now: 250,
            ..base
        },
        Expected {
            known_good: &[("a", "s1v1", 50)],
            ready_since: &[("a", "s1v2", 100)],
            seen: Some(rotated),
            next: Some(310),
        },
    );
}

/// Issue 36: a change to what containers read at start (a Secret in `env`, a ConfigMap
/// mounted with `subPath`, the spec: one hash, [`ContentParts::read_at_start`]) under a
/// running pod is proven only by readiness once every container started after it was seen.
#[test]
fn content_read_at_start_is_proven_only_by_containers_started_after_it() {
    let base = Pass {
        known_good: &[("a", "s1v1", 50)],
        ready_since: &[],
        seen: &[("a", "u1", "s1", None, "v1", None)],
        contents: &[("a", parts("s2", "v1", Some((0, 0))))],
        ready: &["a"],
        kept: &["a"],
        synced: true,
        now: 100,
    };
    let rotated: &[Seen<'_>] = &[("a", "u1", "s2", Some(100), "v1", None)];
    let unproven = Expected {
        known_good: &[("a", "s1v1", 50)],
        ready_since: &[("a", "s2v1", 100)],
        seen: Some(rotated),
        next: None,
    };
    check(
        "the rotation is seen: its time is recorded, the streak kept, nothing is due",
        base,
        Expected { ..unproven },
    );
    // Was proven at 160 with the containers still running the old environment.
    check(
        "Ready for ten minutes with the containers from before: never",
        Pass {
            ready_since: &[("a", "s2v1", 100)],
            seen: rotated,
            now: 700,
            ..base
        },
        Expected { ..unproven },
    );
    check(
        "one container restarted since, another not: not yet",
        Pass {
            ready_since: &[("a", "s2v1", 100)],
            seen: rotated,
            contents: &[("a", parts("s2", "v1", Some((50, 400))))],
            now: 700,
            ..base
        },
        Expected { ..unproven },
    );
    check(
        "a container not running: not yet",
        Pass {
            ready_since: &[("a", "s2v1", 100)],
            seen: rotated,
            contents: &[("a", parts("s2", "v1", None))],
            now: 700,
            ..base
        },
        Expected { ..unproven },
    );
    let restarted = Pass {
        ready_since: &[("a", "s2v1", 100)],
        seen: rotated,
        contents: &[("a", parts("s2", "v1", Some((400, 420))))],
        now: 450,
        ..base
    };
    check(
        "every container started since: a minute from the last start is due",
        restarted,
        Expected {
            next: Some(480),
            ..unproven
        },
    );
    check(
        "and proves it",
        Pass {
            now: 480,
            ..restarted
        },
        Expected {
            known_good: &[("a", "s2v1", 480)],
            ready_since: &[],
            seen: Some(rotated),
            next: None,
        },
    );
    check(
        "a container started before the change was seen (same pass) does not count",
        Pass {
            seen: &[("a", "u1", "s1", None, "v1", None)],
            contents: &[("a", parts("s2", "v1", Some((99, 99))))],
            ..base
        },
        Expected { ..unproven },
    );
    let both: &[Seen<'_>] = &[("a", "u1", "s2", Some(100), "v2", Some(100))];
    check(
        "both parts changed: the later of the last start and the sync allowance",
        Pass {
            ready_since: &[("a", "s2v2", 100)],
            seen: both,
            contents: &[("a", parts("s2", "v2", Some((130, 130))))],
            now: 300,
            ..base
        },
        Expected {
            known_good: &[("a", "s1v1", 50)],
            ready_since: &[("a", "s2v2", 100)],
            seen: Some(both),
            next: Some(310),
        },
    );
}

/// The content a pod has when the agent first sees it counts as read at start by its
/// containers (as before content parts); the records follow the kept checkpoints.
#[test]
fn a_pods_first_content_counts_as_read_at_start() {
    let base = Pass {
        known_good: &[],
        ready_since: &[],
        seen: &[],
        contents: &[("a", parts("s1", "v1", None))],
        ready: &["a"],
        kept: &["a"],
        synced: true,
        now: 100,
    };
    let first: &[Seen<'_>] = &[("a", "u1", "s1", None, "v1", None)];
    check(
        "first sighting: no times recorded, a minute Ready proves it",
        base,
        Expected {
            known_good: &[],
            ready_since: &[("a", "s1v1", 100)],
            seen: Some(first),
            next: Some(160),
        },
    );
    check(
        "another pod of the same name (another UID) is a first sighting",
        Pass {
            seen: &[("a", "u0", "s0", Some(10), "v0", Some(10))],
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[("a", "s1v1", 100)],
            seen: Some(first),
            next: Some(160),
        },
    );
    check(
        "unchanged content keeps its times (and what they prove from: 20 + 150 s)",
        Pass {
            seen: &[("a", "u1", "s1", Some(10), "v1", Some(20))],
            contents: &[("a", parts("s1", "v1", Some((30, 40))))],
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[("a", "s1v1", 100)],
            seen: Some(&[("a", "u1", "s1", Some(10), "v1", Some(20))]),
            next: Some(230),
        },
    );
    check(
        "not synced: the records stay",
        Pass {
            seen: &[("a", "u1", "s1", Some(10), "v1", None)],
            contents: &[],
            ready: &[],
            synced: false,
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[],
            seen: Some(&[("a", "u1", "s1", Some(10), "v1", None)]),
            next: None,
        },
    );
    check(
        "a parent not sanitized in this pass keeps its record: seeing it again is no first sighting",
        Pass {
            seen: &[("a", "u1", "s1", Some(10), "v1", None)],
            contents: &[],
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[],
            seen: Some(&[("a", "u1", "s1", Some(10), "v1", None)]),
            next: None,
        },
    );
    check(
        "a removed checkpoint's record goes with it",
        Pass {
            seen: &[
                ("a", "u1", "s1", None, "v1", None),
                ("b", "u2", "s1", Some(10), "v1", None),
            ],
            ..base
        },
        Expected {
            known_good: &[],
            ready_since: &[("a", "s1v1", 100)],
            seen: Some(first),
            next: Some(160),
        },
    );
}

#[test]
fn containers_started_needs_every_container_started() {
    fn check(what: &str, status: serde_json::Value, expected: Option<(i64, i64)>) {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "spec": {
                "initContainers": [{ "name": "init" }],
                "containers": [{ "name": "a" }, { "name": "b" }]
            },
            "status": status
        }))
        .expect("a pod");
        let expected = expected.map(|(earliest, latest)| Started {
            earliest: t(earliest),
            latest: t(latest),
        });
        assert_eq!(containers_started(&pod), expected, "{what}");
    }
    let running = |at: &str| serde_json::json!({ "running": { "startedAt": at } });
    let done = |at: &str| serde_json::json!({ "terminated": { "exitCode": 0, "startedAt": at } });
    let waiting = serde_json::json!({ "waiting": { "reason": "CrashLoopBackOff" } });
    let status = |init: serde_json::Value, a: serde_json::Value, b: serde_json::Value| {
        serde_json::json!({
            "initContainerStatuses": [{ "name": "init", "state": init, "ready": true, "restartCount": 0, "image": "", "imageID": "" }],
            "containerStatuses": [
                { "name": "a", "state": a, "ready": true, "restartCount": 0, "image": "", "imageID": "" },
                { "name": "b", "state": b, "ready": true, "restartCount": 0, "image": "", "imageID": "" }
            ]
        })
    };
    let cases = [
        (
            "all started: the init container's run is the earliest, the last container's start the latest",
            status(
                done("1970-01-01T00:00:10Z"),
                running("1970-01-01T00:00:20Z"),
                running("1970-01-01T00:00:30Z"),
            ),
            Some((10, 30)),
        ),
        (
            "a container waiting",
            status(
                done("1970-01-01T00:00:10Z"),
                running("1970-01-01T00:00:20Z"),
                waiting.clone(),
            ),
            None,
        ),
        (
            "a finished run of a (non-init) container does not count",
            status(
                done("1970-01-01T00:00:10Z"),
                running("1970-01-01T00:00:20Z"),
                done("1970-01-01T00:00:30Z"),
            ),
            None,
        ),
        (
            "an init container without a start",
            status(
                waiting.clone(),
                running("1970-01-01T00:00:20Z"),
                running("1970-01-01T00:00:30Z"),
            ),
            None,
        ),
        (
            "no container statuses",
            serde_json::json!({ "phase": "Running" }),
            None,
        ),
    ];
    for (what, status, expected) in cases {
        check(what, status, expected);
    }
}
