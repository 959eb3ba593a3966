//! Test fixtures: a fake API server (tower-test), a fake CRI runtime, a fake kubelet.
