//! The name of an Event: the pod's name and the time it happened, as kube's recorder makes
//! it, kept within the 253 characters of an object name.

use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

/// The longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Hex digits of the pod name's hash in a shortened name.
const HASH_DIGITS: usize = 8;

/// `<pod>.<nanoseconds in hex>`; for a pod whose name would take it past [`MAX_NAME`] (a pod
/// name may be 253 characters itself), `<prefix>-<hash of the name>.<nanoseconds>`: the
/// API server refused the long one, and the Event was dropped. The prefix ends as a name
/// must (not in `-` or `.`), and the hash keeps pods that share it apart.
pub(super) fn event_name(pod: &str, at: Timestamp) -> String {
    let suffix = format!(".{:x}", at.as_nanosecond());
    if pod.len() + suffix.len() <= MAX_NAME {
        return format!("{pod}{suffix}");
    }
    let hash: String = Sha256::digest(pod.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..HASH_DIGITS]
        .to_owned();
    // Pod names are ASCII (a DNS subdomain): any byte is a character boundary.
    let room = MAX_NAME - suffix.len() - 1 - HASH_DIGITS;
    let prefix = pod
        .get(..room.min(pod.len()))
        .unwrap_or_default()
        .trim_end_matches(['-', '.']);
    if prefix.is_empty() {
        format!("{hash}{suffix}")
    } else {
        format!("{prefix}-{hash}{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DNS subdomain as the API server checks an object name.
    fn is_valid_name(name: &str) -> bool {
        name.len() <= MAX_NAME
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    fn check(input: (&str, i128), expected: &str) {
        let at = Timestamp::from_nanosecond(input.1).unwrap();
        let name = event_name(input.0, at);
        assert_eq!(name, expected, "{} characters", input.0.len());
        assert!(is_valid_name(&name), "{name}");
    }

    #[test]
    fn event_names_stay_within_an_object_names_bounds() {
        let at: i128 = 0x18b3_c4d5_e6f7_0011; // 16 hex digits
        let long = |len: usize, fill: &str| fill.repeat(len / fill.len() + 1)[..len].to_owned();
        let a236 = long(236, "a");
        let a253 = long(253, "a");
        let dashes = format!("{}-{}", long(226, "a"), long(30, "b"));
        let cases: Vec<((&str, i128), String)> = vec![
            (
                ("kube-apiserver-node-1", at),
                "kube-apiserver-node-1.18b3c4d5e6f70011".into(),
            ),
            // 236 + 17 = 253: as it is.
            ((&a236, at), format!("{a236}.18b3c4d5e6f70011")),
            // A pod name of 253 characters (the most the API allows).
            (
                (&a253, at),
                format!("{}-{}.18b3c4d5e6f70011", long(227, "a"), "32859a3a"),
            ),
            // The cut falls on a dash: trimmed.
            (
                (&dashes, at),
                format!("{}-{}.18b3c4d5e6f70011", long(226, "a"), "93c2cfa0"),
            ),
        ];
        for (input, expected) in cases {
            check(input, &expected);
        }
    }

    #[test]
    fn long_names_that_share_a_prefix_stay_apart() {
        let at = Timestamp::from_second(1).unwrap();
        let a = format!("{}a", "x".repeat(252));
        let b = format!("{}b", "x".repeat(252));
        assert_ne!(event_name(&a, at), event_name(&b, at));
    }
}
