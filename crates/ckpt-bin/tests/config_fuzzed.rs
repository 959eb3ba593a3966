//! The `--config` file as outside input (issue 18's fuzzing, the bounded part CI runs):
//! whatever YAML an operator's ConfigMap holds, `check_config_file` (what `run` reads, and
//! `check-config` runs) answers, never panics, and ends in bounded time, alias bombs
//! included; a refusal names the setting (`--namespaces: …`) or the file (`--config: …`).

#[path = "support/config_check.rs"]
mod config_check;

use ckpt_bin::config::check_config_file;
use config_check::check_config as check;
use proptest::prelude::*;

/// Every key the file may hold, and a few it may not.
const KEYS: [&str; 14] = [
    "gc-strategy",
    "checkpoint-grace-period",
    "namespaces",
    "runtime-endpoint",
    "metrics-addr",
    "log-level",
    "log-format",
    "node-name",
    "pod-name",
    "gc",
    "unauthorized-handover",
    "checkpoint-dir",
    "unknown-key",
    "",
];

fn arb_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop::sample::select(vec![
            "grace-period",
            "owner-reference",
            "immediate",
            "keep-forever",
            "5m",
            "0",
            "-1s",
            "99999999999999999999h",
            "[kube-system]",
            "~",
            "null",
            "true",
            "\"\"",
            "'x'",
            "{}",
            "[]",
            "&a x",
            "*a",
            "!!binary aGk=",
            "!tag x",
            "0x1F",
            "1e999",
            ".inf",
        ])
        .prop_map(str::to_owned),
        "[ -~]{0,12}",
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec((prop::sample::select(KEYS.to_vec()), inner), 0..3).prop_map(|kv| {
                let body: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k}: {v}")).collect();
                format!("{{{}}}", body.join(", "))
            }),
        ]
    })
}

fn arb_file() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec((prop::sample::select(KEYS.to_vec()), arb_value()), 0..6)
            .prop_map(|lines| lines.into_iter().map(|(k, v)| format!("{k}: {v}\n")).collect()),
        1 => "\\PC{0,80}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn any_file_is_answered(text in arb_file()) {
        check(&text);
    }
}

#[test]
fn alias_bombs_are_answered_in_bounded_time() {
    // "Billion laughs": nine levels of nine aliases, 9^9 strings once expanded.
    let mut bomb = String::from(
        "a0: &a0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n",
    );
    for level in 1..9 {
        let refs = vec![format!("*a{}", level - 1); 9].join(", ");
        bomb.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
    }
    bomb.push_str("namespaces: *a8\n");
    check(&bomb);
    check(&format!("gc-strategy: grace-period\n{bomb}"));
}

#[test]
fn a_valid_file_is_accepted() {
    check_config_file(
        "gc-strategy: owner-reference\ncheckpoint-grace-period: 5m\nnamespaces: [kube-system]\n",
    )
    .expect("accepted");
}
