//! Fuzzes the error-queue decoder with arbitrary control buffers: it must never panic, never read
//! past the slice, and every completion it returns must have come from a recognised level.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerotx::internals::cmsg::{self, ErrQueueMsg};

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    let _ = cmsg::decode(data, &mut out);
    for msg in cmsg::messages(data).flatten() {
        let (level, ty, payload) = msg;
        assert!(payload.len() <= data.len());
        if let Ok(ErrQueueMsg::Zerocopy(r)) = cmsg::classify(level, ty, payload) {
            assert!(cmsg::is_recverr(level, ty));
            assert!(r.count() >= 1 && r.count() <= 1 << 32);
        }
    }
});
