//! Any bytes as the lock file's content (another tool's lock, garbage, a record with text
//! appended): `LockHolder::parse` never panics, and a record it reads, written back, reads
//! with the same pid and time, and is then written as it was read. CI's bounded run is the
//! property test in `crates/ckpt-lock/src/holder.rs`.
#![no_main]

use ckpt_lock::LockHolder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(content) = std::str::from_utf8(data) else {
        return;
    };
    let Some(holder) = LockHolder::parse(content) else {
        return;
    };
    let read = LockHolder::parse(&holder.to_file_content()).expect("a written record reads back");
    assert_eq!((read.pid, read.acquired_at), (holder.pid, holder.acquired_at));
    assert_eq!(LockHolder::parse(&read.to_file_content()).as_ref(), Some(&read));
});
