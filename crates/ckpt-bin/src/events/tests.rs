use std::time::Duration;

use ckpt_testkit::{FakeApi, Reply};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use super::*;

use EventKind::{Activated, Deactivated, Removed};

const NS: &str = "kube-system";

#[derive(Clone, Debug)]
enum Step {
    /// The agent's pass says how the API server is.
    Api(ApiState),
    /// An Event about a pod, happened at a minute since the start (the sink is told the
    /// API server's state as last set).
    Publish(&'static str, EventKind, i64),
    /// How the fake answers Event writes from now on.
    Writes(Reply),
    /// How the fake answers the next Event write only.
    NextWrite(Reply),
    /// Waits until the fake has seen this many Event writes.
    Seen(usize),
}

use Step::{Api, NextWrite, Publish, Seen, Writes};

const UNREACHABLE: Step = Api(ApiState::Unreachable);
const REACHABLE: Step = Api(ApiState::Reachable);
const SYNCED: Step = Api(ApiState::Synced);

/// Runs the steps against a fake API server, then makes the view synced and
/// compares every Event write the fake saw (failed ones too) with `expected`:
/// `POST <pod> <reason> +<minutes>m[ late]` or `PATCH <pod> count <n> +<minutes>m`.
async fn check(steps: &[Step], expected: &[String]) {
    let (client, api, _task) = FakeApi::start();
    let sink = EventSink::new(client, "node-1");
    // Whole seconds: eventTime keeps microseconds only.
    let start = Timestamp::from_second(Timestamp::now().as_second()).expect("a valid time");
    let mut state = ApiState::Unreachable;
    sink.api_state(state);
    for step in steps {
        match step {
            Api(s) => {
                state = *s;
                sink.api_state(*s);
            }
            Publish(pod, kind, minute) => {
                let at = start + SignedDuration::from_mins(*minute);
                let id = PodId::new(NS, *pod);
                let uid = format!("uid-{pod}");
                sink.publish_at(state, &id, Some(&uid), *kind, "note".into(), at);
            }
            Writes(reply) => api.set_event_writes(reply.clone()),
            NextWrite(reply) => api.script_event_writes([reply.clone()]),
            Seen(n) => {
                let what = format!("{n} Event writes");
                api.wait_requests(*n, &what, |s| s.path.starts_with("/apis/events.k8s.io/"))
                    .await;
            }
        }
        // Let the publishing task run (current-thread runtime).
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sink.api_state(ApiState::Synced);
    let writes = || writes(&api, start);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while writes().len() < expected.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Anything more would come at once.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(writes(), expected, "steps {steps:?}");
}

/// The Event writes the fake saw, summarized.
fn writes(api: &FakeApi, start: Timestamp) -> Vec<String> {
    let minutes = |t: &Value| {
        let t: Timestamp = t
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a time: {t}"));
        let since = t.duration_since(start);
        assert_eq!(since.as_secs() % 60, 0, "{t} is a whole minute after {start}");
        format!("+{}m", since.as_secs() / 60)
    };
    api.log()
        .iter()
        .filter(|s| s.path.starts_with("/apis/events.k8s.io/"))
        .map(|s| {
            let body = s.json();
            match s.method.as_str() {
                "POST" => {
                    let name = body["metadata"]["name"].as_str().unwrap_or("");
                    let pod = body["regarding"]["name"].as_str().unwrap_or("");
                    assert!(name.starts_with(&format!("{pod}.")), "Event name {name}");
                    assert_eq!(body["metadata"]["namespace"], NS);
                    assert_eq!(body["regarding"]["uid"], format!("uid-{pod}"));
                    assert_eq!(body["reportingController"], "pod-checkpointer");
                    assert_eq!(body["reportingInstance"], "node-1");
                    let note = body["note"].as_str().unwrap_or("");
                    let late = if note.contains("while the API server was unreachable") {
                        " late"
                    } else {
                        ""
                    };
                    let reason = body["reason"].as_str().unwrap_or("");
                    format!("POST {pod} {reason} {}{late}", minutes(&body["eventTime"]))
                }
                method => {
                    let name = s.path.rsplit('/').next().unwrap_or("");
                    let pod = name.split('.').next().unwrap_or("");
                    let series = &body["series"];
                    format!(
                        "{method} {pod} count {} {}",
                        series["count"],
                        minutes(&series["lastObservedTime"])
                    )
                }
            }
        })
        .collect()
}

fn lines(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| (*l).to_owned()).collect()
}

#[tokio::test]
async fn published_at_once_while_reachable() {
    check(
        &[SYNCED, Publish("a", Deactivated, 0), Publish("b", Removed, 1)],
        &lines(&["POST a CheckpointDeactivated +0m", "POST b CheckpointRemoved +1m"]),
    )
    .await;
}

#[tokio::test]
async fn queued_while_unreachable_then_published_in_order_with_their_time() {
    check(
        &[
            UNREACHABLE,
            Publish("a", Activated, 0),
            Publish("b", Activated, 2),
            // The API server is back; the next transition comes after the queued ones.
            SYNCED,
            Publish("a", Deactivated, 5),
        ],
        &lines(&[
            "POST a CheckpointActivated +0m late",
            "POST b CheckpointActivated +2m late",
            "POST a CheckpointDeactivated +5m",
        ]),
    )
    .await;
}

#[tokio::test]
async fn nothing_is_sent_while_unreachable() {
    let (client, api, _task) = FakeApi::start();
    let sink = EventSink::new(client, "node-1");
    sink.api_state(ApiState::Unreachable);
    sink.publish(
        ApiState::Unreachable,
        &PodId::new(NS, "a"),
        None,
        Activated,
        "note".into(),
    );
    sink.api_state(ApiState::Unreachable);
    // Answering is not enough: a restarted API server refuses everything until its
    // authorizer has loaded RBAC; the view is synced once it lists pods for the agent.
    sink.api_state(ApiState::Reachable);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(api.log().is_empty(), "{:?}", api.log());
}

#[tokio::test]
async fn the_bound_keeps_the_first_events_and_drops_later_ones() {
    let mut steps = vec![UNREACHABLE];
    let mut expected = Vec::new();
    let pods: Vec<&'static str> = (0..QUEUE_BOUND + 10)
        .map(|i| &*Box::leak(format!("p{i:04}").into_boxed_str()))
        .collect();
    for (i, pod) in pods.iter().enumerate() {
        steps.push(Publish(pod, Activated, 0));
        if i < QUEUE_BOUND {
            expected.push(format!("POST {pod} CheckpointActivated +0m late"));
        }
    }
    // Once published, the queue takes Events again.
    steps.extend([SYNCED, Seen(QUEUE_BOUND), Publish("after", Deactivated, 1)]);
    expected.push("POST after CheckpointDeactivated +1m".into());
    check(&steps, &expected).await;
}

#[tokio::test]
async fn repeats_within_the_window_patch_the_series() {
    check(
        &[
            SYNCED,
            Publish("a", Activated, 0),
            Seen(1),
            Publish("a", Activated, 1),
            Seen(2),
            Publish("a", Activated, 3),
            Seen(3),
            // Six minutes after the last one: a new Event.
            Publish("a", Activated, 9),
            Seen(4),
            // Another kind is another Event.
            Publish("a", Deactivated, 9),
        ],
        &lines(&[
            "POST a CheckpointActivated +0m",
            "PATCH a count 2 +1m",
            "PATCH a count 3 +3m",
            "POST a CheckpointActivated +9m",
            "POST a CheckpointDeactivated +9m",
        ]),
    )
    .await;
}

#[tokio::test]
async fn a_repeat_whose_event_expired_creates_a_new_one() {
    check(
        &[
            SYNCED,
            Publish("a", Activated, 0),
            Seen(1),
            Writes(Reply::Status(404)),
            Publish("a", Activated, 1),
        ],
        // The patch's 404 makes it create a new one (answered 404 too: a refusal,
        // dropped, not retried).
        &lines(&[
            "POST a CheckpointActivated +0m",
            "PATCH a count 2 +1m",
            "POST a CheckpointActivated +1m",
        ]),
    )
    .await;
}

#[tokio::test]
async fn a_failure_that_may_pass_is_tried_again_after_a_backoff() {
    // 401/403: a restarted API server refuses everything until its authorizer has loaded
    // RBAC (seen on the real one); refreshed credentials clear a 401.
    for reply in [
        Reply::Status(503),
        Reply::Status(429),
        Reply::Status(403),
        Reply::Status(401),
        Reply::Refuse,
    ] {
        check(
            &[
                SYNCED,
                NextWrite(reply),
                // No pass needed: the publisher tries again by itself.
                Publish("a", Activated, 0),
            ],
            &lines(&["POST a CheckpointActivated +0m", "POST a CheckpointActivated +0m"]),
        )
        .await;
    }
}

#[tokio::test]
async fn queued_events_wait_for_a_synced_view_not_just_an_answer() {
    check(
        &[
            UNREACHABLE,
            Publish("a", Activated, 0),
            // The API server answers `/readyz` but has not listed pods for the agent yet.
            REACHABLE,
            Publish("a", Deactivated, 1),
            // (`check` makes the view synced at the end.)
        ],
        &lines(&[
            "POST a CheckpointActivated +0m late",
            "POST a CheckpointDeactivated +1m",
        ]),
    )
    .await;
}

#[tokio::test]
async fn a_refused_event_is_dropped() {
    for code in [400, 404, 422] {
        check(
            &[
                SYNCED,
                Writes(Reply::Status(code)),
                Publish("a", Activated, 0),
                Seen(1),
                Writes(Reply::Normal),
                Publish("b", Activated, 1),
            ],
            &lines(&["POST a CheckpointActivated +0m", "POST b CheckpointActivated +1m"]),
        )
        .await;
    }
}

#[tokio::test]
async fn a_failing_event_is_given_up_after_its_attempts() {
    let mut steps = vec![SYNCED, Writes(Reply::Status(503)), Publish("a", Activated, 0)];
    let mut expected = Vec::new();
    for attempt in 1..=ATTEMPTS as usize {
        steps.push(Seen(attempt));
        expected.push("POST a CheckpointActivated +0m".to_owned());
    }
    steps.extend([Writes(Reply::Normal), Publish("b", Removed, 1)]);
    expected.push("POST b CheckpointRemoved +1m".to_owned());
    check(&steps, &expected).await;
}
