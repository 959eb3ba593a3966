//! The custom agent binary of `examples/pod-checkpointer-custom.rs`, run as an operator
//! would: it lists `keep-forever`, accepts a config and renders manifests that use it (the
//! stock `pod-checkpointer` refuses both: ckpt-bin's `tests/cli.rs`). `cargo test` builds
//! the example before the tests run (a `--test custom_binary` alone does not: build the
//! example first).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// `target/<profile>/examples/pod-checkpointer-custom`, beside this test's `deps/` dir.
fn custom_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = profile_dir.join("examples").join("pod-checkpointer-custom");
    assert!(
        path.is_file(),
        "{} is missing: `cargo test -p ckpt-gc-example` builds it, or `cargo build -p ckpt-gc-example --example pod-checkpointer-custom`",
        path.display()
    );
    path
}

fn run(binary: &PathBuf, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(binary)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const CONFIG: &str = "gc-strategy: keep-forever\ngc:\n  keep-forever:\n    except-self: true\n";

#[test]
fn the_custom_binary_lists_checks_and_renders_its_strategy() {
    let custom = custom_binary();
    let listed = run(&custom, &["strategies"], "");
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let names: Vec<String> = text(&listed.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    for name in ["grace-period", "immediate", "owner-reference", "keep-forever"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }

    let checked = run(&custom, &["check-config", "-"], CONFIG);
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    // Its settings are checked by the strategy itself: a typo is a usage error (exit 2).
    let typo = run(
        &custom,
        &["check-config", "-"],
        &CONFIG.replace("except-self", "except-slef"),
    );
    assert_eq!(typo.status.code(), Some(2), "{}", text(&typo.stderr));

    let rendered = run(&custom, &["render", "--gc-strategy", "keep-forever"], "");
    assert!(rendered.status.success(), "{}", text(&rendered.stderr));
    assert!(text(&rendered.stdout).contains("gc-strategy: \"keep-forever\""));
}
