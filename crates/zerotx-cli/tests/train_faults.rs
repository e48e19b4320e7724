//! Issue 37's fault classes for trains (UDP GSO), run once on this host through every engine by
//! the example that `scripts/vm-test.sh` also runs in the Debian guests
//! (`examples/train_faults.rs`): a regression shows here without a VM.

mod common;

#[allow(dead_code)] // the example's own modes (`--to`, `--receive`) are not run here
#[path = "../examples/train_faults.rs"]
mod train_faults;

use common::{have, is_root, require};

/// A veth receiver checking every datagram, an nftables drop, a `tbf` qdisc drop with
/// `IP_RECVERR`, a segment above the MTU and too many segments, UDP-Lite's `EIO`, and a local
/// destination: each through `copy`, `msg-zc`, `auto`, and the io_uring engines once they take
/// trains. Every buffer is overwritten the instant it comes back.
#[test]
fn every_train_fault_class_through_every_engine() {
    if !require(is_root(), "network namespaces need root")
        || !require(
            have("nft"),
            "the drop class needs nft (apt-get install nftables)",
        )
        || !require(have("tc"), "the qdisc class needs tc (iproute2)")
    {
        return;
    }
    let failed = train_faults::run_all();
    assert_eq!(
        failed, 0,
        "{failed} checks failed: the `VMTEST: FAIL` lines above say which"
    );
}
