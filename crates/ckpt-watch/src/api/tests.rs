//! `ApiWatch` against the fake API server.

use std::time::{Duration, Instant};

use ckpt_core::ANNOTATION_CHECKPOINT;
use ckpt_core::{NamespaceAllowList, PodId};

use super::*;
use crate::testkit::{FakeApi, Reply, Seen, pod_json, status_body, wait_until, within};

const NODE: &str = "node-1";

fn config(namespaces: &[&str]) -> ApiWatchConfig {
    ApiWatchConfig {
        probe_interval: Duration::from_millis(20),
        probe_timeout: Duration::from_millis(100),
        unreachable_after: 2,
        request_timeout: Duration::from_secs(5),
        ..ApiWatchConfig::new(NODE, NamespaceAllowList::new(namespaces.iter().copied()))
    }
}

async fn wait_state(api: &ApiWatch, state: ApiState) {
    wait_until(5, &format!("state {state:?}"), api.subscribe(), || {
        api.state() == state
    })
    .await;
}

fn is_list(ns: &str) -> impl Fn(&Seen) -> bool + '_ {
    move |s| s.path == format!("/api/v1/namespaces/{ns}/pods") && !s.is_watch()
}

fn is_watch(ns: &str) -> impl Fn(&Seen) -> bool + '_ {
    move |s| s.path == format!("/api/v1/namespaces/{ns}/pods") && s.is_watch()
}

fn is_probe(s: &Seen) -> bool {
    s.path == "/readyz"
}

#[tokio::test]
async fn one_node_scoped_watch_per_namespace_and_synced_only_after_every_list() {
    let (client, fake, _server) = FakeApi::start();
    fake.set_objects("pods", "a", vec![pod_json("a", "plain", NODE, &[])]);
    fake.set_objects(
        "pods",
        "b",
        vec![pod_json("b", "parent", NODE, &[(ANNOTATION_CHECKPOINT, "true")])],
    );
    // b's first list hangs: a alone is not enough to be synced.
    fake.set_list("pods", "b", Reply::Hang);
    let api = ApiWatch::spawn(
        client,
        ApiWatchConfig {
            request_timeout: Duration::from_millis(300),
            ..config(&["a", "b"])
        },
    );
    wait_until(5, "namespace a synced", api.subscribe(), || {
        api.snapshot().namespaces["a"].synced
    })
    .await;
    fake.wait_requests(1, "b's list", is_list("b")).await;
    assert_eq!(api.state(), ApiState::Reachable, "b has not listed yet");
    assert!(api.snapshot().synced_at.is_none());

    // b's list is retried after the request timeout; this time it answers.
    fake.set_list("pods", "b", Reply::Normal);
    wait_state(&api, ApiState::Synced).await;
    assert_eq!(fake.count(is_list("b")), 2, "the hung list was retried once");
    let snap = api.snapshot();
    assert!(snap.synced_at.is_some());
    assert_eq!(snap.last_error, None);
    assert_eq!(
        snap.pods.keys().cloned().collect::<Vec<_>>(),
        vec![PodId::new("a", "plain"), PodId::new("b", "parent")]
    );
    // Which of them are parents is ckpt-core's business (`decide`); the pods arrive whole.
    assert_eq!(
        snap.pods[&PodId::new("b", "parent")].metadata.uid.as_deref(),
        Some("uid-parent")
    );

    // The requests: namespaced, node-scoped, then a watch from the list's version.
    for ns in ["a", "b"] {
        fake.wait_requests(1, "a watch", is_watch(ns)).await;
        for s in fake.log().iter().filter(|s| s.path.ends_with("/pods")) {
            assert!(s.query.contains("fieldSelector=spec.nodeName%3Dnode-1"), "{s:?}");
        }
        let watch = fake.log().into_iter().find(is_watch(ns)).expect("watch");
        assert!(watch.query.contains("resourceVersion="), "{watch:?}");
    }
    assert_eq!(
        fake.count(|s| s.path.starts_with("/api/v1/pods")),
        0,
        "never a cluster-wide list"
    );
}

#[tokio::test]
async fn pod_events_update_the_snapshot_and_notify() {
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(client, config(&["a"]));
    wait_state(&api, ApiState::Synced).await;
    fake.wait_requests(1, "the watch", is_watch("a")).await;
    let mut rx = api.subscribe();
    rx.borrow_and_update();

    let mut pod = pod_json("a", "new", NODE, &[(ANNOTATION_CHECKPOINT, "true")]);
    pod["metadata"]["resourceVersion"] = fake.next_rv().into();
    assert_eq!(fake.push_event("pods", "a", "ADDED", &pod), 1);
    within(5, "a notification", rx.changed())
        .await
        .expect("sender alive");
    wait_until(5, "the new pod", api.subscribe(), || {
        api.snapshot().pods.contains_key(&PodId::new("a", "new"))
    })
    .await;

    pod["metadata"]["resourceVersion"] = fake.next_rv().into();
    fake.push_event("pods", "a", "DELETED", &pod);
    wait_until(5, "the pod gone", api.subscribe(), || {
        api.snapshot().pods.is_empty()
    })
    .await;
    assert_eq!(api.state(), ApiState::Synced);
    assert_eq!(fake.count(is_list("a")), 1, "events need no relist");
}

#[tokio::test]
async fn a_forbidden_list_is_reachable_not_synced_with_the_missing_rule() {
    let (client, fake, _server) = FakeApi::start();
    fake.set_list("pods", "kube-system", Reply::Status(403));
    let api = ApiWatch::spawn(client, config(&["kube-system"]));
    wait_until(5, "the 403 reported", api.subscribe(), || {
        api.snapshot().last_error.is_some()
    })
    .await;
    let snap = api.snapshot();
    // Issue 36: forbidden every namespace it watches, the credentials serve no better than
    // rejected ones (the agent hands its lock over if it lasts); it was `Reachable`.
    assert_eq!(snap.state, ApiState::Unauthorized, "a 403 proves the API is up");
    let error = snap.last_error.unwrap();
    assert!(
        error.starts_with("forbidden: needs list and watch on pods in namespace kube-system"),
        "{error}"
    );
    assert_eq!(
        snap.namespaces["kube-system"].error.as_deref(),
        Some(error.as_str())
    );
    assert!(!snap.namespaces["kube-system"].synced);

    // RBAC warms up: the next retry lists.
    fake.set_list("pods", "kube-system", Reply::Normal);
    wait_state(&api, ApiState::Synced).await;
    assert_eq!(api.snapshot().last_error, None);
    assert_eq!(api.snapshot().outages, 0);
}

#[tokio::test]
async fn a_watch_error_unsyncs_and_relists() {
    let (client, fake, _server) = FakeApi::start();
    fake.set_objects("pods", "a", vec![pod_json("a", "p", NODE, &[])]);
    let api = ApiWatch::spawn(client, config(&["a"]));
    wait_state(&api, ApiState::Synced).await;
    fake.wait_requests(1, "the watch", is_watch("a")).await;

    assert_eq!(
        fake.push_event(
            "pods",
            "a",
            "ERROR",
            &status_body(500, "etcdserver: leader changed")
        ),
        1
    );
    wait_until(5, "the watch error reported", api.subscribe(), || {
        api.state() == ApiState::Reachable
    })
    .await;
    let error = api.snapshot().last_error.expect("an error");
    assert!(error.contains("etcdserver: leader changed"), "{error}");
    assert_eq!(
        api.snapshot().pods.len(),
        1,
        "the last view is kept while relisting"
    );

    wait_state(&api, ApiState::Synced).await;
    assert_eq!(fake.count(is_list("a")), 2, "a fresh list after the error");

    // A refused watch start is an error too.
    fake.set_watch("pods", "a", Reply::Status(500));
    fake.push_event("pods", "a", "ERROR", &status_body(500, "again"));
    fake.wait_requests(1, "a refused watch", |s| is_watch("a")(s))
        .await;
    wait_until(5, "the refused watch reported", api.subscribe(), || {
        api.state() == ApiState::Reachable
    })
    .await;
    assert_eq!(
        api.snapshot().outages,
        0,
        "failed requests never mean unreachable"
    );
}

/// Lists allowed, every watch refused: each list used to reset the backoff, so the pods
/// were listed again every 250 ms (18 lists in 3 s) for as long as it lasted.
#[tokio::test]
async fn a_refused_watch_after_each_list_backs_off_all_the_same() {
    let (client, fake, _server) = FakeApi::start();
    fake.set_objects("pods", "a", vec![pod_json("a", "p", NODE, &[])]);
    fake.set_watch("pods", "a", Reply::Status(500));
    let api = ApiWatch::spawn(client, config(&["a"]));
    fake.wait_requests(1, "the first list", is_list("a")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Delays of at least 125, 250, 500 and 1000 ms (jittered 250 ms doubling): 5 lists.
    let lists = fake.count(is_list("a"));
    assert!((3..=5).contains(&lists), "{lists} lists in 3 s");
    assert_eq!(api.snapshot().outages, 0);
}

#[tokio::test]
async fn probe_failures_make_it_unreachable_with_hysteresis_and_recovery_relists() {
    let (client, fake, _server) = FakeApi::start();
    // One failure at a time never flaps the state.
    fake.script_readyz([Reply::Status(503), Reply::Normal].into_iter().cycle().take(12));
    let api = ApiWatch::spawn(client, config(&["a"]));
    wait_state(&api, ApiState::Synced).await;
    fake.wait_requests(13, "the scripted probes", is_probe).await;
    assert_eq!(
        api.snapshot().outages,
        0,
        "single failed probes never make it unreachable"
    );
    assert_eq!(api.state(), ApiState::Synced);

    // Two in a row do.
    fake.set_readyz(Reply::Status(503));
    wait_state(&api, ApiState::Unreachable).await;
    let snap = api.snapshot();
    assert_eq!(snap.outages, 1);
    assert_eq!(snap.synced_at, None);
    assert!(
        snap.last_error.as_deref().unwrap_or("").contains("503"),
        "{snap:?}"
    );

    // No list or watch while unreachable: only probes.
    let pod_requests = fake.count(|s| s.path.ends_with("/pods"));
    let probes = fake.count(is_probe);
    fake.wait_requests(probes + 5, "more probes", is_probe).await;
    assert_eq!(fake.count(|s| s.path.ends_with("/pods")), pod_requests);

    // Back: reachable at once, synced only after a fresh list.
    let lists = fake.count(is_list("a"));
    fake.set_readyz(Reply::Normal);
    wait_state(&api, ApiState::Synced).await;
    assert_eq!(
        fake.count(is_list("a")),
        lists + 1,
        "a fresh list after the outage"
    );
    assert_eq!(api.snapshot().outages, 1);
}

#[tokio::test]
async fn a_probe_answered_after_one_that_got_none_restarts_the_watches() {
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(client, config(&["a"]));
    let relists = api.relists();
    wait_state(&api, ApiState::Synced).await;
    let lists = fake.count(is_list("a"));

    // A 5xx is an answer: the connection works, the watches stay.
    fake.script_readyz([Reply::Status(503)]);
    let probes = fake.count(is_probe);
    fake.wait_requests(probes + 3, "probes past the 503", is_probe)
        .await;
    assert!(!relists.has_changed().expect("the sender lives"));
    assert_eq!(fake.count(is_list("a")), lists, "no relist after a 503");

    // One probe without an answer (not an outage), then one with: the watches' connections
    // may be as silent as the probe's was, and they start over with a fresh list.
    fake.script_readyz([Reply::Hang]);
    wait_until(5, "a fresh list", fake.requests(), || {
        fake.count(is_list("a")) > lists
    })
    .await;
    assert!(relists.has_changed().expect("the sender lives"));
    wait_state(&api, ApiState::Synced).await;
    assert_eq!(api.snapshot().outages, 0, "one lost probe is no outage");
    assert_eq!(fake.count(is_list("a")), lists + 1, "one relist");
}

#[tokio::test]
async fn a_hung_server_is_unreachable_within_a_few_probes() {
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(client, config(&["a"]));
    wait_state(&api, ApiState::Synced).await;

    // SIGSTOP: connections are accepted, nothing is answered.
    fake.set_readyz(Reply::Hang);
    fake.set_list("pods", "a", Reply::Hang);
    let hung_at = Instant::now();
    wait_state(&api, ApiState::Unreachable).await;
    let detected = hung_at.elapsed();
    // Two probe timeouts (100 ms) plus at most one interval (20 ms), with slack for a
    // busy machine.
    assert!(detected < Duration::from_secs(2), "took {detected:?}");
    assert!(fake.parked() >= 2, "the probes hung rather than failed");
    let error = api.snapshot().last_error.expect("error");
    assert!(error.contains("no answer within"), "{error}");

    // SIGCONT.
    fake.set_readyz(Reply::Normal);
    fake.set_list("pods", "a", Reply::Normal);
    fake.drop_parked();
    wait_state(&api, ApiState::Synced).await;
}

#[tokio::test]
async fn the_probe_is_rare_while_nothing_is_at_stake_and_prompt_when_something_is() {
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(
        client,
        ApiWatchConfig {
            idle_probe_interval: Duration::from_secs(60),
            ..config(&["a"])
        },
    );
    wait_state(&api, ApiState::Synced).await;
    fake.wait_requests(3, "probes at the fast pace at first", is_probe)
        .await;

    api.set_at_stake(false);
    // A probe already under way may still arrive.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let idle = fake.count(is_probe);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fake.count(is_probe),
        idle,
        "no probe within the idle pace (60 s); the fast pace (20 ms) would have sent ~25"
    );

    // A parent stops running here: the probe comes at once, not 60 s after the last.
    api.set_at_stake(true);
    fake.wait_requests(idle + 3, "probes at the fast pace again", is_probe)
        .await;
}

#[tokio::test]
async fn an_idle_probe_that_fails_is_confirmed_at_once_then_quiet_until_something_is_at_stake() {
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(
        client,
        ApiWatchConfig {
            idle_probe_interval: Duration::from_millis(2_000),
            ..config(&["a"])
        },
    );
    wait_state(&api, ApiState::Synced).await;
    api.set_at_stake(false);
    fake.set_readyz(Reply::Status(503));
    // Confirmed at the fast pace (20 ms), not two idle paces later.
    let failed = Instant::now();
    wait_state(&api, ApiState::Unreachable).await;
    assert!(
        failed.elapsed() < Duration::from_secs(4),
        "{:?}",
        failed.elapsed()
    );
    // Nothing at stake: the quiet pace, not the fast one, which would send a dozen probes
    // in this window. At most two: the one at the fast pace right after the threshold,
    // and the first quiet retry if its draw (20 ms–10 s) falls in the window; the next is
    // 5–10 s later.
    let probes = fake.count(is_probe);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let more = fake.count(is_probe) - probes;
    assert!(
        more <= 2,
        "{more} probes in 1 s while unreachable with nothing at stake"
    );
    // A parent stops running here: the node now waits for the API, and probes at once
    // and at the fast pace (20 ms doubling to 1 s).
    api.set_at_stake(true);
    fake.wait_requests(fake.count(is_probe) + 3, "probes at the fast pace", is_probe)
        .await;
    fake.set_readyz(Reply::Normal);
    wait_state(&api, ApiState::Synced).await;
}

#[tokio::test]
async fn a_failed_watch_has_the_probe_confirm_an_outage_at_once() {
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(
        client,
        ApiWatchConfig {
            idle_probe_interval: Duration::from_secs(60),
            ..config(&["a"])
        },
    );
    wait_state(&api, ApiState::Synced).await;
    api.set_at_stake(false);
    // A probe already under way may still arrive.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The server is killed: its connections break, the watch fails.
    let killed = Instant::now();
    fake.set_outage(Reply::Refuse);
    wait_state(&api, ApiState::Unreachable).await;
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "seen after {:?}: the idle pace (60 s) would have taken up to a minute",
        killed.elapsed()
    );
    fake.end_outage();
    api.set_at_stake(true);
    wait_state(&api, ApiState::Synced).await;
}

#[tokio::test]
async fn any_http_answer_below_500_counts_as_reachable() {
    let (client, fake, _server) = FakeApi::start();
    fake.set_readyz(Reply::Status(403));
    let api = ApiWatch::spawn(client, config(&["a"]));
    wait_state(&api, ApiState::Synced).await;
    fake.wait_requests(6, "several probes", is_probe).await;
    assert_eq!(api.snapshot().outages, 0);
    assert_eq!(api.state(), ApiState::Synced);
}

/// A restarted kube-apiserver answers 403 to every request while its authorizer loads
/// (1.2–4.3 s in `cargo xtask bench --fleet`, whose agents listed three times): after an
/// outage the watches wait for a 200 on `/readyz` and list once; the same non-200 answer
/// for `not_ready_grace` (an identity that may not read `/readyz`) ends the wait too.
#[tokio::test]
async fn after_an_outage_the_watches_wait_for_a_200_or_a_persisting_answer() {
    let grace = Duration::from_millis(600);
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(
        client,
        ApiWatchConfig {
            not_ready_grace: grace,
            ..config(&["a"])
        },
    );
    wait_state(&api, ApiState::Synced).await;

    // Killed, then back but refusing everything while it starts: not ready, no list.
    fake.set_outage(Reply::Refuse);
    wait_state(&api, ApiState::Unreachable).await;
    let lists = fake.count(is_list("a"));
    fake.set_outage(Reply::Status(403));
    let probes = fake.count(is_probe);
    fake.wait_requests(probes + 2, "probes answered 403", is_probe)
        .await;
    let snap = api.snapshot();
    assert_eq!(snap.state, ApiState::Unreachable, "a 403 alone after an outage");
    assert!(
        snap.last_error.as_deref().is_some_and(|e| e.contains("403")),
        "{:?}",
        snap.last_error
    );
    // Ready: one list.
    fake.end_outage();
    wait_state(&api, ApiState::Synced).await;
    assert_eq!(fake.count(is_list("a")), lists + 1, "one list after the outage");
    assert_eq!(api.snapshot().outages, 1);

    // An identity that may not read /readyz: reachable once the 403 persisted.
    fake.set_outage(Reply::Refuse);
    wait_state(&api, ApiState::Unreachable).await;
    let lists = fake.count(is_list("a"));
    fake.set_readyz(Reply::Status(403));
    let back = Instant::now();
    fake.end_outage();
    wait_state(&api, ApiState::Synced).await;
    assert!(
        back.elapsed() >= grace,
        "synced {:?} after the return",
        back.elapsed()
    );
    assert_eq!(fake.count(is_list("a")), lists + 1, "one list after the outage");
    assert_eq!(api.snapshot().outages, 2);
}

#[tokio::test]
async fn a_401_is_unauthorized_never_synced_and_never_an_outage() {
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(client, config(&["a"]));
    wait_state(&api, ApiState::Synced).await;
    // The token expired or was revoked: even the open watch no longer counts.
    fake.set_readyz(Reply::Status(401));
    wait_state(&api, ApiState::Unauthorized).await;
    fake.wait_requests(6, "several probes", is_probe).await;
    let snap = api.snapshot();
    assert_eq!(snap.state, ApiState::Unauthorized);
    assert_eq!(snap.outages, 0, "a server that answers is not down");
    assert!(
        snap.last_error.as_deref().is_some_and(|e| e.contains("401")),
        "{:?}",
        snap.last_error
    );
    // Fresh credentials (a refreshed token file): synced again.
    fake.set_readyz(Reply::Normal);
    wait_state(&api, ApiState::Synced).await;
    assert_eq!(api.snapshot().last_error, None);
}

/// A 403 on the pod list and watch of every namespace leaves the agent as blind as a
/// rejected token (the agent hands its lock over on [`ApiState::Unauthorized`]); a 403 in
/// some namespaces only is an RBAC gap the other copy shares (reachable, not synced).
/// Either ends once the lists succeed.
#[tokio::test]
async fn a_403_on_the_pod_reads_of_every_namespace_is_unauthorized() {
    async fn check(forbidden: &[&str], expected: ApiState) {
        let (client, fake, _server) = FakeApi::start();
        for ns in forbidden {
            fake.set_list("pods", ns, Reply::Status(403));
            fake.set_watch("pods", ns, Reply::Status(403));
        }
        let api = ApiWatch::spawn(client, config(&["a", "b"]));
        wait_until(5, "every watch listed or refused", api.subscribe(), || {
            let snap = api.snapshot();
            (snap.namespaces.iter()).all(|(ns, w)| match forbidden.contains(&ns.as_str()) {
                true => w.error.is_some(),
                false => w.synced,
            })
        })
        .await;
        assert_eq!(api.state(), expected, "forbidden in {forbidden:?}");
        fake.wait_requests(6, "several probes", is_probe).await;
        assert_eq!(api.state(), expected, "forbidden in {forbidden:?}, later");
        for ns in forbidden {
            fake.set_list("pods", ns, Reply::Normal);
            fake.set_watch("pods", ns, Reply::Normal);
        }
        wait_state(&api, ApiState::Synced).await;
    }
    check(&["a", "b"], ApiState::Unauthorized).await;
    check(&["a"], ApiState::Reachable).await;
    check(&["b"], ApiState::Reachable).await;
}

/// Without credentials only `/readyz` is asked: an answer (a 401 to an anonymous request
/// too) is reachable, never synced nor unauthorized; no answer is unreachable.
#[tokio::test]
async fn an_anonymous_probe_tells_reachable_from_unreachable_and_reads_no_pods() {
    async fn check(readyz: Reply, expected: ApiState) {
        let (client, fake, _server) = FakeApi::start();
        fake.set_readyz(readyz.clone());
        let api = ApiWatch::spawn_anonymous(client, config(&["a"]));
        fake.wait_requests(6, "several probes", is_probe).await;
        assert_eq!(api.state(), expected, "/readyz answering {readyz:?}");
        assert_eq!(fake.count(|s| !is_probe(s)), 0, "only /readyz is asked");
        assert!(api.snapshot().namespaces.is_empty());
    }
    check(Reply::Normal, ApiState::Reachable).await;
    check(Reply::Status(401), ApiState::Reachable).await;
    check(Reply::Status(403), ApiState::Reachable).await;
    check(Reply::Status(503), ApiState::Unreachable).await;
    check(Reply::Refuse, ApiState::Unreachable).await;
}

#[tokio::test]
async fn dropping_stops_every_task() {
    let (client, fake, _server) = FakeApi::start();
    let api = ApiWatch::spawn(client, config(&["a"]));
    wait_state(&api, ApiState::Synced).await;
    api.shutdown();
    // Let in-flight work settle, then no further requests may come.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = fake.log().len();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fake.log().len(), before, "no probe after shutdown");
}

/// The probe's clock: the runtime's thread is held up for 300 ms (three timeouts of
/// 100 ms) by another task, as a blocking disk call would hold it, so the request can only
/// go out afterwards, and then the answer takes 10 ms. Counted in runnable time, that is
/// an answer within the timeout; a server that really takes 300 ms is still too slow.
#[tokio::test]
async fn a_stalled_runtime_does_not_count_against_the_timeout() {
    let timeout = Duration::from_millis(100);
    let (sent, answer) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let _ = sent.send("ok");
    });
    assert_eq!(within_runnable_time(timeout, answer).await, Some(Ok("ok")));

    let slow = tokio::time::sleep(Duration::from_millis(300));
    assert_eq!(within_runnable_time(timeout, slow).await, None);
}

#[test]
fn the_probe_slows_down_while_the_api_stays_unreachable() {
    let config = ApiWatchConfig::new("node-1", NamespaceAllowList::new(["kube-system"]));
    let check = |fast: bool, at_stake: bool, failures: u32, expected_ms: u64| {
        assert_eq!(
            probe_pace(&config, fast, at_stake, failures),
            Duration::from_millis(expected_ms),
            "fast {fast}, at stake {at_stake}, {failures} failures"
        );
    };
    // (at stake or failing, at stake, consecutive failed probes, next probe after)
    let cases = [
        (false, false, 0, 15_000),
        (true, true, 0, 250),
        (true, false, 1, 250),
        (true, true, 1, 250),
        // Unreachable from the second: the same pace, then, with something at stake,
        // doubling to a second.
        (true, true, 2, 250),
        (true, true, 3, 500),
        (true, true, 4, 1_000),
        (true, true, 5, 1_000),
        (true, true, 60, 1_000),
        (true, true, u32::MAX, 1_000),
        // With nothing at stake, the quiet pace from the first retry on.
        (true, false, 2, 250),
        (true, false, 3, 10_000),
        (true, false, 60, 10_000),
        (true, false, u32::MAX, 10_000),
    ];
    for (fast, at_stake, failures, expected_ms) in cases {
        check(fast, at_stake, failures, expected_ms);
    }
}

#[test]
fn a_probe_that_confirms_an_unanswered_one_waits_half_as_long() {
    let config = ApiWatchConfig::new("node-1", NamespaceAllowList::new(["kube-system"]));
    let check = |unanswered: bool, failures: u32, expected_ms: u64| {
        assert_eq!(
            confirming_timeout(&config, unanswered, failures),
            Duration::from_millis(expected_ms),
            "unanswered {unanswered}, {failures} failures"
        );
    };
    // (a probe got no answer since the last answer, consecutive failed probes, timeout)
    let cases = [
        (false, 0, 750),
        // The first timeout: confirmed with half of it.
        (true, 1, 375),
        // The failure was an answer (a refusal, a 5xx): nothing hangs, the whole timeout.
        (false, 1, 750),
        // Unreachable: the whole timeout, so a slow return is seen.
        (true, 2, 750),
        (true, 60, 750),
    ];
    for (unanswered, failures, expected_ms) in cases {
        check(unanswered, failures, expected_ms);
    }
}

#[test]
fn a_quiet_fleet_spreads_its_first_retry_over_the_whole_interval() {
    let config = ApiWatchConfig::new("node-1", NamespaceAllowList::new(["kube-system"]));
    let quiet = QUIET_UNREACHABLE_PROBE_INTERVAL;
    let waits: Vec<Duration> = (0..256)
        .map(|_| unreachable_wait(&config, false, 3, quiet))
        .collect();
    assert!(
        waits.iter().all(|w| *w >= config.probe_interval && *w <= quiet),
        "{waits:?}"
    );
    // Some in the lower half: equal jitter would have none there.
    assert!(waits.iter().any(|w| *w < quiet / 2), "{waits:?}");
    // Later retries, and retries with something at stake, keep half of their pace.
    for (at_stake, failures, pace) in [(false, 4, quiet), (true, 3, Duration::from_secs(1))] {
        let wait = unreachable_wait(&config, at_stake, failures, pace);
        assert!(
            wait >= pace / 2 && wait <= pace,
            "{at_stake} {failures}: {wait:?}"
        );
    }
}
