//! `probe()` on the running host (it opens real sockets and an io_uring, and sends over
//! loopback) and the advice it derives from what it found.

use zerotx::internals::probe::advise;
use zerotx::probe;

/// Huge pages off (`never`) is worth a word of advice (a `BufPool::huge` pool gets small pages);
/// `madvise` and no transparent huge pages at all are not.
#[test]
fn huge_pages_off_is_advice_and_on_is_not() {
    let mut r = probe();
    for (mode, said) in [
        (Some("never"), true),
        (Some("madvise"), false),
        (None, false),
    ] {
        r.huge_pages = mode.map(String::from);
        let advice = advise(&r);
        assert_eq!(
            advice.iter().any(|a| a.contains("BufPool::huge")),
            said,
            "{mode:?}: {advice:?}"
        );
    }
}
