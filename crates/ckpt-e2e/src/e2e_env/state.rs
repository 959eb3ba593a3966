//! The `KEY=VALUE` state files a plane and its node keep in the work dir (what `start`
//! prints), by which another process attaches to them.

use std::collections::BTreeMap;

/// `KEY=VALUE` lines into a map; other lines are ignored.
pub(crate) fn parse_state(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_lines_parse_into_a_map() {
        let state = parse_state("WORKDIR=/tmp/x\nSTATIC_POD_DIR=\nnoise\nAPISERVER_URL=https://a=b\n");
        assert_eq!(state["WORKDIR"], "/tmp/x");
        assert_eq!(state["STATIC_POD_DIR"], "");
        assert_eq!(state["APISERVER_URL"], "https://a=b");
        assert_eq!(state.len(), 3);
    }
}
